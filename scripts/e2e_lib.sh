# Sourced by scripts/demo.sh, scripts/faults.sh, scripts/bench_e2e.sh, bench_sync.sh and bench_fanout.sh:
# start real processes on loopback (the broker on ports picked from the PID,
# retrying on a bind failure), time-stamp their progress lines, and kill
# every process started here on any exit.
set -u
E2E_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${DELTACAST_BUILD:-$E2E_ROOT/build}
DC=$BUILD/deltacast
BROKER_BIN=$BUILD/deltacast-broker
PY=${PYTHON:-/usr/bin/python3}
E2E_PIDS=()
declare -A E2E_START

# e2e_started PID: PID's start time (field 22 of /proc/PID/stat, clock
# ticks after boot); nothing when no process has that number.
e2e_started() {
	local s
	read -r s 2>/dev/null <"/proc/$1/stat" || return 1
	s=${s##*) }
	set -- $s
	echo "${20}"
}

# e2e_alive PID: PID, tracked by e2e_track, is still the process it was
# then (a zombie not reaped yet counts), not another that took its number
# after it exited (pid_max can be 32768, and the machine is shared).
e2e_alive() {
	[ -n "${1:-}" ] && [ -n "${E2E_START[$1]:-}" ] && [ "$(e2e_started "$1")" = "${E2E_START[$1]}" ]
}

# e2e_signal SIG PID...: send SIG to each PID that is e2e_alive.
e2e_signal() {
	local sig=$1 p
	shift
	for p in "$@"; do
		e2e_alive "$p" && kill "-$sig" "$p" 2>/dev/null
	done
	return 0
}

e2e_cleanup() {
	local p
	for p in "${E2E_PIDS[@]}"; do
		e2e_alive "$p" || continue
		kill -CONT "$p" 2>/dev/null
		kill -9 "$p" 2>/dev/null
	done
	for p in "${E2E_PIDS[@]}"; do wait "$p" 2>/dev/null; done
	E2E_PIDS=()
	E2E_START=()
}

# e2e_snapshot DIR TOOL...: copy the programs, libdeltacast.so and the named
# tests/tools into DIR/bin, so that a rebuild during a run cannot swap them;
# sets BIN, DC and BROKER_BIN to the copies.  Returns 1 if one is missing.
e2e_snapshot() {
	local bin=$1/bin t
	shift
	mkdir -p "$bin/tools" && cp "$DC" "$BROKER_BIN" "$BUILD/libdeltacast.so" "$bin/" || return 1
	for t in "$@"; do cp "$BUILD/tools/$t" "$bin/tools/" || return 1; done
	BIN=$bin DC=$bin/deltacast BROKER_BIN=$bin/deltacast-broker
}

# e2e_track PID: kill PID at e2e_cleanup; its start time is kept for
# e2e_alive.
e2e_track() {
	E2E_PIDS+=("$1")
	E2E_START[$1]=$(e2e_started "$1")
}

# e2e_wait_for TENTHS COMMAND...: poll every 0.1 s until COMMAND succeeds.
e2e_wait_for() {
	local n=$1 i
	shift
	for ((i = 0; i < n; i++)); do "$@" && return 0; sleep 0.1; done
	return 1
}

# e2e_pick_port TRY: a port from [20000, 60000) drawn from the PID and the
# try number; the caller retries on a bind failure.
e2e_pick_port() {
	echo $((20000 + ($$ * 37 + $1 * 7919 + RANDOM) % 40000))
}

# e2e_start_broker LOG PORT [FLAGS...]: start the broker on PORT (producers)
# and PORT+1 (consumers); sets BROKER_PID.  Returns 1 if it did not come up.
e2e_start_broker_at() {
	local log=$1 port=$2
	shift 2
	"$BROKER_BIN" --producers "tcp://127.0.0.1:$port" --consumers "tcp://127.0.0.1:$((port + 1))" \
		"$@" 2>>"$log" &
	BROKER_PID=$!
	e2e_track "$BROKER_PID"
	if e2e_wait_for 100 e2e_broker_up "$log" "$port"; then return 0; fi
	e2e_signal 9 "$BROKER_PID"
	wait "$BROKER_PID" 2>/dev/null
	return 1
}

# The broker logs "consumers on ENDPOINT" once both sockets are bound.
e2e_broker_up() {
	e2e_alive "$BROKER_PID" || return 1
	grep -qs "consumers on tcp://127.0.0.1:$(($2 + 1))" "$1"
}

# e2e_start_broker LOG [FLAGS...]: pick ports, retrying; sets BROKER_PORT,
# PROD_EP, CONS_EP, BROKER_PID.
e2e_start_broker() {
	local log=$1 try port
	shift
	for try in $(seq 0 29); do
		port=$(e2e_pick_port "$try")
		if e2e_start_broker_at "$log" "$port" "$@"; then
			BROKER_PORT=$port
			PROD_EP=tcp://127.0.0.1:$port
			CONS_EP=tcp://127.0.0.1:$((port + 1))
			return 0
		fi
		echo "e2e: port $port busy, retrying" >>"$log"
	done
	return 1
}

# e2e_trace DIR PARAMS STEPS LOG: gen-trace versions 0..STEPS of a PARAMS
# bf16 model at 1% into DIR once, cached (written aside, then renamed:
# never half a trace); gen-trace's stderr in LOG.  Returns 1 on a failure.
e2e_trace() {
	local dir=$1 params=$2 steps=$3 log=$4
	[ -f "$dir/done" ] && return 0
	echo "$(basename "$0" .sh): gen-trace --params $params --steps $steps --density 0.01 -> $dir" >&2
	rm -rf "$dir.tmp"
	"$DC" gen-trace --params "$params" --steps "$steps" --density 0.01 -o "$dir.tmp" 2>"$log" &&
		touch "$dir.tmp/done" && rm -rf "$dir" && mv "$dir.tmp" "$dir"
}

# e2e_stamp LOG [PREFIX]: copy stdin lines to LOG as "EPOCH LINE"; with a
# PREFIX, also echo them to stdout (live progress) through e2e_show.  It must
# never stop reading: the writer would die of SIGPIPE.
e2e_stamp() {
	local log=$1 prefix=${2:-} line
	while IFS= read -r line; do
		printf '%s %s\n' "$EPOCHREALTIME" "$line" >>"$log"
		[ -n "$prefix" ] && { e2e_show "$prefix" "$line" || true; }
	done
	return 0
}

# Default live display: override in the sourcing script.
e2e_show() { printf '%-10s %s\n' "$1" "$2"; }

# e2e_last_version LOG: the newest "version V" (or "loaded version V") in a
# stamped log, or 0.
e2e_last_version() {
	local v
	v=$(sed -n 's/^[0-9.]* \(loaded \)\{0,1\}version \([0-9]*\) .*/\2/p' "$1" 2>/dev/null | tail -n 1)
	echo "${v:-0}"
}
