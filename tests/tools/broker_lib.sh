# Sourced by tests/test_broker_*.sh: start real broker processes on loopback
# ports chosen from the test's PID (retrying on a bind failure), run
# wire_client producers/consumers, and kill everything on exit, pass or fail.
set -u
BUILD=${DELTACAST_BUILD:-$PWD/build}
BROKER=$BUILD/deltacast-broker
WC=$BUILD/tools/wire_client
TMP=$(mktemp -d /tmp/dcast-broker-test.XXXXXX)
PIDS=()

cleanup() {
	for p in "${PIDS[@]}"; do
		kill -CONT "$p" 2>/dev/null
		kill -9 "$p" 2>/dev/null
	done
	wait 2>/dev/null
	[ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"
}
trap cleanup EXIT

fail() {
	echo "FAIL: $*" >&2
	for f in "$TMP"/*.log "$TMP"/*.err; do
		[ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }
	done >&2
	exit 1
}

# wait_for SECONDS COMMAND...: poll until COMMAND succeeds.
wait_for() {
	local n=$(($1 * 20)); shift
	for _ in $(seq "$n"); do "$@" && return 0; sleep 0.05; done
	return 1
}

# start_broker NAME [FLAGS...]: sets NAME_PROD, NAME_CONS (endpoints), NAME_PID.
start_broker() {
	local name=$1 try port pid
	shift
	for try in $(seq 0 19); do
		port=$((10000 + (($$ * 13 + try * 7919 + RANDOM) % 10000) * 2))
		"$BROKER" --producers "tcp://127.0.0.1:$port" --consumers "tcp://127.0.0.1:$((port + 1))" \
			"$@" 2>>"$TMP/$name.log" &
		pid=$!
		# The line names this try's port: a restart under the same NAME
		# appends to a log that already holds the earlier start's line.
		if wait_for 5 grep -qs "consumers on tcp://127.0.0.1:$((port + 1))\$" "$TMP/$name.log" &&
			kill -0 "$pid" 2>/dev/null; then
			PIDS+=("$pid")
			eval "${name}_PROD=tcp://127.0.0.1:$port ${name}_CONS=tcp://127.0.0.1:$((port + 1)) ${name}_PID=$pid"
			return 0
		fi
		kill -9 "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
		echo "port $port busy, retrying" >>"$TMP/$name.log"
	done
	fail "broker $name did not start"
}

# stop_broker NAME: SIGTERM, expect exit 0 (a clean shutdown).
stop_broker() {
	local pid
	eval "pid=\$${1}_PID"
	kill -TERM "$pid"
	wait "$pid" || fail "broker $1 exited $? on SIGTERM"
}

# bg NAME CMD...: run CMD in the background, output in $TMP/NAME.{out,err}; sets LAST_PID.
bg() {
	local name=$1
	shift
	"$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
	LAST_PID=$!
	PIDS+=("$LAST_PID")
}

# stat_of FILE KEY: a value from a wire_client --stats file.
stat_of() {
	sed -n "s/.*\b$2=\([-0-9]*\).*/\1/p" "$1" 2>/dev/null
}

# start_broker_metrics NAME [FLAGS...]: start_broker with --metrics on a free
# loopback port (retrying on a taken one); sets NAME_METRICS=127.0.0.1:PORT.
start_broker_metrics() {
	local name=$1 try port pid
	shift
	for try in $(seq 0 19); do
		port=$((30000 + (($$ * 7 + try * 131 + RANDOM) % 20000)))
		start_broker "$name" --metrics "127.0.0.1:$port" "$@"
		wait_for 5 grep -qs "metrics on" "$TMP/$name.log" && break
		eval "pid=\$${name}_PID"
		kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; : >"$TMP/$name.log"
	done
	grep -qs "metrics on" "$TMP/$name.log" || fail "broker $name: no free metrics port"
	eval "${name}_METRICS=127.0.0.1:$port"
}
