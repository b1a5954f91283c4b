#!/usr/bin/env bash
# A relay joins an upstream broker that holds a committed anchor (a relay
# started or restarted in a running tree): its time from its first HELLO
# to the anchor committed in its own log (both lines in the relay's log),
# and the CPU time of the upstream (every thread, from just before the
# relay starts to that commit) and of the relay (from its start), per GB
# of the anchor's payload.  Each round runs the relay twice, in turn: as
# it is (the anchor over the upstream's --bulk connection: on this host its
# unix socket, the payloads read from its files) and with
# --upstream-no-bulk (over ZeroMQ).  Medians and ranges over the rounds;
# the numbers behind docs/benchmarks.md's note on relays joining.
# Usage: [RELAY_JOIN_BULK_SEND=sendfile] [RELAY_JOIN_ARGS="--data-dir"]
#        [RELAY_JOIN_UPSTREAM_ARGS=--bulk-no-local]
#        tests/tools/relay_join.sh [ROUNDS] [SAFETENSORS]
# (RELAY_JOIN_UPSTREAM_ARGS: more upstream flags; with --bulk-no-local the
# relay connects over TCP, where RELAY_JOIN_BULK_SEND is the upstream's
# --bulk-send, default auto, which copies to a relay on its host, and
# sendfile sends as to one on another host;
# RELAY_JOIN_ARGS: the relay's flags, "--data-dir" alone a fresh data dir
# of its own each time)
# (run from the repo root after `make`; SAFETENSORS defaults to the 100M
# model bench-fanout generates, build/bench-fanout-100M/v0000.safetensors).
. "$(dirname "$0")/broker_lib.sh"

ROUNDS=${1:-5}
MODEL=${2:-$BUILD/bench-fanout-100M/v0000.safetensors}

# log_ms LOG PATTERN: the time (ms) of LOG's first line with PATTERN.
log_ms() {
	grep -m1 "$2" "$1" | awk '{ printf "%.0f\n", $1 * 1000 }'
}

# join MODE ROUND [FLAGS...]: one relay join; appends "MODE ms up_s relay_s bytes".
join() {
	local mode=$1 round=$2 log up0 up1 rc bytes pid
	shift 2
	log=$TMP/$mode$round.log
	RELAY_ARGS=${RELAY_JOIN_ARGS:-}
	[ "$RELAY_ARGS" = --data-dir ] && RELAY_ARGS="--data-dir $TMP/data-$mode$round"
	# Memory touched and freed first, as anchor_join.sh does: this VM's
	# balloon hands freed blocks back to the host, which then faults them
	# in anew at the relay's first touch.
	"$BUILD/tools/bench_tcp" "$(stat -c %s "$MODEL")" 2 warm >/dev/null || fail "bench_tcp warm"
	up0=$(cpu_ns "$u_PID")
	start_broker "$mode$round" --upstream "$u_CONS" --upstream-model bench "$@" $RELAY_ARGS
	eval "pid=\$${mode}${round}_PID"
	wait_for 60 grep -q "model bench: version 1 committed" "$log" || fail "$mode: no anchor in 60 s"
	up1=$(cpu_ns "$u_PID")
	rc=$(cpu_ns "$pid")
	bytes=$(sed -n 's/.*model bench: version 1 committed (anchor, [0-9]* chunks, \([0-9]*\) bytes).*/\1/p' "$log")
	grep -q "relay bench: version 1 came over the bulk connection" "$log" && [ "$mode" = nobulk ] &&
		fail "--upstream-no-bulk took a bulk connection"
	[ "$mode" = bulk ] && ! grep -q "came over the bulk connection" "$log" && fail "bulk: over ZeroMQ"
	echo "$mode $(($(log_ms "$log" "model bench: version 1 committed") - $(log_ms "$log" "HELLO to"))) \
$(((up1 - up0) / 1000)) $((rc / 1000)) $bytes" >>"$TMP/rows"
	stop_broker "$mode$round"
}

anchor_broker u "$MODEL" --bulk 127.0.0.1:0 --bulk-send "${RELAY_JOIN_BULK_SEND:-auto}" --data-dir "$TMP/u" \
	${RELAY_JOIN_UPSTREAM_ARGS:-}
sync
for r in $(seq "$ROUNDS"); do
	join bulk "$r"
	join nobulk "$r" --upstream-no-bulk
done
stop_broker u
/usr/bin/python3 - "$TMP/rows" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
def cell(vals, f):
    return f"{f(statistics.median(vals))} [{f(min(vals))}..{f(max(vals))}]"
print("| anchor to a joining relay | relay's HELLO to its commit, ms | upstream CPU per GB, s | relay CPU per GB, s |")
print("| --- | --- | --- | --- |")
for mode, what in (("bulk", "over the upstream's --bulk (the default)"), ("nobulk", "over ZeroMQ (--upstream-no-bulk)")):
    rs = [r for r in rows if r[0] == mode]
    gb = [int(r[4]) / 1e9 for r in rs]
    ms = [int(r[1]) for r in rs]
    up = [int(r[2]) / 1e6 / g for r, g in zip(rs, gb)]
    rl = [int(r[3]) / 1e6 / g for r, g in zip(rs, gb)]
    print(f"| {what} | {cell(ms, lambda v: f'{v:.0f}')} | {cell(up, lambda v: f'{v:.3f}')} | {cell(rl, lambda v: f'{v:.3f}')} |")
print(f"({len(rows) // 2} rounds, {int(rows[0][4])} payload bytes)")
EOF
