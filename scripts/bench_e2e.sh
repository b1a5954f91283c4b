#!/usr/bin/env bash
# `make bench`: time for a version to reach BENCH_CONSUMERS consumers on this
# machine, for the same gen-trace versions, over
#   delta   deltacast deltas, one version at a time as every baseline runs
#           (tests/tools/fault_publish paced: an anchor, then deltas);
#   pipelined  deltacast deltas from one `deltacast publish` of every version;
#   anchor  deltacast full anchors (one `deltacast publish` per version);
#   http    nginx serving each version's patch file to curl + `deltacast apply`;
#   redis   the same patch bytes over Redis pub/sub (tests/tools/bench_redis);
#   fs      the whole checkpoint through a shared folder, reloaded by each;
#   tcp     raw TCP loopback (tests/tools/bench_tcp): the model's bytes, and
#           the delta's bytes, to every consumer at once: the ceiling.
# BENCH_ROWS=delta,http,... runs some of them (and prints only).  Consumers
# of the deltacast rows are `deltacast subscribe` processes; the others are
# in scripts/bench_baselines.sh.  Writes the table between the bench-e2e
# markers of docs/benchmarks.md and PNGs into docs/plots/ (BENCH_DOC=0:
# print only; BENCH_KEEP=1 keeps the logs' folder).  Every server runs on loopback from a mktemp folder, and
# every process started here is killed on exit.
set -u
. "$(dirname "$0")/e2e_lib.sh"
. "$(dirname "$0")/bench_baselines.sh"

PARAMS=${BENCH_PARAMS:-100M}
NVER=${BENCH_VERSIONS:-6}
NCONS=${BENCH_CONSUMERS:-4}
REPEATS=${BENCH_REPEATS:-3}
ALL_ROWS=delta,pipelined,anchor,http,redis,fs,tcp
ROWS=,${BENCH_ROWS:-$ALL_ROWS},
DOC=${BENCH_DOC:-$E2E_ROOT/docs/benchmarks.md}
PLOTS=$(dirname "$DOC")/plots
[ "$ROWS" = ",$ALL_ROWS," ] || DOC=0
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
REDIS_SERVER=$(command -v redis-server || echo /usr/bin/redis-server)
REDIS_CLI=$(command -v redis-cli || echo /usr/bin/redis-cli)
ROOT=$(mktemp -d "${TMPDIR:-/tmp}/deltacast-bench.XXXXXX")
trap 'bench_stop_servers; e2e_cleanup; [ "${BENCH_KEEP:-0}" = 1 ] && echo "bench: kept $ROOT" >&2 || rm -rf "$ROOT"' EXIT
trap 'exit 130' INT TERM
die() { echo "bench: FAILED: $*" >&2; exit 1; }
want() { [[ $ROWS == *",$1,"* ]]; }

# The command that reproduces one row (non-default settings included).
row_cmd() {
	local env=""
	[ "$PARAMS" = 100M ] || env+=" BENCH_PARAMS=$PARAMS"
	[ "$NVER" = 6 ] || env+=" BENCH_VERSIONS=$NVER"
	[ "$NCONS" = 4 ] || env+=" BENCH_CONSUMERS=$NCONS"
	[ "$REPEATS" = 3 ] || env+=" BENCH_REPEATS=$REPEATS"
	echo "\`make bench BENCH_ROWS=$1$env\`"
}

# Start the broker and NCONS `deltacast subscribe` consumers under DIR.
start_deltacast() {
	local d=$1 i
	mkdir -p "$d"
	e2e_start_broker "$d/broker.log" --heartbeat-ms 5000 || die "no broker"
	for ((i = 1; i <= NCONS; i++)); do
		echo "$EPOCHREALTIME start" >"$d/c$i.events"
		"$DC" subscribe --broker "$CONS_EP" --model bench --dir "$d/c$i" --until "$NVER" \
			> >(e2e_stamp "$d/c$i.log") 2>>"$d/c$i.err" &
		e2e_track $!
	done
}

# wait_deltacast DIR V: until every consumer has applied V.
wait_deltacast() {
	local i deadline=$((SECONDS + 120))
	for ((i = 1; i <= NCONS; i++)); do
		while [ "$(e2e_last_version "$1/c$i.log")" -lt "$2" ]; do
			[ $SECONDS -lt $deadline ] || die "$1: c$i stuck at $(e2e_last_version "$1/c$i.log")"
			sleep 0.02
		done
	done
}

# bench_deltacast DIR MODE: one version at a time, as the baselines run:
# delta (fault_publish, paced by a line per version: an anchor, then deltas)
# or anchor (one `deltacast publish` per version).  Writes the logs of
# scripts/bench_baselines.sh from the subscribers' lines.
bench_deltacast() {
	local d=$1 mode=$2 v i go pub
	start_deltacast "$d"
	if [ "$mode" = delta ]; then
		mkfifo "$d/go"
		"$BUILD/tools/fault_publish" "$PROD_EP" bench 1 -1 "${FILES[@]}" <"$d/go" >"$d/producer.log" 2>&1 &
		pub=$!
		e2e_track $pub
		exec {go}>"$d/go"
	fi
	for ((v = 1; v <= NVER; v++)); do
		bench_stamp "$v" "$d/start.log"
		if [ "$mode" = delta ]; then
			(echo go >&$go) 2>/dev/null || die "fault_publish is gone (see $d/producer.log)"
		else
			"$DC" publish --broker "$PROD_EP" --model bench --first-version "$v" "${FILES[v - 1]}" \
				2>>"$d/producer.log" || die "publish $v"
		fi
		wait_deltacast "$d" "$v"
	done
	[ "$mode" = delta ] && { exec {go}>&-; wait "$pub" || die "fault_publish (see $d/producer.log)"; }
	for ((i = 1; i <= NCONS; i++)); do
		awk '$2 == "version" { print $3, $1 }' "$d/c$i.log" >"$d/c$i.done"
		awk '$2 == "version" { print $3, $6 }' "$d/c$i.log" >>"$d/bytes.log"
	done
	e2e_cleanup
}

# bench_pipelined DIR: one `deltacast publish` of every version, as a user
# runs it; e2e_report.py times each version without its queueing.
bench_pipelined() {
	local d=$1
	start_deltacast "$d"
	"$DC" publish --broker "$PROD_EP" --model bench "${FILES[@]}" 2> >(e2e_stamp "$d/producer.log") ||
		die "publish"
	wait_deltacast "$d" "$NVER"
	sleep 0.2
	e2e_cleanup
	"$PY" "$E2E_ROOT/scripts/e2e_report.py" bench "$d" || die "report pipelined"
}

# row NAME FUNCTION ARGS...: run FUNCTION in a subshell that cleans up after
# itself on any exit; its stdout is the row's JSON.  Its files go under
# RUN, removed after the row (BENCH_KEEP=1: kept).
row() {
	local name=$1
	shift
	echo "bench: round $REP/$REPEATS: $name" >&2
	RUN=$ROOT/round$REP
	mkdir -p "$RUN"
	("$@") >>"$ROOT/rows.jsonl" || exit 1
	[ "${BENCH_KEEP:-0}" = 1 ] || rm -rf "$RUN"
}

# pipelined_row NAME (bench_pipelined in this shell, so a failure cleans up).
pipelined_row() {
	bench_pipelined "$RUN/pipelined" >"$RUN/pipelined.json" &&
		"$PY" "$REPORT" deltacast "$NCONS" "$1" "$(row_cmd pipelined)" "$RUN/pipelined" <"$RUN/pipelined.json"
}
deltacast_row() { # MODE NAME
	bench_deltacast "$RUN/$1" "$1" >&2 &&
		"$PY" "$REPORT" baseline "$RUN/$1" "$2" "$(row_cmd "$1")"
}
baseline_row() { # KIND NAME
	"bench_$1" "$RUN/$1" >&2 && "$PY" "$REPORT" baseline "$RUN/$1" "$2" "$(row_cmd "$1")"
}
# tcp_row BYTES NAME: bench_tcp three times.
tcp_row() {
	local s=() k
	for k in 1 2 3; do s+=("$("$BUILD/tools/bench_tcp" "$1" "$NCONS" | awk '{print $2}')") || die "bench_tcp"; done
	"$PY" "$REPORT" tcp $(($1 * NCONS)) "$2" "\`build/tools/bench_tcp $1 $NCONS\`" "${s[@]}"
}
trap_row() { trap 'bench_stop_servers; e2e_cleanup' EXIT; "$@"; }

# A copy of the programs, so a rebuild during the run cannot swap them.
snapshot_build() {
	mkdir -p "$ROOT/bin/tools" &&
		cp "$DC" "$BROKER_BIN" "$ROOT/bin/" &&
		cp "$BUILD/tools/bench_tcp" "$BUILD/tools/bench_redis" "$BUILD/tools/bench_fs" \
			"$BUILD/tools/fault_publish" "$ROOT/bin/tools/" ||
		die "programs missing in $BUILD (run make first)"
	BUILD=$ROOT/bin DC=$ROOT/bin/deltacast BROKER_BIN=$ROOT/bin/deltacast-broker
}

REPORT=$E2E_ROOT/scripts/bench_report.py
snapshot_build
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "bench: $PARAMS params, $NVER versions, $NCONS consumers, $REPEATS rounds of ${ROWS:1:-1}" >&2
"$DC" gen-trace --params "$PARAMS" --steps $((NVER - 1)) --density 0.01 -o "$ROOT/trace" \
	2>"$ROOT/gentrace.log" || die "gen-trace"
FILES=()
for ((k = 0; k < NVER; k++)); do FILES+=("$(printf '%s/v%04d.safetensors' "$ROOT/trace" "$k")"); done
MODEL_BYTES=$(stat -c %s "${FILES[0]}")

# One round: every row once, in order.
round() {
	want delta && row "deltacast deltas" trap_row deltacast_row delta "deltacast deltas"
	want pipelined && row "deltacast deltas, pipelined" trap_row pipelined_row \
		"deltacast deltas, pipelined (one \`deltacast publish\` of all versions)"
	want anchor && row "deltacast full anchors" trap_row deltacast_row anchor "deltacast full anchors"
	want http && row "HTTP (nginx) patch files" trap_row baseline_row http "HTTP (nginx) patch files, curl + apply"
	want redis && row "Redis pub/sub" trap_row baseline_row redis "Redis pub/sub of the patch, apply"
	want fs && row "shared filesystem" trap_row baseline_row fs "shared filesystem, whole checkpoint reloaded"
	want tcp || return 0
	row "raw TCP, full model" trap_row tcp_row "$MODEL_BYTES" "raw TCP loopback, full model (ceiling)"
	DELTA_BYTES=$("$PY" "$REPORT" delta-bytes "$ROOT/rows.jsonl" "$NCONS")
	[ "$DELTA_BYTES" -gt 0 ] &&
		row "raw TCP, delta bytes" trap_row tcp_row "$DELTA_BYTES" "raw TCP loopback, delta bytes (ceiling)"
	return 0
}

# Rounds interleave the rows, so a burst of load from elsewhere on the
# machine spreads over all of them.
for ((REP = 1; REP <= REPEATS; REP++)); do round; done

META=$(printf '%s bf16 parameters (%.1f MiB), %d versions at 1%% density (gen-trace), %d consumers, one %d-core VM, loopback; load average %s at the start, %s at the end.  The whole table and both plots: %s, %d s.' \
	"$PARAMS" "$(awk -v b="$MODEL_BYTES" 'BEGIN { print b / 1048576 }')" "$NVER" "$NCONS" "$(nproc)" "$LOAD0" \
	"$(cut -d' ' -f1-3 /proc/loadavg)" "$(row_cmd "$ALL_ROWS" | sed 's/ BENCH_ROWS=[^ `]*//')" "$SECONDS")
if [ "$DOC" = 0 ]; then
	"$PY" "$REPORT" table "$ROOT/rows.jsonl" "$META"
else
	"$PY" "$REPORT" table "$ROOT/rows.jsonl" "$META" "$DOC" "$PLOTS" || die "report"
	echo "bench: wrote $DOC and $PLOTS/bench_e2e_{time,bytes}.png" >&2
fi
