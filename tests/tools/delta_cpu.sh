#!/usr/bin/env bash
# One library consumer (tests/tools/bench_sync_consumer) takes an anchor,
# then the deltas of a gen-trace: per delta its stage and apply time, and
# the CPU time its process spent (every thread: the cpu_ns it prints) over
# the deltas after the first two, which the anchor's seal may share.  The consumer-side probe behind docs/benchmarks.md's
# notes on the delta's decode; `make bench-sync` is the benchmark.
# Usage: tests/tools/delta_cpu.sh [TRACE_DIR] (run from the repo root after
# `make`; TRACE_DIR holds v0000.safetensors ... as `deltacast gen-trace`
# writes them, at least 4 of them; default: bench-sync's 100M trace).
# DELTA_CPU_FOLDS=1: the consumer then waits for its background folds
# before it closes (BENCH_SYNC_CONSUMER_SETTLE), and the probe prints each
# fold's line (records, wall and CPU time, from DELTACAST_LOG=debug) and
# the CPU time with the folds; a trace of 40 versions of 10M parameters at
# 1% folds once (the policy: a quarter of the model logged).
. "$(dirname "$0")/broker_lib.sh"

DIR=${1:-$(ls -d "$BUILD"/bench-sync-100M-* 2>/dev/null | head -1)}
[ -n "$DIR" ] && [ -f "$DIR/v0003.safetensors" ] || fail "no trace (make bench-sync generates one, or give one)"
FILES=("$DIR"/v*.safetensors)
LAST=${#FILES[@]}

applied() { grep -q "^applied $1 " "$TMP/c.log"; }

start_broker s
FOLDS=${DELTA_CPU_FOLDS:-0}
BENCH_SYNC_CONSUMER_SETTLE=$FOLDS DELTACAST_LOG=$([ "$FOLDS" = 1 ] && echo debug || echo info) \
	"$BUILD/tools/bench_sync_consumer" "$s_CONS" bench "$TMP/c" "$LAST" >"$TMP/c.log" 2>"$TMP/c.err" &
CP=$!
PIDS+=($CP)
# fault_publish paced by lines on its stdin: one line, one version
exec 7> >("$BUILD/tools/fault_publish" "$s_PROD" bench 1 -1 "${FILES[@]}" >"$TMP/pub.log" 2>&1)
for v in $(seq "$LAST"); do
	echo >&7
	wait_for 60 applied "$v" || fail "version $v not applied"
done
exec 7>&-
wait "$CP" || fail "the consumer exited $?"
awk -v last="$LAST" '$1 == "applied" {
	for (k = 1; k < NF; k++) {
		if ($k == "stage_ns") s = $(k + 1) / 1e6
		if ($k == "apply_ns") a = $(k + 1) / 1e6
		if ($k == "cpu_ns") cpu[$2] = $(k + 1)
	}
	if ($3 == "delta") printf "version %d: stage %.1f ms, apply %.1f ms\n", $2, s, a
}
$1 == "settled" { settled = $NF; folds = $3 }
END {
	printf "consumer CPU over versions 3..%d: %.1f ms (%d deltas)\n", last, (cpu[last] - cpu[2]) / 1e6, last - 2
	if (settled)
		printf "with its folds done (%d, the anchor'"'"'s seal included): %.1f ms\n", folds, (settled - cpu[2]) / 1e6
}' "$TMP/c.log"
[ "$FOLDS" = 1 ] && sed -n 's/.*D consumer bench: \(fold from the disk.*\)/\1/p' "$TMP/c.err"
stop_broker s
