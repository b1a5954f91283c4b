#!/usr/bin/env bash
# Cut-through abort: version 3 of two parts streams ahead through broker a
# (--cut-through) and relay r (--cut-through); part 1 dies inside it after
# its chunks went out.  Broker a drops 3 and tells every consumer that got
# any of it (ERROR DCAST_EABORTED naming 3): the relay drops its open 3
# and tells its own consumers, a raw consumer of each broker and a
# `deltacast subscribe` (the consumer library) of the relay drop what they
# staged and stay at 2, bit-exact.  Version 3 published again commits and
# reaches all of them.
. "$(dirname "$0")/tools/broker_lib.sh"

start_broker_metrics a --heartbeat-ms 500 --cut-through
start_broker_metrics r --heartbeat-ms 500 --cut-through --upstream "$a_CONS" --upstream-model ab
bg c1 "$WC" consume "$r_CONS" ab --until 5 --stats "$TMP/c1.stats"
C1=$LAST_PID
bg c2 "$WC" consume "$a_CONS" ab --until 5 --stats "$TMP/c2.stats"
C2=$LAST_PID
bg sub "$BUILD/deltacast" subscribe --broker "$r_CONS" --model ab --dir "$TMP/sub" --until 5
SUB=$LAST_PID
wait_consumers r 2
wait_consumers a 2 # c2 and the relay
bg p0 "$WC" produce "$a_PROD" ab --part 0 --parts 2 --versions 5
P0=$LAST_PID
bg p1 "$WC" produce "$a_PROD" ab --part 1 --parts 2 --versions 5 --pause-at 3
P1=$LAST_PID
wait_for 20 grep -qs "pausing inside version 3" "$TMP/p1.err" || fail "part 1 never reached version 3"
for c in c1 c2; do
	wait_for 10 grep -qs "open=3 open_chunks=[1-9]" "$TMP/$c.stats" ||
		fail "$c got no chunk of the open version 3: $(cat "$TMP/$c.stats")"
done
wait_for 10 grep -q "^version 2 " "$TMP/sub.out" || fail "subscribe did not apply version 2"
kill -9 "$P1"
wait "$P0"
rc=$?
[ $rc = 3 ] || fail "part 0 exited $rc, expected 3 (ERROR DCAST_EABORTED)"

# Every consumer hears of it, and stays at 2.
for c in c1 c2; do
	wait_for 10 grep -q "re-join at 2: model ab version 3 was aborted before its COMMIT" "$TMP/$c.err" ||
		fail "$c not told of the abort: $(cat "$TMP/$c.err")"
	[ "$(stat_of "$TMP/$c.stats" applied)" = 2 ] || fail "$c: $(cat "$TMP/$c.stats")"
done
wait_for 10 grep -q "version 3 aborted before its COMMIT" "$TMP/sub.err" ||
	fail "subscribe not told of the abort: $(tail -3 "$TMP/sub.err")"
grep -q "upstream aborted it" "$TMP/r.log" || fail "the relay kept its open version 3"
check_metric a deltacast_versions_aborted_total 1
check_metric a deltacast_cut_through_aborted_total 1
check_metric r deltacast_versions_aborted_total 1
check_metric r deltacast_cut_through_aborted_total 1
check_metric r 'deltacast_model_version{model="ab"}' 2
tail -1 "$TMP/sub.out" | grep -q "^version 2 " || fail "subscribe moved: $(tail -1 "$TMP/sub.out")"

# Published again, 3 commits and every consumer takes it, and 4, 5.
bg p0b "$WC" produce "$a_PROD" ab --part 0 --parts 2 --versions 5
P0=$LAST_PID
bg p1b "$WC" produce "$a_PROD" ab --part 1 --parts 2 --versions 5
P1=$LAST_PID
wait "$P0" || fail "part 0 again exited $?"
wait "$P1" || fail "part 1 again exited $?"
for c in c1 c2; do
	pid=$C1
	[ $c = c2 ] && pid=$C2
	wait "$pid" || fail "$c exited $?: $(tail -2 "$TMP/$c.err")"
	grep -q "applied=5 versions=5 anchors=1 .*bit-exact" "$TMP/$c.out" || fail "$c: $(cat "$TMP/$c.out")"
done
wait "$SUB" || fail "subscribe exited $?: $(tail -3 "$TMP/sub.err")"
grep -q "^version 5 " "$TMP/sub.out" || fail "subscribe: $(tail -2 "$TMP/sub.out")"
grep -q "^version 3 " "$TMP/sub.out" || fail "subscribe skipped version 3: $(cat "$TMP/sub.out")"
stop_broker r
stop_broker a
echo "test_broker_cut_through_abort: ok"
