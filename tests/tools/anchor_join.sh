#!/usr/bin/env bash
# N library consumers join one committed anchor at once (a restarted fleet):
# each one's time from the script's start of the consumers to READY, its
# stage time (first chunk to READY), apply time and CPU time (every
# thread of its process, until it exits, and until READY), and the broker's
# CPU over the join (every thread, from the consumers' start until they
# exit; DELTACAST_BROKER=... names another build for an A/B).  The consumer-side
# numbers behind docs/benchmarks.md's bench-fanout notes; `make
# bench-fanout` is the benchmark, this is the quick probe.
# Usage: [ANCHOR_JOIN_BROKER_ARGS="--io-threads 8"] tests/tools/anchor_join.sh [N] [SAFETENSORS]
# (run from the repo root after `make`; SAFETENSORS defaults to the 100M
# model bench-fanout generates, build/bench-fanout-100M/v0000.safetensors).
. "$(dirname "$0")/broker_lib.sh"

N=${1:-1}
MODEL=${2:-$BUILD/bench-fanout-100M/v0000.safetensors}
anchor_broker s "$MODEL" ${ANCHOR_JOIN_BROKER_ARGS:-}
sync
# Memory touched and freed just before, as bench-fanout does: this VM's
# balloon hands free blocks back to the host, and the consumers' first
# touch of them would be the host's faults (clear_page at a tenth of its
# speed), not the library's work.
"$BUILD/tools/bench_tcp" "$(stat -c %s "$MODEL")" $((N + 1)) warm >/dev/null || fail "bench_tcp warm"
b0=$(cpu_ns "$s_PID")
t0=$(date +%s%N)
CONS=()
for i in $(seq "$N"); do
	"$BUILD/tools/bench_sync_consumer" "$s_CONS" bench "$TMP/c$i" 1 >"$TMP/c$i.log" 2>"$TMP/c$i.err" &
	CONS+=($!)
	PIDS+=($!)
done
for p in "${CONS[@]}"; do wait "$p" || fail "a consumer exited $?"; done
echo "broker: cpu $((($(cpu_ns "$s_PID") - b0) / 1000000)) ms over the join"
for i in $(seq "$N"); do
	awk -v t0="$t0" -v i="$i" '
		$1 == "ready" { ready = ($4 - t0) / 1e6; rcpu = $6 / 1e6 }
		$1 == "applied" { for (k = 1; k < NF; k++) {
			if ($k == "stage_ns") s = $(k + 1) / 1e6
			if ($k == "apply_ns") a = $(k + 1) / 1e6
			if ($k == "cpu_ns") cpu = $(k + 1) / 1e6 } }
		END { printf "consumer %d: READY at %.0f ms, stage %.0f ms, apply %.0f ms, cpu %.0f ms (%.0f ms at READY)\n",
			i, ready, s, a, cpu, rcpu }' "$TMP/c$i.log"
	grep "^threads:" "$TMP/c$i.err" || true # BENCH_SYNC_CONSUMER_THREADS=1: each thread's CPU at READY
done
stop_broker s
