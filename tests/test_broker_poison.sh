#!/usr/bin/env bash
# A version the broker's fold finds bad is poisoned, not served: anchor
# v1, then v2 whose COMMIT carries a wrong digest (ACKed when it commits).
# The fold (--anchor-every 1) checks v2 against its digests, marks it
# poisoned (log line, deltacast_versions_poisoned_total), its producer
# gets ERROR DCAST_EPOISONED naming v2 and WELCOME need_anchor; the
# consumer already there stays at v1 without re-joining, a consumer that
# joins later is never sent v2, no made anchor holds v2, and both move
# on, digests checked, when the next anchor v3 comes.  A chunk that does
# not decode is found the same way.  With --data-dir the mark is on disk:
# a restarted broker still does not serve v2.
. "$(dirname "$0")/tools/broker_lib.sh"

# join_late NAME CONS: a raw consumer (it dies on any digest that differs)
# joins CONS, and takes v1 before the test goes on; sets LATE.
join_late() {
	bg "$1" "$WC" consume "$2" poison --until 3 --timeout-ms 20000 --stats "$TMP/$1.stats"
	LATE=$LAST_PID
	wait_for 10 grep -qs "applied=1 " "$TMP/$1.stats" || fail "consumer $1 not at v1"
}

# ended NAME: consumer NAME took v1 and v3, both anchors, and nothing else.
ended() {
	wait "$LATE" || fail "consumer $1 exited $?: $(tail -2 "$TMP/$1.err")"
	grep -q "applied=3 versions=2 anchors=2 " "$TMP/$1.stats" || fail "$1: $(cat "$TMP/$1.stats")"
}

start_broker_metrics s --anchor-every 1 --heartbeat-ms 100
"$WC" produce "$s_PROD" poison --versions 1 >"$TMP/prod1.log" 2>&1 || fail "anchor v1: exit $?"
bg sub "$BUILD/deltacast" subscribe --broker "$s_CONS" --model poison --dir "$TMP/sub" --until 3
SUB=$LAST_PID
wait_for 10 grep -q "^version 1 " "$TMP/sub.out" || fail "the consumer did not apply v1"

# v2 with a wrong digest; the producer stays to hear about it.
"$WC" produce "$s_PROD" poison --versions 2 --bad-digest-at 2 --wait-error 1 --timeout-ms 10000 \
	>"$TMP/prod2.log" 2>&1
grep -q "ERROR DCAST_EPOISONED version 2:" "$TMP/prod2.log" ||
	fail "the producer got no ERROR naming v2: $(tail -2 "$TMP/prod2.log")"
grep -q "model poison version 2 poisoned (DCAST_EDIGEST" "$TMP/s.log" || fail "no poison log line"
check_metric s deltacast_versions_poisoned_total 1

# The consumer hears of it and waits at v1: over 20 heartbeats at most the
# one re-join a refusal of v2 may have left due (its backoff: 100 ms
# doubling; without the mark it re-joins 4 times in such a window).
wait_for 10 grep -q "the broker poisoned version 2" "$TMP/sub.err" || fail "consumer not told"
metrics_addr s
joins=$(metric_of "$ADDR" deltacast_consumer_joins_total)
sleep 2 # the window the re-joins are counted over (20 broker heartbeats)
joins=$(($(metric_of "$ADDR" deltacast_consumer_joins_total) - joins))
echo "consumer joins in 2 s after the poison mark: $joins"
[ "$joins" -le 1 ] || fail "$joins re-joins in 2 s while v2 is poisoned"
tail -1 "$TMP/sub.out" | grep -q "^version 1 " || fail "consumer not at v1: $(tail -1 "$TMP/sub.out")"

# A consumer that joins now is never sent v2 (it would fail its digest).
join_late late "$s_CONS"

# The next anchor (v3: the producer is told v2 is the newest number and
# that an anchor is due) reaches both, digests checked.
"$WC" produce "$s_PROD" poison --versions 3 >"$TMP/prod3.log" 2>&1 || fail "anchor v3: exit $?"
ended late
wait "$SUB" || fail "subscribe exited $?: $(tail -2 "$TMP/sub.err")"
tail -1 "$TMP/sub.out" | grep -q "^version 3 anchor" || fail "consumer not at anchor v3"
grep -q "made anchor 2 " "$TMP/s.log" && fail "a made anchor holds v2"
stop_broker s

# A chunk that does not decode (its checksum holds: ingest takes it) is
# found by the fold as well.
start_broker u --anchor-every 1
"$WC" produce "$u_PROD" poison --versions 1 >"$TMP/prod6.log" 2>&1 || fail "anchor v1 to u: exit $?"
"$WC" produce "$u_PROD" poison --versions 2 --bad-payload-at 2 --wait-error 1 --timeout-ms 10000 \
	>"$TMP/prod7.log" 2>&1
grep -q "ERROR DCAST_EPOISONED version 2: model poison version 2 poisoned (DCAST_ECORRUPT" \
	"$TMP/prod7.log" || fail "no ERROR naming v2 from u: $(tail -2 "$TMP/prod7.log")"
stop_broker u

# With --data-dir the mark is on disk: a restart does not serve v2 again.
start_broker t --anchor-every 1 --data-dir "$TMP/data2"
"$WC" produce "$t_PROD" poison --versions 2 --bad-digest-at 2 --wait-error 1 --timeout-ms 10000 \
	>"$TMP/prod4.log" 2>&1
grep -q "ERROR DCAST_EPOISONED version 2:" "$TMP/prod4.log" || fail "no ERROR naming v2 from t"
wait_for 10 grep -q "poison mark of version 2 written" "$TMP/t.log" || fail "mark not written"
stop_broker t
start_broker t --anchor-every 1 --data-dir "$TMP/data2"
logged_since "$TMP/t.log" "$START_FROM" "version 2 was found poisoned before the restart" ||
	fail "the restart forgot the poison mark"
join_late late2 "$t_CONS"
"$WC" produce "$t_PROD" poison --versions 3 >"$TMP/prod5.log" 2>&1 || fail "anchor v3 to t: exit $?"
ended late2
stop_broker t
echo "test_broker_poison: ok"
