#!/usr/bin/env bash
# Measure the broker's resident memory (VmRSS) with its log filled and then
# 1 vs 50 consumers streamed to the end, to put numbers on the per-consumer
# cost (payload frames are shared, so it should be small and flat).
# Usage: tests/tools/broker_rss.sh [ELEMS] [VERSIONS]  (run from the repo root)
. "$(dirname "$0")/broker_lib.sh"
ELEMS=${1:-262144}
VERSIONS=${2:-20}
rss() { awk '/VmRSS/ {print $2}' "/proc/$b_PID/status"; }

start_broker_metrics b
r0=$(rss)
"$WC" produce "$b_PROD" rss --versions "$VERSIONS" --elems "$ELEMS" 2>"$TMP/p.err" || fail producer
r1=$(rss)
"$WC" consume "$b_CONS" rss --until "$VERSIONS" --elems "$ELEMS" >"$TMP/c0.out" 2>&1 || fail consumer
r2=$(rss)
pids=()
for i in $(seq 1 50); do
	"$WC" consume "$b_CONS" rss --until "$VERSIONS" --elems "$ELEMS" --timeout-ms 120000 >"$TMP/c$i.out" 2>&1 &
	pids+=($!)
done
wait_joined b 51 # the first consumer and these 50 have joined: the stream is under way
rs=$(rss)
for p in "${pids[@]}"; do wait "$p" || fail "consumer $p"; done
r3=$(rss)
log_bytes=$(sed -n 's/.*(\(anchor\|delta\), [0-9]* chunks, \([0-9]*\) bytes).*/\2/p' "$TMP/b.log" | awk '{s+=$1} END {print s}')
echo "log payload: $log_bytes bytes in $VERSIONS versions ($ELEMS x 3 bf16 elements)"
echo "rss_kb: start=$r0 log_filled=$r1 after_1_consumer=$r2 while_50_streaming=$rs after_50_consumers=$r3"
echo "per consumer while streaming: $(( (rs - r2) / 50 )) KiB; after: $(( (r3 - r2) / 50 )) KiB"
stop_broker b
