#!/usr/bin/env bash
# The broker's CPU and memory to take one anchor from a producer: ROUNDS
# rounds, each a fresh broker (with DATA_DIR=1 a fresh --data-dir), the
# first version of a gen-trace model of PARAMS published by
# tests/tools/fault_publish; prints per round the broker's CPU over the
# publish (every thread, /proc/PID/stat: 10 ms ticks), its VmHWM and VmRSS after it, in MiB.
# A/B: DELTACAST_BROKER=/path/to/an/older/deltacast-broker.  The numbers
# behind docs/operations.md, "The broker's heap".
# Usage (from the repo root after `make`): tests/tools/broker_intake.sh [ROUNDS] [PARAMS]
. "$(dirname "$0")/broker_lib.sh"
ROUNDS=${1:-3}
PARAMS=${2:-100M}
f=($(trace_versions "$PARAMS"))

# The process's CPU in ms, its exited threads' included (user + system ticks).
cpu_ms() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%d\n", ($14 + $15) * 1000 / hz }' /proc/"$1"/stat; }

for r in $(seq "$ROUNDS"); do
	dd=()
	[ "${DATA_DIR:-0}" = 0 ] || dd=(--data-dir "$TMP/data$r")
	start_broker "b$r" "${dd[@]}"
	pid=$(eval echo "\$b${r}_PID")
	c0=$(cpu_ms "$pid")
	"$BUILD/tools/fault_publish" "$(eval echo "\$b${r}_PROD")" m 1 0 "${f[0]}" >"$TMP/p$r.out" 2>&1 ||
		fail "publish: $(cat "$TMP/p$r.out")"
	c1=$(cpu_ms "$pid")
	printf "round %d: broker CPU %d ms; %s\n" "$r" "$((c1 - c0))" \
		"$(awk '/^VmHWM|^VmRSS/ { printf "%s %.1f MiB ", $1, $2 / 1024 }' "/proc/$pid/status")"
	stop_broker "b$r"
done
