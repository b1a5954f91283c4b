#!/usr/bin/env bash
# Broker: an anchor and deltas from one producer reach ten consumers
# bit-exact (each applies with the codec, checks every digest, and compares
# its tensors with the recomputed source); then a clean SIGTERM shutdown.
. "$(dirname "$0")/tools/broker_lib.sh"

start_broker_metrics b
for i in $(seq 1 10); do
	bg "c$i" "$WC" consume "$b_CONS" m1 --until 12
	CPIDS[$i]=$LAST_PID
done
wait_consumers b 10
"$WC" produce "$b_PROD" m1 --versions 12 2>"$TMP/p.err" || fail "producer exited $?"
for i in $(seq 1 10); do
	wait "${CPIDS[$i]}" || fail "consumer $i exited $?"
	grep -q "applied=12 versions=12 anchors=1 .*bit-exact" "$TMP/c$i.out" || fail "consumer $i: $(cat "$TMP/c$i.out")"
done
check_metric b deltacast_versions_committed_total 12
check_metric b 'deltacast_model_version{model="m1"}' 12
stop_broker b
grep -q "stopped" "$TMP/b.log" || fail "no clean stop"
echo "test_broker_flow: ok"
