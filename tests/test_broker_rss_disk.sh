#!/usr/bin/env bash
# Broker --data-dir: an open version's payloads go to the data dir as they
# arrive, and committed ones are served from the segment files, so the heap
# holds only what is in flight.  A 96 MiB model (anchor and 3 deltas) goes
# to 2 consumers, bit-exact; the broker's peak resident memory (VmHWM)
# stays under a quarter of the model, and its VmRSS after serving too.
# Restarted from the data dir, the broker serves the same log to a new
# consumer, bit-exact, under the same bound.  What is in flight is ZeroMQ's
# queues under each peer's credit: the producer's window is 8 MiB here (the
# default, 256 MiB, is itself more than this small model).
. "$(dirname "$0")/tools/broker_lib.sh"

skip_rss_under_asan

ELEMS=${RSS_DISK_ELEMS:-16777216}      # x 3 bf16 tensors: 96 MiB
VERSIONS=4
MODEL_KB=$((ELEMS * 3 * 2 / 1024))
BOUND_KB=$((MODEL_KB / 4))

rss_below() { [ "$(status_kb "$1" VmRSS)" -lt "$2" ]; }

# consumers N: N consumers of model m to version VERSIONS, each bit-exact.
consumers() {
	local pids=() i
	for i in $(seq 1 "$1"); do
		bg "c$i" "$WC" consume "$b_CONS" m --until "$VERSIONS" --elems "$ELEMS" --timeout-ms 120000
		pids+=("$LAST_PID")
	done
	for i in $(seq 1 "$1"); do
		wait "${pids[$((i - 1))]}" || fail "consumer $i exited $?"
		grep -q "applied=$VERSIONS .*bit-exact" "$TMP/c$i.out" || fail "consumer $i: $(cat "$TMP/c$i.out")"
	done
}

start_broker b --data-dir "$TMP/data" --producer-window-bytes 8388608
"$WC" produce "$b_PROD" m --versions "$VERSIONS" --elems "$ELEMS" --timeout-ms 120000 \
	2>"$TMP/p.err" || fail "producer exited $?"
consumers 2
# The heap gives freed payloads back on a quiet turn (at most a second later).
wait_for 10 rss_below "$b_PID" "$BOUND_KB" ||
	fail "broker VmRSS $(status_kb "$b_PID" VmRSS) KiB after serving, bound $BOUND_KB KiB (model $MODEL_KB KiB)"
echo "served: VmRSS $(status_kb "$b_PID" VmRSS) KiB, VmHWM $(status_kb "$b_PID" VmHWM) KiB, model $MODEL_KB KiB"
[ "$(status_kb "$b_PID" VmHWM)" -lt "$BOUND_KB" ] ||
	fail "broker VmHWM $(status_kb "$b_PID" VmHWM) KiB, bound $BOUND_KB KiB (model $MODEL_KB KiB)"
stop_broker b

start_broker b --data-dir "$TMP/data" --producer-window-bytes 8388608
logged_since "$TMP/b.log" "$START_FROM" "$VERSIONS committed version(s) restored" || fail "not restored"
consumers 1
wait_for 10 rss_below "$b_PID" "$BOUND_KB" ||
	fail "restarted broker VmRSS $(status_kb "$b_PID" VmRSS) KiB, bound $BOUND_KB KiB"
echo "restored: VmRSS $(status_kb "$b_PID" VmRSS) KiB, VmHWM $(status_kb "$b_PID" VmHWM) KiB"
[ "$(status_kb "$b_PID" VmHWM)" -lt "$BOUND_KB" ] || fail "restarted broker VmHWM $(status_kb "$b_PID" VmHWM) KiB"
stop_broker b
echo "test_broker_rss_disk: ok"
