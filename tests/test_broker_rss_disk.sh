#!/usr/bin/env bash
# Broker --data-dir: committed payloads are served from the segment files,
# not kept in the heap.  A 96 MiB model (anchor and 3 deltas) goes to 2
# consumers, bit-exact; the broker's resident memory (VmRSS) then stays
# under a quarter of the model.  Restarted from the data dir, the broker
# serves the same log to a new consumer, bit-exact, under the same bound.
. "$(dirname "$0")/tools/broker_lib.sh"

ELEMS=${RSS_DISK_ELEMS:-16777216}      # x 3 bf16 tensors: 96 MiB
VERSIONS=4
MODEL_KB=$((ELEMS * 3 * 2 / 1024))
BOUND_KB=$((MODEL_KB / 4))

status_kb() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }
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

start_broker b --data-dir "$TMP/data"
"$WC" produce "$b_PROD" m --versions "$VERSIONS" --elems "$ELEMS" --timeout-ms 120000 \
	2>"$TMP/p.err" || fail "producer exited $?"
consumers 2
# The heap gives freed payloads back on a quiet turn (at most a second later).
wait_for 10 rss_below "$b_PID" "$BOUND_KB" ||
	fail "broker VmRSS $(status_kb "$b_PID" VmRSS) KiB after serving, bound $BOUND_KB KiB (model $MODEL_KB KiB)"
echo "served: VmRSS $(status_kb "$b_PID" VmRSS) KiB, VmHWM $(status_kb "$b_PID" VmHWM) KiB, model $MODEL_KB KiB"
stop_broker b

start_broker b --data-dir "$TMP/data"
logged_since "$TMP/b.log" "$START_FROM" "$VERSIONS committed version(s) restored" || fail "not restored"
consumers 1
wait_for 10 rss_below "$b_PID" "$BOUND_KB" ||
	fail "restarted broker VmRSS $(status_kb "$b_PID" VmRSS) KiB, bound $BOUND_KB KiB"
echo "restored: VmRSS $(status_kb "$b_PID" VmRSS) KiB, VmHWM $(status_kb "$b_PID" VmHWM) KiB"
stop_broker b
echo "test_broker_rss_disk: ok"
