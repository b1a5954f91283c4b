#!/usr/bin/env bash
# Broker-made anchors with --data-dir: the fold's state lives in a file of
# the data dir, read and written one range at a time, so making an anchor
# does not hold a dense copy of the model in the heap.  A 252 MiB model
# (anchor and 2 deltas of about 2.9% each) goes to 2 consumers connected
# from the start, bit-exact; --anchor-fraction 0.04 is passed by the second
# delta, so the broker folds the chain, checks it against the digests and
# cuts anchor 3; a late joiner gets the made anchor alone, bit-exact.  The
# broker's peak resident memory (VmHWM) over all of it stays under a
# quarter of the model (with the state in the heap it is above the whole
# model).  What is in flight is ZeroMQ's queues under each peer's credit:
# the producer's window is 8 MiB, the consumers' 4 MiB (a made anchor's
# chunk is 2 MiB: 1M elements).
. "$(dirname "$0")/tools/broker_lib.sh"

skip_rss_under_asan
ELEMS=${RSS_FOLD_ELEMS:-44040192}      # x 3 bf16 tensors: 252 MiB
COMMON=(--elems "$ELEMS" --window 4194304 --timeout-ms 150000)
MODEL_KB=$((ELEMS * 3 * 2 / 1024)) VERSIONS=3
BOUND_KB=$((MODEL_KB / 4))

# On a loaded 2-core machine the wire_client producer, computing a 252 MiB
# version, was seen silent for 3 s (3 heartbeats of 1 s): the broker here
# waits 15 s before it drops a peer.
start_broker_metrics b --data-dir "$TMP/data" --producer-window-bytes 8388608 --heartbeat-ms 5000 \
	--anchor-fraction 0.04
pids=()
for i in 1 2; do
	bg "c$i" "$WC" consume "$b_CONS" m --until "$VERSIONS" "${COMMON[@]}"
	pids+=("$LAST_PID")
done
wait_consumers b 2
"$WC" produce "$b_PROD" m --versions "$VERSIONS" --elems "$ELEMS" --timeout-ms 150000 \
	2>"$TMP/p.err" || fail "producer exited $?"
for i in 1 2; do
	wait "${pids[$((i - 1))]}" || fail "consumer $i exited $?"
	grep -q "applied=$VERSIONS .*bit-exact" "$TMP/c$i.out" || fail "consumer $i: $(cat "$TMP/c$i.out")"
done
wait_metric b 'deltacast_model_anchor_version{model="m"}' "$VERSIONS" 60 # made anchor 3
check_metric b deltacast_anchors_made_total 1
check_metric b deltacast_anchor_digest_errors_total 0
"$WC" consume "$b_CONS" m --until "$VERSIONS" "${COMMON[@]}" >"$TMP/late.out" 2>"$TMP/late.err" ||
	fail "late joiner exited $?: $(cat "$TMP/late.err")"
grep -q "applied=$VERSIONS versions=1 anchors=1 .*bit-exact" "$TMP/late.out" ||
	fail "late joiner: $(cat "$TMP/late.out")"
# No state file is left in the data dir (an unnamed file: gone with the cut).
[ -z "$(find "$TMP/data" -name '*fold*')" ] || fail "fold files left: $(find "$TMP/data" -name '*fold*')"
echo "made anchor: VmHWM $(status_kb "$b_PID" VmHWM) KiB, VmRSS $(status_kb "$b_PID" VmRSS) KiB," \
	"model $MODEL_KB KiB, bound $BOUND_KB KiB"
[ "$(status_kb "$b_PID" VmHWM)" -lt "$BOUND_KB" ] ||
	fail "broker VmHWM $(status_kb "$b_PID" VmHWM) KiB, bound $BOUND_KB KiB (model $MODEL_KB KiB)"
stop_broker b
echo "test_broker_rss_fold: ok"
