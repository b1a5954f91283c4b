#!/usr/bin/env bash
# A relay restarted with --data-dir after its upstream's run changed: the model was deleted and created again upstream while the
# relay was down.  The relay restores a log of the earlier run (versions
# 1..5 of seed 1); the new run has versions 1..3 of seed 2, so the old
# run's version 3 (or 5) fails wire_client's bit-exact check at version 3.
# Before the fix the relay served that log under the new run's id, to a
# consumer that joined before the upstream's WELCOME and to any later one.
# Now it holds the log until the upstream's WELCOME names a run, drops it
# when that is not the run it was relayed from (or no run id was kept with
# it), says why, and joins again from nothing.
. "$(dirname "$0")/tools/broker_lib.sh"

DATA=$TMP/relay-data
start_broker a --admin-socket "$TMP/admin.sock" --anchor-fraction 0
start_broker r --upstream "$a_CONS" --upstream-model m --data-dir "$DATA" --anchor-fraction 0
"$WC" produce "$a_PROD" m --versions 5 --seed 1 >"$TMP/p1.log" 2>&1 || fail "producer of run 1 refused"
"$WC" consume "$r_CONS" m --until 5 --seed 1 >"$TMP/c1.log" 2>&1 || fail "relay did not serve run 1"
run_old=$(sed -n 's/.*model m: created, run \([0-9a-f]*\).*/\1/p' "$TMP/a.log")
stop_broker r

"$BUILD/deltacast" model delete m --admin-socket "$TMP/admin.sock" >/dev/null || fail "delete m failed"
"$WC" produce "$a_PROD" m --versions 3 --seed 2 >"$TMP/p2.log" 2>&1 || fail "m not created again"
run_new=$(sed -n 's/.*model m: created, run \([0-9a-f]*\).*/\1/p' "$TMP/a.log" | tail -n 1)
[ -n "$run_new" ] && [ "$run_old" != "$run_new" ] || fail "m created again is not a new run ($run_old, $run_new)"

# The upstream is stopped while the relay restarts and a consumer joins
# it: the relay has its restored log and no WELCOME from upstream yet.
kill -STOP "$a_PID"
start_broker_metrics r2 --upstream "$a_CONS" --upstream-model m --data-dir "$DATA" --anchor-fraction 0
# restored: 5 versions, up to 5
check_metric r2 'deltacast_model_log_versions{model="m"}' 5
check_metric r2 'deltacast_model_version{model="m"}' 5
bg early "$WC" consume "$r2_CONS" m --until 3 --seed 2
EARLY=$LAST_PID
wait_consumers r2 1
kill -CONT "$a_PID"
wait "$EARLY" || fail "early consumer of the restarted relay: $(tail -n 2 "$TMP/early.err")"
grep -q "applied=3 .*bit-exact" "$TMP/early.out" || fail "early: $(cat "$TMP/early.out")"
grep -q "relay m: restored log of version 5, relayed from run $run_old, held" "$TMP/r2.log" ||
	fail "restored log not held: $(grep -m3 'relay m' "$TMP/r2.log")"
grep -q "relay m: upstream serves run $run_new, the restored log is of run $run_old: it is dropped" "$TMP/r2.log" ||
	fail "no line saying why the log was dropped: $(grep 'relay m' "$TMP/r2.log")"
"$WC" consume "$r2_CONS" m --until 3 --seed 2 >"$TMP/late.out" 2>"$TMP/late.err" ||
	fail "late consumer of the restarted relay: $(tail -n 2 "$TMP/late.err")"
grep -q "applied=3 .*bit-exact" "$TMP/late.out" || fail "late: $(cat "$TMP/late.out")"
stop_broker r2

# Same run: the restored log is served, only what follows it is fetched.
start_broker_metrics r3 --upstream "$a_CONS" --upstream-model m --data-dir "$DATA" --anchor-fraction 0
wait_for 10 grep -q "relay m: upstream serves run $run_new, the run of the restored log: serving it from version 3" \
	"$TMP/r3.log" || fail "same run not confirmed: $(grep 'relay m' "$TMP/r3.log")"
"$WC" consume "$r3_CONS" m --until 3 --seed 2 >"$TMP/c3.out" 2>"$TMP/c3.err" || fail "consumer of r3 exited $?"
check_metric r3 deltacast_versions_committed_total 0 # r3 fetched nothing again
! grep -q "dropped" "$TMP/r3.log" || fail "r3 dropped what it kept: $(grep -m1 dropped "$TMP/r3.log")"
stop_broker r3

# No run id kept with the log (a data dir from a broker before run ids):
# nothing says which run it is, so it is dropped as well.
rm "$DATA/runs/6d"
start_broker r4 --upstream "$a_CONS" --upstream-model m --data-dir "$DATA" --anchor-fraction 0
grep -q "relay m: restored log of version 3 held, with no run id to match" "$TMP/r4.log" ||
	fail "no line for the missing run id: $(grep 'relay m' "$TMP/r4.log")"
"$WC" consume "$r4_CONS" m --until 3 --seed 2 >"$TMP/c4.out" 2>"$TMP/c4.err" || fail "consumer of r4 exited $?"
grep -q "relay m: upstream serves run $run_new, and no run id was kept with the restored log: it is dropped" \
	"$TMP/r4.log" || fail "r4 did not drop an unidentified log: $(grep 'relay m' "$TMP/r4.log")"
[ -f "$DATA/runs/6d" ] || fail "r4 did not keep the run id"
stop_broker r4

# A new run longer than the restored log: the relay's first HELLO asks for
# what follows its version 3, so the upstream starts a stream of deltas
# that the relay, having dropped its log, cannot take.  Messages of the
# stream before the WELCOME to its next HELLO are that old stream: they
# are left unread, not refused one by one with a HELLO each (before, some
# 6,000 refusals and re-joins in 80 ms).
"$BUILD/deltacast" model delete m --admin-socket "$TMP/admin.sock" >/dev/null || fail "second delete of m failed"
"$WC" produce "$a_PROD" m --versions 7 --seed 3 >"$TMP/p3.log" 2>&1 || fail "m not created a third time"
start_broker r5 --upstream "$a_CONS" --upstream-model m --data-dir "$DATA" --anchor-fraction 0
"$WC" consume "$r5_CONS" m --until 7 --seed 3 >"$TMP/c5.out" 2>"$TMP/c5.err" || fail "consumer of r5 exited $?"
grep -q "applied=7 .*bit-exact" "$TMP/c5.out" || fail "r5: $(cat "$TMP/c5.out")"
hellos=$(grep -c "relay m: HELLO to" "$TMP/r5.log")
echo "relay r5: $hellos HELLO(s) upstream to reach a longer new run"
[ "$hellos" -le 3 ] || fail "relay r5 said HELLO $hellos times: $(grep -m3 'relay m: ' "$TMP/r5.log" | tail -n 1)"
stop_broker r5
stop_broker a
echo "test_broker_relay_restart: ok"
