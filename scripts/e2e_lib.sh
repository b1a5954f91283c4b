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

# e2e_stat PID: E2E_STAT, the fields of /proc/PID/stat after the command
# name: [0] the state, [1] the parent's PID, [19] the start time (clock
# ticks after boot).  Returns 1 when no process has that number.
e2e_stat() {
	local s
	E2E_STAT=()
	read -r s 2>/dev/null <"/proc/$1/stat" || return 1
	read -ra E2E_STAT <<<"${s##*) }"
}

# e2e_alive PID: PID, tracked by e2e_track, is still the process it was
# then (a zombie not reaped yet counts), not another that took its number
# after it exited (pid_max can be 32768, and the machine is shared).
e2e_alive() {
	[ -n "${1:-}" ] && [ -n "${E2E_START[$1]:-}" ] && e2e_stat "$1" && [ "${E2E_STAT[19]}" = "${E2E_START[$1]}" ]
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

# e2e_ended PID: the tracked PID has exited: it is a zombie (Z, or X
# while it is reaped), or no longer e2e_alive.
e2e_ended() {
	! e2e_alive "$1" || [[ ${E2E_STAT[0]} == [ZX] ]]
}

# e2e_waitable PID: bash's `wait PID` returns at once, as PID is no child
# of this shell that has yet to exit.  Without job control bash waits in
# wait4(-1) until some child exits, and a stop is no exit: a wait on a
# stopped child, or on a reaped process's number that a stopped child has
# taken since, never returns.
e2e_waitable() {
	e2e_stat "$1" || return 0
	[[ ${E2E_STAT[0]} == [ZX] ]] || [ "${E2E_STAT[1]}" != "$BASHPID" ]
}

# e2e_reap STEP PID [TENTHS]: collect the tracked PID once it has exited;
# its exit status in E2E_RC (127 when bash no longer has it: its number
# went to another child).  A stopped PID is sent SIGCONT first, or it
# could never exit.  `wait` runs only when e2e_waitable, so it cannot
# block.  When PID has not exited after TENTHS tenths of a second (default
# 100), prints "e2e: STEP: pid PID (COMMAND) did not end within S s" on
# stderr and returns 1.
e2e_reap() {
	local step=$1 pid=$2 n=${3:-100} comm
	E2E_RC=127
	[ -n "$pid" ] || return 0 # a role whose process was forgotten (e2e_reused)
	e2e_signal CONT "$pid"
	# (bash reports the other killed jobs while it polls: they are expected)
	if ! e2e_wait_for "$n" e2e_ended "$pid" 2>/dev/null; then
		read -r comm 2>/dev/null <"/proc/$pid/comm" || comm=?
		echo "e2e: $step: pid $pid ($comm) did not end within $((n / 10)).$((n % 10)) s" >&2
		return 1
	fi
	e2e_waitable "$pid" || return 0
	E2E_RC=0
	wait "$pid" 2>/dev/null || E2E_RC=$?
}

# e2e_kill STEP PID...: SIGKILL each PID that is e2e_alive, then e2e_reap
# each (E2E_RC: the last one's status).  Returns 1 when one did not end.
e2e_kill() {
	local step=$1 p rc=0
	shift
	e2e_signal 9 "$@"
	for p in "$@"; do e2e_reap "$step" "$p" || rc=1; done
	return $rc
}

# e2e_cleanup: e2e_kill every tracked PID, and forget them.  Returns 1
# when one did not end (its line on stderr).
e2e_cleanup() {
	local rc=0
	e2e_kill cleanup "${E2E_PIDS[@]}" || rc=1
	E2E_PIDS=()
	E2E_START=()
	return $rc
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
# e2e_alive.  When PID's number was tracked before for another process
# (which has exited since), calls e2e_reused PID first.
e2e_track() {
	local old=${E2E_START[$1]:-}
	E2E_PIDS+=("$1")
	E2E_START[$1]=
	e2e_stat "$1" && E2E_START[$1]=${E2E_STAT[19]}
	[ -z "$old" ] || [ "$old" = "${E2E_START[$1]}" ] || e2e_reused "$1"
	return 0
}

# e2e_reused PID: a new process has the number of a tracked one that has
# exited; whatever still names that number as the old process names a
# stranger now (call e2e_track before naming the new process).
# Default: nothing; override in the sourcing script.
e2e_reused() { :; }

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
	e2e_track "$!"
	BROKER_PID=$!
	if e2e_wait_for 100 e2e_broker_up "$log" "$port"; then return 0; fi
	e2e_kill "broker on port $port did not come up" "$BROKER_PID"
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
