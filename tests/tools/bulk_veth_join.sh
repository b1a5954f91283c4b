#!/usr/bin/env bash
# One library consumer in a network namespace of its own, behind a veth
# pair (a container on the broker's host), joins one committed anchor over
# --bulk, the broker in the host's namespace with --bulk-send MODE: the
# consumer's READY time from its start and its CPU until READY.  The probe
# behind docs/operations.md's note on containers ("Bulk anchors").  Root
# only; the namespace and the pair are this script's own, removed on exit;
# exit 77 where they cannot be made.
# Usage: tests/tools/bulk_veth_join.sh MODE [SAFETENSORS]   (MODE: copy,
# sendfile or auto; run from the repo root after `make`; SAFETENSORS
# defaults to the 100M model bench-fanout generates).
. "$(dirname "$0")/broker_lib.sh"

MODE=${1:?usage: bulk_veth_join.sh MODE [SAFETENSORS]}
MODEL=${2:-$BUILD/bench-fanout-100M/v0000.safetensors}
NS=dcast-veth-$$
HOST_IF=dcv$$a
NET=10.231.$(($$ % 200))
trap 'veth_down "$NS" "$HOST_IF"; cleanup' EXIT

[ -f "$MODEL" ] || fail "no model $MODEL (make bench-fanout generates it, or give one)"
veth_up "$NS" "$HOST_IF" "dcv$$b" "$NET"
anchor_broker s "$MODEL" --consumers "tcp://$NET.1:*" --bulk "$NET.1:0" --bulk-send "$MODE" \
	--data-dir "$TMP/data"
"$BUILD/tools/bench_tcp" "$(stat -c %s "$MODEL")" 2 warm >/dev/null || fail "warm"
t0=$(date +%s%N)
ip netns exec "$NS" "$BUILD/tools/bench_sync_consumer" "$s_CONS" bench "$TMP/c" 1 >"$TMP/c.log" \
	2>"$TMP/c.err" || fail "the consumer exited $?"
how=$(sed -n 's/.*takes version 1 (.*, \([a-z]*\))$/\1/p' "$TMP/s.log")
awk -v t0="$t0" -v how="$how" '$1 == "ready" {
	printf "consumer behind veth, %s: READY at %.0f ms, cpu %.0f ms at READY\n", how, ($4 - t0) / 1e6, $6 / 1e6 }' \
	"$TMP/c.log"
stop_broker s
