#!/usr/bin/env bash
# Broker: a producer part killed in the middle of version 3 leaves no
# trace: the other part gets ERROR DCAST_EABORTED, consumers never see any
# chunk of the partial version (their COMMIT chunk counts would not match),
# and version 3 published again commits fine.
. "$(dirname "$0")/tools/broker_lib.sh"

start_broker_metrics b --heartbeat-ms 200 --part-timeout-ms 2000
bg c1 "$WC" consume "$b_CONS" m7 --until 6 --stats "$TMP/c1.stats"
C1=$LAST_PID
bg p0 "$WC" produce "$b_PROD" m7 --part 0 --parts 2 --versions 6
P0=$LAST_PID
bg p1 "$WC" produce "$b_PROD" m7 --part 1 --parts 2 --versions 6 --pause-at 3
P1=$LAST_PID
wait_for 20 grep -qs "pausing inside version 3" "$TMP/p1.err" || fail "part 1 never reached version 3"
kill -9 "$P1"
wait "$P0"
rc=$?
[ $rc = 3 ] || fail "part 0 exited $rc, expected 3 (ERROR DCAST_EABORTED)"
grep -q "DCAST_EABORTED" "$TMP/p0.err" || fail "part 0 got no EABORTED"
# the broker dropped version 3: one version aborted, 2 the newest committed
check_metric b deltacast_versions_aborted_total 1
check_metric b 'deltacast_model_version{model="m7"}' 2
[ "$(stat_of "$TMP/c1.stats" applied)" = 2 ] || fail "consumer: $(cat "$TMP/c1.stats")"
bg p0b "$WC" produce "$b_PROD" m7 --part 0 --parts 2 --versions 6
P0=$LAST_PID
bg p1b "$WC" produce "$b_PROD" m7 --part 1 --parts 2 --versions 6
P1=$LAST_PID
wait "$P0" || fail "part 0 retry exited $?"
wait "$P1" || fail "part 1 retry exited $?"
wait "$C1" || fail "consumer exited $?"
grep -q "applied=6 versions=6 anchors=1 .*bit-exact" "$TMP/c1.out" || fail "consumer: $(cat "$TMP/c1.out")"
stop_broker b
echo "test_broker_abort: ok"
