#!/usr/bin/env bash
# A relay whose upstream's run goes A, then B, then A again, while the
# durable writes of run A's versions are still queued.  The relay drops its
# log at each change; the writes queued before a drop must not count when
# they finish.  Before the fix they did, once the model's run was A again:
# they marked version 2 durable and ACKed it upstream, and the first write
# of the new log (version 1) then failed the assertion on durable versions,
# and the relay aborted.  Two upstream brokers take turns on one address:
# u1 keeps run A in its data dir, u2 starts run B from nothing.
. "$(dirname "$0")/tools/broker_lib.sh"

start_broker u1 --data-dir "$TMP/u1" --anchor-fraction 0
CONS=$u1_CONS
PROD=$u1_PROD
# Each durable version of the relay takes 2 s: run A's two versions are
# still being written after both run changes.
DELTACAST_BROKER_FAULT=slowdisk:1000 start_broker r --upstream "$CONS" --upstream-model m \
	--data-dir "$TMP/r" --anchor-fraction 0
"$WC" produce "$PROD" m --versions 2 --seed 1 >"$TMP/p1.log" 2>&1 || fail "producer of run A refused"
wait_for 10 grep -q "model m: version 2 committed" "$TMP/r.log" || fail "the relay did not take run A's version 2"
run_a=$(sed -n 's/.*model m: created, run \([0-9a-f]*\).*/\1/p' "$TMP/u1.log")
! grep -q "model m: version 1 durable" "$TMP/r.log" || fail "run A written before the changes: no test"
stop_broker u1

start_broker u2 --consumers "$CONS" --producers "$PROD"
"$WC" produce "$PROD" m --versions 1 --seed 2 >"$TMP/p2.log" 2>&1 || fail "producer of run B refused"
run_b=$(sed -n 's/.*model m: created, run \([0-9a-f]*\).*/\1/p' "$TMP/u2.log")
wait_for 10 grep -q "relay m: upstream serves run $run_b (was $run_a): the earlier run's log is dropped" "$TMP/r.log" ||
	fail "the relay did not drop run A's log: $(grep 'relay m' "$TMP/r.log")"
stop_broker u2

start_broker u1b --consumers "$CONS" --producers "$PROD" --data-dir "$TMP/u1" --anchor-fraction 0
wait_for 10 grep -q "relay m: upstream serves run $run_a (was $run_b)" "$TMP/r.log" ||
	fail "the relay did not take run A again: $(grep 'relay m' "$TMP/r.log")"
# The writes finish in order: run A's first two (skipped), the first drop,
# run B's version 1 (skipped), the second drop, run A's two again.
drops_done() { [ "$(grep -c "model m: segments deleted" "$TMP/r.log")" = 2 ]; }
wait_for 30 drops_done ||
	fail "the relay's two drops did not finish: $(grep -c "segments deleted" "$TMP/r.log")"
# From the change to run B to the second drop, every write that finishes
# was queued before a drop.
SWITCH=$(grep -n "relay m: upstream serves run $run_b" "$TMP/r.log" | head -n 1 | cut -d: -f1)
DROPPED=$(grep -n "model m: segments deleted" "$TMP/r.log" | tail -n 1 | cut -d: -f1)
STALE=$(sed -n "${SWITCH},${DROPPED}p" "$TMP/r.log" | grep "model m: version [0-9]* durable")
[ -z "$STALE" ] || fail "a write queued before a drop counted: $STALE"
"$WC" consume "$r_CONS" m --until 2 --seed 1 >"$TMP/c.out" 2>"$TMP/c.err" || fail "consumer of the relay exited $?"
grep -q "applied=2 .*bit-exact" "$TMP/c.out" || fail "consumer: $(cat "$TMP/c.out")"
wait_for 30 logged_since "$TMP/r.log" "$DROPPED" "model m: version 2 durable" ||
	fail "run A's version 2 not durable on the relay again"
kill -0 "$r_PID" 2>/dev/null || fail "the relay is gone"
! grep -q "assertion failed" "$TMP/r.log" || fail "$(grep 'assertion' "$TMP/r.log")"
stop_broker r
stop_broker u1b
echo "test_broker_relay_run_flap: ok"
