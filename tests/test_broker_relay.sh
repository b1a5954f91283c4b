#!/usr/bin/env bash
# Broker relay: broker B consumes model m8 from broker A (--upstream) and
# serves its own consumers bit-exact, live and late.
. "$(dirname "$0")/tools/broker_lib.sh"

start_broker a
start_broker_metrics r --upstream "$a_CONS" --upstream-model m8
bg c1 "$WC" consume "$r_CONS" m8 --until 15
C1=$LAST_PID
wait_consumers r 1
"$WC" produce "$a_PROD" m8 --versions 15 2>"$TMP/p.err" || fail "producer exited $?"
wait "$C1" || fail "live consumer of the relay exited $?"
grep -q "applied=15 versions=15 anchors=1 .*bit-exact" "$TMP/c1.out" || fail "live: $(cat "$TMP/c1.out")"
"$WC" consume "$r_CONS" m8 --until 15 >"$TMP/c2.out" 2>"$TMP/c2.err" || fail "late consumer exited $?"
grep -q "applied=15 versions=15 anchors=1 .*bit-exact" "$TMP/c2.out" || fail "late: $(cat "$TMP/c2.out")"
# The relay refuses producers for a relayed model.
"$WC" produce "$r_PROD" m8 --versions 16 2>"$TMP/p2.err" && fail "relay accepted a producer for m8"
grep -q "relayed" "$TMP/p2.err" || fail "no clear refusal: $(cat "$TMP/p2.err")"
stop_broker r
# A relay with --data-dir keeps what it relayed: restarted, it restores its
# log before it says HELLO upstream, so it asks for what comes after its
# newest version, not for everything from the anchor again.
start_broker d --upstream "$a_CONS" --upstream-model m8 --data-dir "$TMP/relay-data"
"$WC" consume "$d_CONS" m8 --until 15 >"$TMP/d1.out" 2>"$TMP/d1.err" || fail "consumer of relay d exited $?"
stop_broker d
start_broker_metrics d2 --upstream "$a_CONS" --upstream-model m8 --data-dir "$TMP/relay-data"
grep -q "HELLO to .* with version 15 (start)" "$TMP/d2.log" ||
	fail "restarted relay did not ask for what follows version 15: $(grep HELLO "$TMP/d2.log")"
"$WC" consume "$d2_CONS" m8 --until 15 >"$TMP/d2c.out" 2>"$TMP/d2c.err" || fail "consumer of relay d2 exited $?"
grep -q "applied=15 versions=15 anchors=1 .*bit-exact" "$TMP/d2c.out" || fail "restarted relay: $(cat "$TMP/d2c.out")"
check_metric d2 deltacast_versions_committed_total 0 # it fetched nothing again
! grep -q "DCAST_E" "$TMP/d2.log" || fail "restarted relay: $(grep -m3 "DCAST_E" "$TMP/d2.log")"
stop_broker d2
stop_broker a
echo "test_broker_relay: ok"
