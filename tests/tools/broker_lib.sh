# Sourced by tests/test_broker_*.sh: start real broker processes on loopback
# ports they pick and name in their logs, run
# wire_client producers/consumers, and kill everything on exit, pass or fail.
set -u
BUILD=${DELTACAST_BUILD:-$PWD/build}
BROKER=${DELTACAST_BROKER:-$BUILD/deltacast-broker} # DELTACAST_BROKER: another build of it (an A/B)
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

# start_broker NAME [FLAGS...]: sets NAME_PROD, NAME_CONS (endpoints), NAME_PID,
# and START_FROM (the log's first line of this start).
# The broker binds ports it picks itself (tcp://127.0.0.1:*) and names them
# in its log: that line is its readiness, and no port is ever guessed.  A
# restart under the same NAME appends to the log: only lines after the
# start count.
start_broker() {
	local name=$1 log=$TMP/$1.log from pid prod cons
	shift
	touch "$log"
	from=$(($(wc -l <"$log") + 1))
	START_FROM=$from
	"$BROKER" --producers 'tcp://127.0.0.1:*' --consumers 'tcp://127.0.0.1:*' "$@" 2>>"$log" &
	pid=$!
	PIDS+=("$pid")
	wait_for 10 bound_in "$log" "$from" "$pid" || fail "broker $name did not start"
	wait_for 5 bulk_bound "$log" "$from" "$@" || fail "broker $name: no bulk listener logged"
	prod=$(tail -n +"$from" "$log" | sed -n 's/.*producers on \(tcp:[^ ]*\)$/\1/p' | tail -n 1)
	cons=$(tail -n +"$from" "$log" | sed -n 's/.*consumers on \(tcp:[^ ]*\)$/\1/p' | tail -n 1)
	eval "${name}_PROD=$prod ${name}_CONS=$cons ${name}_PID=$pid"
}

# bound_in LOG FROM PID: the broker PID (alive) logged its consumers
# endpoint at or after line FROM.
bound_in() {
	kill -0 "$3" 2>/dev/null && logged_since "$1" "$2" "consumers on tcp://"
}

# bulk_bound LOG FROM FLAGS...: with --bulk among FLAGS, the broker logged
# its bulk listener at or after line FROM, and (without --bulk-no-local)
# its unix socket or why it has none: broker_open logs these after the
# consumers endpoint.
bulk_bound() {
	local log=$1 from=$2
	shift 2
	case " $* " in *" --bulk "*) ;; *) return 0 ;; esac
	logged_since "$log" "$from" "bulk anchors on " || return 1
	case " $* " in *" --bulk-no-local "*) return 0 ;; esac
	logged_since "$log" "$from" "bulk anchors to consumers on this host\|bulk: local listener"
}

# wait_joined NAME N: broker NAME (start_broker_metrics) took N consumer
# joins since its start, re-joins and consumers that already left included
# (deltacast_consumer_joins_total; wait_consumers counts those connected now).
wait_joined() {
	wait_metric "$1" deltacast_consumer_joins_total "$2"
}

# anchor_broker NAME MODEL [FLAGS...]: MODEL (a safetensors file) must
# exist; start broker NAME with FLAGS, and publish MODEL to it as version 1
# of model "bench" (an anchor, acknowledged): what late joiners then join.
anchor_broker() {
	local name=$1 model=$2 prod
	shift 2
	[ -f "$model" ] || fail "no model $model (make bench-fanout generates it, or give one)"
	start_broker "$name" "$@"
	eval "prod=\$${name}_PROD"
	"$BUILD/tools/fault_publish" "$prod" bench 1 0 "$model" >"$TMP/pub.log" 2>&1 || fail "publish: $(cat "$TMP/pub.log")"
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

# late_takes_anchor CONS PROD MODEL V: a consumer that joins CONS (a poisoned
# model's broker or relay) now must apply v1 and nothing else (wire_client
# dies on a COMMIT whose digest differs: a poisoned version served), then,
# once PROD has published V as an anchor (need_anchor), end at V, having
# applied those two anchors only.
late_takes_anchor() {
	bg late "$WC" consume "$1" "$3" --until "$4" --timeout-ms 20000 --stats "$TMP/late.stats"
	local late=$LAST_PID
	wait_for 10 grep -qs "applied=1 " "$TMP/late.stats" || fail "the late consumer of $1 is not at v1"
	"$WC" produce "$2" "$3" --versions "$4" >"$TMP/prod$4.log" 2>&1 || fail "anchor v$4: exit $?"
	wait "$late" || fail "the late consumer of $1 exited $?: $(tail -2 "$TMP/late.err")"
	grep -q "applied=$4 versions=2 anchors=2 " "$TMP/late.stats" || fail "late: $(cat "$TMP/late.stats")"
}

# stat_of FILE KEY: a value from a wire_client --stats file.
stat_of() {
	sed -n "s/.*\b$2=\([-0-9]*\).*/\1/p" "$1" 2>/dev/null
}

# start_broker_metrics NAME [FLAGS...]: start_broker with --metrics on a free
# loopback port the broker picks and logs; sets NAME_METRICS=127.0.0.1:PORT.
start_broker_metrics() {
	local name=$1 port
	shift
	start_broker "$name" --metrics 127.0.0.1:0 "$@"
	wait_for 5 logged_since "$TMP/$name.log" "$START_FROM" "metrics on http://" ||
		fail "broker $name: no metrics listener"
	port=$(tail -n +"$START_FROM" "$TMP/$name.log" | sed -n 's|.*metrics on http://127.0.0.1:\([0-9]*\)/metrics.*|\1|p' | tail -n 1)
	eval "${name}_METRICS=127.0.0.1:$port"
}

# metric_at_least HOST:PORT SAMPLE VALUE: the broker's /metrics has SAMPLE
# (name with its labels, as printed) at VALUE or more.
metric_at_least() {
	local v
	v=$("$BUILD/deltacast" status --broker "$1" --raw 2>/dev/null | awk -v s="$2" '$1 == s {print $2}')
	[ -n "$v" ] && [ "$v" -ge "$3" ]
}

# metric_of HOST:PORT SAMPLE: SAMPLE's value on the broker's /metrics (name
# with its labels, as printed); empty when the page has no such sample.
metric_of() {
	"$BUILD/deltacast" status --broker "$1" --raw 2>/dev/null | awk -v s="$2" '$1 == s {print $2}'
}

# metrics_addr NAME: set ADDR to broker NAME's metrics address
# (start_broker_metrics), or fail.
metrics_addr() {
	eval "ADDR=\${${1}_METRICS:-}"
	[ -n "$ADDR" ] || fail "broker $1 has no metrics listener (start it with start_broker_metrics)"
}

# wait_metric NAME SAMPLE VALUE [SECONDS]: wait (10 s unless told) until
# broker NAME's SAMPLE is at VALUE or more, or fail naming what it is.
wait_metric() {
	local v
	metrics_addr "$1"
	wait_for "${4:-10}" metric_at_least "$ADDR" "$2" "$3" && return 0
	v=$(metric_of "$ADDR" "$2")
	fail "broker $1: $2 is ${v:-absent}, not $3 or more"
}

# check_metric NAME SAMPLE VALUE: broker NAME's SAMPLE is exactly VALUE
# (VALUE empty: the page has no such sample), or fail.
check_metric() {
	local v
	metrics_addr "$1"
	v=$(metric_of "$ADDR" "$2")
	[ "$v" = "$3" ] || fail "broker $1: $2 is ${v:-absent}, expected ${3:-absent}"
}

# wait_consumers NAME N: broker NAME (start_broker_metrics) has N consumers
# connected (deltacast_consumers_connected): what a test waits for before it
# publishes to consumers that must be there live.
wait_consumers() {
	wait_metric "$1" deltacast_consumers_connected "$2"
}

# consumer_at_least HOST:PORT MODEL CLIENT VERSION: the consumer named
# CLIENT (its HELLO's client name) of MODEL has VERSION or more
# (deltacast_consumer_version, any slot).
consumer_at_least() {
	local v
	v=$("$BUILD/deltacast" status --broker "$1" --raw 2>/dev/null |
		awk -v s="deltacast_consumer_version{model=\"$2\",client=\"$3\"," 'index($1, s) == 1 {print $2; exit}')
	[ -n "$v" ] && [ "$v" -ge "$4" ]
}

# wait_consumer NAME MODEL CLIENT VERSION: wait (10 s) until broker NAME
# has the consumer CLIENT of MODEL at VERSION or more: one consumer, by
# name, joined and served (not any consumer counted by the gauge).
wait_consumer() {
	metrics_addr "$1"
	wait_for 10 consumer_at_least "$ADDR" "$2" "$3" "$4" ||
		fail "broker $1: no consumer $3 of $2 at version $4: $("$BUILD/deltacast" status --broker "$ADDR" --raw | grep "^deltacast_consumer_version")"
}

# logged_since LOG FROM TEXT: TEXT is in LOG at or after line FROM.
logged_since() {
	tail -n +"$2" "$1" | grep -q "$3"
}

# small_delta OUT V FILE: `deltacast subscribe` output OUT says it applied
# version V as a delta of less than a tenth of FILE's size (the model).
small_delta() {
	local line bytes model
	line=$(grep "^version $2 " "$1") || fail "the subscriber did not apply version $2"
	echo "subscriber: $line"
	bytes=$(echo "$line" | sed -n "s/^version $2 delta bytes \([0-9]*\) .*/\1/p")
	[ -n "$bytes" ] || fail "version $2 reached the subscriber as an anchor: $line"
	model=$(stat -c %s "$3")
	[ "$bytes" -lt $((model / 10)) ] || fail "version $2 cost $bytes bytes of a $model-byte model"
}

# late_joiner CONS DIR V FILE: `deltacast subscribe` of model m from the
# consumer endpoint CONS into the new directory DIR, up to version V,
# starts from an anchor and ends with FILE's tensors.
late_joiner() {
	"${B:-$BUILD}/deltacast" subscribe --broker "$1" --model m --dir "$2" --until "$3" \
		>"$2.out" 2>"$2.err" || fail "late joiner: $(cat "$2.err")"
	grep -q '^version [0-9]* anchor' "$2.out" || fail "the late joiner got no anchor"
	same_tensors "$2/model.safetensors" "$4" || fail "the late joiner's version $3 differs"
}

# same_tensors A B: the tensors of two safetensors files are equal, byte for
# byte (metadata aside).
same_tensors() {
	"${PYTHON:-/usr/bin/python3}" - "$1" "$2" <<'PYEOF'
import json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in h.items() if k != "__metadata__"}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys() and all(a[k] == b[k] for k in a), "tensors differ"
PYEOF
}

# skip_rss_under_asan: exit 77 when the broker is an AddressSanitizer
# build: its resident memory is then mostly the sanitizer's (shadow memory,
# the quarantine of freed blocks), and no bound on the broker's own heap
# can be read from it.
skip_rss_under_asan() {
	ldd "$BROKER" 2>/dev/null | grep -q libasan || return 0
	echo "skip: $BROKER is a sanitizer build: its VmRSS is mostly ASan's shadow and quarantine"
	exit 77
}

# status_kb PID KEY: a KiB figure of /proc/PID/status (VmRSS, VmHWM).
status_kb() {
	awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"
}

# veth_up NS HOST_IF PEER_IF NET: a network namespace NS behind a veth pair,
# HOST_IF with NET.1/24 here and PEER_IF with NET.2/24 in NS (a container
# on this host).  Where they cannot be made (not root, no ip) the caller
# exits 77 with the reason; a later failure fails it.  veth_down NS
# HOST_IF removes them (the caller's EXIT trap).
veth_up() {
	local ns=$1 hif=$2 pif=$3 net=$4
	if ! ip netns add "$ns" 2>/dev/null || ! ip link add "$hif" type veth peer name "$pif" 2>/dev/null; then
		echo "SKIP: cannot make a network namespace and a veth pair (root only)"
		exit 77
	fi
	ip link set "$pif" netns "$ns" && ip addr add "$net.1/24" dev "$hif" && ip link set "$hif" up &&
		ip netns exec "$ns" ip addr add "$net.2/24" dev "$pif" &&
		ip netns exec "$ns" ip link set "$pif" up || fail "veth setup of $ns"
}

veth_down() {
	ip netns del "$1" 2>/dev/null
	ip link del "$2" 2>/dev/null
}

# trace_versions PARAMS: the three versions (safetensors files, one per
# line) of a gen-trace model of PARAMS at 1% density, made once into
# $BUILD/anchor-delta-PARAMS and kept there.
trace_versions() {
	local trace=$BUILD/anchor-delta-$1
	if [ ! -f "$trace/done" ]; then
		rm -rf "$trace.tmp"
		"$BUILD/deltacast" gen-trace --params "$1" --steps 3 --density 0.01 -o "$trace.tmp" \
			2>/dev/null || fail "gen-trace"
		touch "$trace.tmp/done" && rm -rf "$trace" && mv "$trace.tmp" "$trace"
	fi
	ls "$trace"/v000*.safetensors
}

# cpu_ns PID: CPU time of every thread of PID, ns (schedstat; a thread
# that exits while it is read is left out).
cpu_ns() {
	cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%.0f\n", s }'
}
