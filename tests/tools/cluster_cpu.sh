#!/usr/bin/env bash
# Where a cluster's delta time goes when the cluster shares a few cores:
# bench-cluster's tree (or star) on network namespaces (scripts/cluster_*.sh),
# an anchor then ~1% deltas of a 10M gen-trace, and per version:
#   wall      seconds from publish start to the last worker's line
#   busy      CPU seconds the whole machine spent meanwhile (/proc/stat;
#             this script's polling included)
#   workers   CPU seconds all `deltacast subscribe` workers spent (every
#             thread of each, /proc/PID/stat), and that over N in ms
#   brokers   CPU seconds the root and relay brokers spent
#   rest      busy less workers and brokers: the kernel's threads (network,
#             writeback), the producer, this script and its log stampers
# then the workers' CPU over the machine's cores against the wall time:
# near 1, the deltas are CPU-bound here, not link-bound.  The probe behind
# docs/benchmarks.md's cluster notes; `make bench-cluster` is the benchmark.
# Usage: [SPEC=tree:4:64] [CLUSTER_CPU_PERF=FILE] tests/tools/cluster_cpu.sh
# (root, from the repo root after `make`; exits 77 where namespaces cannot
# be built).  CLUSTER_CPU_PERF: `perf record -a -g` over the deltas into FILE.
HERE=$(cd "$(dirname "$0")/../../scripts" && pwd)
. "$HERE/cluster_lib.sh"
. "$HERE/cluster_run.sh"
BUILD=${DELTACAST_BUILD:-$HERE/../build}
MODEL=m
SPEC=${SPEC:-tree:4:64}
DELTAS=${CLUSTER_CPU_DELTAS:-3}
CL_RANGE_ELEMS=131072
why=$(cl_usable)
[ -z "$why" ] || { echo "cluster_cpu: cannot build network namespaces here: $why" >&2; exit 77; }
ROOT=$(mktemp -d "${TMPDIR:-/tmp}/dcx-cpu.XXXXXX")
RUN=$ROOT/run
mkdir -p "$RUN"
PERF_PID=
trap '[ -n "$PERF_PID" ] && kill -INT "$PERF_PID" 2>/dev/null; cl_down; rm -rf "$ROOT"' EXIT
trap 'exit 130' INT TERM
die() { echo "cluster_cpu: $*" >&2; exit 1; }

# busy: jiffies the machine spent busy (scripts/cluster_lib.sh).
busy() { cl_cpu_machine | cut -d' ' -f1; }

# pids_cpu KIND HOST...: jiffies the processes CL_<KIND>_PID_<HOST> have
# spent so far.
pids_cpu() {
	local kind=$1 h p pids=()
	shift
	for h in "$@"; do
		eval "p=\$CL_${kind}_PID_$h"
		pids+=("$p")
	done
	cl_cpu_pids "${pids[@]}"
}

"$BUILD/deltacast" gen-trace --params 10M --steps "$DELTAS" --density 0.01 -o "$ROOT/trace" \
	2>"$ROOT/gen.err" || die "gen-trace: $(tail -n 1 "$ROOT/gen.err")"
FILES=("$ROOT"/trace/v*.safetensors)
HZ=$(getconf CLK_TCK)
cl_topology "$SPEC" 100mbit 1gbit 2>>"$ROOT/setup.log" || die "$SPEC: topology"
cl_start_brokers --heartbeat-ms 10000 --anchor-fraction 0 || die "brokers"
cl_start_workers $((${#FILES[@]} + 1)) || die "workers did not join" # kept running
N=${#CL_WORKERS[@]}
cl_start_publisher "${FILES[@]}"
v=0
for f in "${FILES[@]}"; do
	((v++))
	if [ "$v" = 2 ] && [ -n "${CLUSTER_CPU_PERF:-}" ]; then
		perf record -a -g -F 1999 -o "$CLUSTER_CPU_PERF" >/dev/null 2>&1 &
		PERF_PID=$!
	fi
	b0=$(busy) w0=$(pids_cpu WORKER "${CL_WORKERS[@]}") r0=$(pids_cpu BROKER root "${CL_RELAYS[@]}")
	cl_publish_next
	cl_wait_for 3000 cl_have "$v" || die "version $v did not reach every worker"
	b1=$(busy) w1=$(pids_cpu WORKER "${CL_WORKERS[@]}") r1=$(pids_cpu BROKER root "${CL_RELAYS[@]}")
	awk -v v="$v" -v t="$(cl_time_all "$v" "$CL_T0")" -v b=$((b1 - b0)) -v w=$((w1 - w0)) -v r=$((r1 - r0)) -v hz="$HZ" \
		-v n="$N" -v cpus="$(nproc)" 'BEGIN {
		printf "version %d%s: wall %.3f s, busy %.2f s, workers %.2f s (%.1f ms each), brokers %.2f s, rest %.2f s, workers / %d cores / wall %.2f\n",
			v, v == 1 ? " (anchor)" : "", t, b / hz, w / hz, 1000 * w / hz / n, r / hz, (b - w - r) / hz, cpus, w / hz / cpus / t }'
done
[ -n "$PERF_PID" ] && { kill -INT "$PERF_PID"; wait "$PERF_PID"; PERF_PID=; }
exec {CL_GO}>&-
wait "$CL_PUB_PID" || die "the publisher failed: $(tail -n 2 "$RUN/publisher.log")"
