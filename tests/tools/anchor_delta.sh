#!/usr/bin/env bash
# A producer's anchor to N library consumers that hold the version before
# it: the broker makes them a delta from it (its default) or sends it whole
# (--no-anchor-deltas).  Per mode, a fresh broker; versions 1 and 2 (an
# anchor and a 1% delta of a gen-trace model) to N tests/tools/bench_sync_consumer;
# then version 3, the trace's next step, from a new tests/tools/fault_publish
# (no baseline: an anchor).  Prints per mode the time from that publish's
# start to the last consumer's READY, the payload bytes each consumer took
# for 3, the broker's CPU over version 3 (every thread, schedstat) and, for
# the delta, the broker's "made in" line.  The numbers behind
# docs/operations.md, "Producer anchors as deltas".
# Usage (from the repo root after `make`): tests/tools/anchor_delta.sh [N] [PARAMS]
. "$(dirname "$0")/broker_lib.sh"
N=${1:-4}
PARAMS=${2:-100M}
f=($(trace_versions "$PARAMS"))

# one MODE [BROKER FLAGS...]
one() {
	local mode=$1 pid c0 c1 t0 last=0 t bytes
	shift
	start_broker "$mode" "$@"
	pid=$(eval echo "\$${mode}_PID")
	CONS=()
	for i in $(seq "$N"); do
		"$BUILD/tools/bench_sync_consumer" "$(eval echo "\$${mode}_CONS")" m "$TMP/$mode-c$i" 3 \
			>"$TMP/$mode-c$i.log" 2>"$TMP/$mode-c$i.err" &
		CONS+=($!)
		PIDS+=($!)
	done
	"$BUILD/tools/fault_publish" "$(eval echo "\$${mode}_PROD")" m 1 0 "${f[0]}" "${f[1]}" \
		>"$TMP/$mode-p1.out" 2>&1 || fail "publish 1, 2: $(cat "$TMP/$mode-p1.out")"
	for i in $(seq "$N"); do
		wait_for 60 grep -q '^applied 2 ' "$TMP/$mode-c$i.log" || fail "consumer $i: no version 2"
	done
	c0=$(cpu_ns "$pid")
	"$BUILD/tools/fault_publish" "$(eval echo "\$${mode}_PROD")" m 3 0 "${f[2]}" \
		>"$TMP/$mode-p2.out" 2>&1 || fail "publish 3: $(cat "$TMP/$mode-p2.out")"
	for p in "${CONS[@]}"; do wait "$p" || fail "a consumer exited $?"; done
	c1=$(cpu_ns "$pid")
	t0=$(awk '$1 == "acked" && $2 == 3 { print $3 }' "$TMP/$mode-p2.out")
	for i in $(seq "$N"); do
		t=$(awk '$1 == "ready" && $2 == 3 { print $4 }' "$TMP/$mode-c$i.log")
		[ "$t" -gt "$last" ] && last=$t
	done
	bytes=$(awk '$1 == "applied" && $2 == 3 { for (k = 1; k < NF; k++) if ($k == "bytes") print $(k + 1) }' \
		"$TMP/$mode-c1.log")
	printf "%-6s N %d: version 3 READY at all %.1f ms after its publish; %s payload bytes each; broker CPU %.1f ms\n" \
		"$mode" "$N" "$(((last - t0) / 1000))e-3" "$bytes" "$(((c1 - c0) / 1000))e-3"
	grep -o 'anchor 3 goes.*' "$TMP/$mode.log" || true
	stop_broker "$mode"
}

one delta
one whole --no-anchor-deltas
