#!/usr/bin/env bash
# `make bench-sync`: how long a 1% delta takes to reach N
# consumers that already hold every version before it, against raw TCP and
# against the codec's compute floor, and what each consumer hashes and
# writes per version.  One run, side by side:
#   - gen-trace versions of a bf16 model, an anchor then deltas (cached in
#     $BUILD/bench-sync-PARAMS-K); the first two deltas after the anchor are
#     warm-ups, not counted (the consumers seal the anchor's file meanwhile);
#   - per N and consumer form, first the row's references: the compute
#     floor (tests/tools/bench_sync_floor: encode + decode and scatter of
#     each delta, one thread) and raw TCP loopback (tests/tools/bench_tcp)
#     of the delta's payload bytes and of the whole model file to N
#     receivers, median of 3; then a real broker, the paced producer
#     tests/tools/fault_publish and N consumers, each version published
#     once all N have applied the one before (and, after the first
#     warm-up delta, once each holds the anchor's file).  Forms: lib
#     (tests/tools/bench_sync_consumer, the C library, default options), py
#     (scripts/bench_sync_consumer.py, the Python binding), sub
#     (`deltacast subscribe`), gpu (the device form: the producer's tensors
#     and baseline in CUDA memory, as a trainer's, and every consumer's
#     tensors bound to CUDA memory, as a rollout worker's; lib's consumer
#     otherwise; left out, with a line saying so, where no CUDA device is).
# scripts/bench_sync_report.py turns the logs into the table and the
# targets, and rewrites the bench-sync section of the doc.
# Knobs (environment):
#   BENCH_SYNC_PARAMS (100M)  BENCH_SYNC_N ("1 4 8")  BENCH_SYNC_VERSIONS (5 deltas)
#   BENCH_SYNC_QUICK=1        10M and N = "1 4", print only
#   BENCH_SYNC_FORMS ("lib py sub gpu")  BENCH_SYNC_DATADIR (1: one more lib row,
#                             N = 4, broker with --data-dir)
#   BENCH_SYNC_SUBSCRIBE_ARGS extra `deltacast subscribe` flags (e.g. --fold-every 16)
#   BENCH_SYNC_BROKER_ARGS    extra broker flags (e.g. --cut-through)
#   BENCH_SYNC_DOC            the doc to rewrite (docs/benchmarks.md; 0: print only)
#   BENCH_SYNC_TRACE          the trace folder;  BENCH_SYNC_KEEP=1 keeps the logs
# Every process started here is killed on any exit.
set -u
. "$(dirname "$0")/e2e_lib.sh"

QUICK=${BENCH_SYNC_QUICK:-0}
if [ "$QUICK" = 1 ]; then DEF_PARAMS=10M DEF_N="1 4" DEF_DOC=0; else DEF_PARAMS=100M DEF_N="1 4 8" DEF_DOC=$E2E_ROOT/docs/benchmarks.md; fi
PARAMS=${BENCH_SYNC_PARAMS:-$DEF_PARAMS}
NS=${BENCH_SYNC_N:-$DEF_N}
NDELTA=${BENCH_SYNC_VERSIONS:-5}
WARM=2 # deltas sent after the anchor and not counted: the consumers seal the anchor's file after the first,
       # and the second is the first whose bytes written are measured from after that seal
STEPS=$((WARM + NDELTA))
FORMS=${BENCH_SYNC_FORMS:-lib py sub gpu}
DATADIR_ROW=${BENCH_SYNC_DATADIR:-1}
SUB_ARGS=${BENCH_SYNC_SUBSCRIBE_ARGS:-}
BROKER_ARGS=${BENCH_SYNC_BROKER_ARGS:-}
DOC=${BENCH_SYNC_DOC:-$DEF_DOC}
TRACE=${BENCH_SYNC_TRACE:-$BUILD/bench-sync-$PARAMS-$STEPS}
ROOT=$(mktemp -d "${TMPDIR:-/tmp}/deltacast-bench-sync.XXXXXX")
REPORT=$E2E_ROOT/scripts/bench_sync_report.py
NEVER=1000000 # --until for consumers: they run until killed, so /proc stays readable
trap 'e2e_cleanup; [ "${BENCH_SYNC_KEEP:-0}" = 1 ] && echo "bench-sync: kept $ROOT" >&2 || rm -rf "$ROOT"' EXIT
trap 'exit 130' INT TERM
die() { echo "bench-sync: FAILED: $*" >&2; exit 1; }
say() { echo "bench-sync: $*" >&2; }

# The command that reproduces this run (non-default settings included).
run_cmd() {
	local env=""
	[ "$QUICK" = 1 ] && env+=" BENCH_SYNC_QUICK=1"
	[ "$PARAMS" = "$DEF_PARAMS" ] || env+=" BENCH_SYNC_PARAMS=$PARAMS"
	[ "$NS" = "$DEF_N" ] || env+=" BENCH_SYNC_N=\"$NS\""
	[ "$NDELTA" = 5 ] || env+=" BENCH_SYNC_VERSIONS=$NDELTA"
	[ "$FORMS" = "lib py sub gpu" ] || env+=" BENCH_SYNC_FORMS=\"$FORMS\""
	[ "$DATADIR_ROW" = 1 ] || env+=" BENCH_SYNC_DATADIR=$DATADIR_ROW"
	[ -z "$SUB_ARGS" ] || env+=" BENCH_SYNC_SUBSCRIBE_ARGS=\"$SUB_ARGS\""
	[ -z "$BROKER_ARGS" ] || env+=" BENCH_SYNC_BROKER_ARGS=\"$BROKER_ARGS\""
	echo "make bench-sync$env"
}

# gen-trace once per size (written aside, then renamed: never half a trace).
make_trace() {
	e2e_trace "$TRACE" "$PARAMS" "$STEPS" "$ROOT/gentrace.log" || die "gen-trace (see $ROOT/gentrace.log)"
	FILES=()
	for ((k = 0; k <= STEPS; k++)); do FILES+=("$(printf '%s/v%04d.safetensors' "$TRACE" "$k")"); done
	MODEL_BYTES=$(stat -c %s "${FILES[0]}")
}

# refs DIR N: the references of one row, measured just before it so that
# both see the same load on this shared machine: the compute floor
# (DIR/floor.log) and raw TCP to N receivers, 3 runs each of the delta's
# bytes and the model's (DIR/tcp.log).
refs() {
	local d=$1 n=$2 bytes kind k s
	"$BIN/tools/bench_sync_floor" "${FILES[@]:WARM}" >"$d/floor.log" || die "bench_sync_floor"
	for kind in delta model; do
		[ $kind = delta ] && bytes=$DELTA_BYTES || bytes=$MODEL_BYTES
		for k in 1 2 3; do
			s=$("$BIN/tools/bench_tcp" "$bytes" "$n" | awk '{ print $2 }') || die "bench_tcp $bytes $n"
			echo "tcp $kind $n $bytes $s" >>"$d/tcp.log"
		done
	done
}

# stamp_io PID: copy stdin lines as "T_US WRITE_BYTES LINE", T_US the
# CLOCK_REALTIME microseconds when the line arrived, WRITE_BYTES PID's
# write_bytes from /proc/PID/io at that moment.
stamp_io() {
	local pid=$1 line t k v wb
	while IFS= read -r line; do
		t=$EPOCHREALTIME wb=0
		while read -r k v; do [ "$k" = write_bytes: ] && wb=$v; done <"/proc/$pid/io" 2>/dev/null
		printf '%s %s %s\n' "${t/./}" "$wb" "$line"
	done
	return 0
}

# start_consumer FORM DIR I: consumer I of DIR, its lines in DIR/cI.log.
start_consumer() {
	local form=$1 d=$2 i=$3 pid
	case $form in
	lib) "$BIN/tools/bench_sync_consumer" "$CONS_EP" bench "$d/c$i" $NEVER >"$d/c$i.log" 2>"$d/c$i.err" & ;;
	gpu) BENCH_SYNC_CONSUMER_DEVICE=1 "$BIN/tools/bench_sync_consumer" "$CONS_EP" bench "$d/c$i" $NEVER \
		>"$d/c$i.log" 2>"$d/c$i.err" & ;;
	py) DELTACAST_LIB=$BIN/libdeltacast.so "$PY" "$E2E_ROOT/scripts/bench_sync_consumer.py" \
		"$CONS_EP" bench "$d/c$i" $NEVER >"$d/c$i.log" 2>"$d/c$i.err" & ;;
	sub)
		mkfifo "$d/c$i.out"
		# shellcheck disable=SC2086 # SUB_ARGS: extra flags, split on spaces
		"$DC" subscribe --broker "$CONS_EP" --model bench --dir "$d/c$i" --until $NEVER $SUB_ARGS \
			>"$d/c$i.out" 2>"$d/c$i.err" &
		pid=$!
		e2e_track "$pid"
		stamp_io "$pid" <"$d/c$i.out" >"$d/c$i.log" &
		;;
	esac
	CPIDS+=($!)
	e2e_track $!
}

# applied LOG V: LOG has a line for version V, either form of line (bash
# builtins only: the polling must not load the 2 cores it measures).
applied() {
	local w
	while read -r -a w; do
		[ "${w[0]:-}" = applied ] && [ "${w[1]:-}" = "$2" ] && return 0
		[ "${w[2]:-}" = version ] && [ "${w[3]:-}" = "$2" ] && return 0
	done <"$1"
	return 1
}

# wait_all DIR V PUB: until every consumer has applied V (any one dying
# fails, and so does the publisher PUB exiting before V's ACK).
# Naps on a FIFO nobody writes (read -t), not on a sleep process.
wait_all() {
	local d=$1 v=$2 pub=$3 i deadline=$((SECONDS + 600))
	for ((i = 1; i <= ${#CPIDS[@]}; i++)); do
		until applied "$d/c$i.log" "$v"; do
			kill -0 "${CPIDS[i - 1]}" 2>/dev/null || die "$d: consumer $i exited ($(tail -n 2 "$d/c$i.err"))"
			kill -0 "$pub" 2>/dev/null || grep -q "^acked $v " "$d/publish.log" ||
				die "$d: fault_publish exited before version $v ($(tail -n 2 "$d/publish.err"))"
			[ $SECONDS -lt $deadline ] || die "$d: consumer $i has no version $v after 600 s"
			read -r -t 0.02 -u "$NAP"
		done
	done
}

# start_run DIR FORM N DATADIR(0|1): the broker and N consumers of FORM;
# CPIDS their PIDs.
start_run() {
	local d=$1 form=$2 n=$3 dd=$4 i flags=(--heartbeat-ms 5000)
	[ "$dd" = 1 ] && flags+=(--data-dir "$d/broker-data")
	# shellcheck disable=SC2206 # flags split on blanks, as on a command line
	flags+=($BROKER_ARGS)
	e2e_start_broker "$d/broker.log" "${flags[@]}" || die "no broker (see $d/broker.log)"
	CPIDS=()
	for ((i = 1; i <= n; i++)); do start_consumer "$form" "$d" "$i"; done
}

# folded DIR: every consumer's checkpoint holds a model file and none is
# being written (the anchor's seal, or a fold, in the background, is done).
folded() {
	local i c
	for ((i = 1; i <= ${#CPIDS[@]}; i++)); do
		c=$1/c$i
		[ -f "$c/model.safetensors" ] && [ ! -e "$c/model.safetensors.fold" ] &&
			[ ! -e "$c/model.safetensors.tmp" ] && [ ! -e "$c/model.safetensors.applied" ] || return 1
	done
}

# publish_paced DIR FORM: the paced producer publishes every file, each once all
# consumers have applied the one before; the counted deltas once the
# anchor's seals are done too (their writes are the anchor's, not a delta's).
publish_paced() {
	local d=$1 v go pub deadline=$((SECONDS + 600)) penv=${BENCH_SYNC_PUBLISH_ENV:-}
	[ "$2" = gpu ] && penv+=" FAULT_PUBLISH_DEVICE=1"
	mkfifo "$d/go"
	# shellcheck disable=SC2086 # penv: VAR=VALUE words for the producer alone
	env $penv "$BIN/tools/fault_publish" "$PROD_EP" bench 1 -1 "${FILES[@]}" <"$d/go" \
		>"$d/publish.log" 2>"$d/publish.err" &
	pub=$!
	e2e_track $pub
	exec {go}>"$d/go"
	for ((v = 1; v <= STEPS + 1; v++)); do
		(echo go >&$go) 2>/dev/null || die "fault_publish is gone ($(cat "$d/publish.err"))"
		wait_all "$d" "$v" "$pub"
		while [ "$v" = 2 ] && ! folded "$d"; do
			[ $SECONDS -lt $((deadline)) ] || die "$d: the anchor's files not sealed after 600 s"
			read -r -t 0.02 -u "$NAP"
		done
	done
	exec {go}>&-
	wait $pub || die "fault_publish ($(cat "$d/publish.err"))"
}

# run_config FORM N DATADIR(0|1): one row: its references, then the run in
# ROOT/FORM-nN-ddDATADIR.
run_config() {
	local form=$1 n=$2 dd=$3 d=$ROOT/$1-n$2-dd$3
	mkdir -p "$d"
	say "$form consumers, N=$n$([ "$dd" = 1 ] && echo ', broker --data-dir')"
	refs "$d" "$n"
	start_run "$d" "$form" "$n" "$dd"
	publish_paced "$d" "$form"
	e2e_cleanup
	printf 'form %s\nn %s\ndatadir %s\n' "$form" "$n" "$dd" >"$d/config"
	[ "${BENCH_SYNC_KEEP:-0}" = 1 ] || rm -rf "$d"/c*/ "$d/broker-data"
}

# The device form only where a CUDA device is (nvidia-smi lists one).
device_forms() {
	[[ " $FORMS " == *" gpu "* ]] || return 0
	nvidia-smi -L 2>/dev/null | grep -q '^GPU' && return 0
	say "form gpu left out: no CUDA device here"
	FORMS=$(echo " $FORMS " | sed 's/ gpu / /; s/^ *//; s/ *$//')
}

main() {
	local n form
	device_forms
	e2e_snapshot "$ROOT" bench_tcp bench_sync_floor fault_publish bench_sync_consumer ||
		die "programs missing in $BUILD (run make)"
	mkfifo "$ROOT/nap" && exec {NAP}<>"$ROOT/nap" || die "nap fifo"
	LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
	make_trace
	"$BIN/tools/bench_sync_floor" "${FILES[@]:WARM}" >"$ROOT/floor.log" || die "bench_sync_floor"
	DELTA_BYTES=$("$PY" "$REPORT" delta-bytes "$ROOT") || die "delta bytes"
	say "delta payload $DELTA_BYTES bytes, model file $MODEL_BYTES bytes"
	for n in $NS; do
		for form in $FORMS; do run_config "$form" "$n" 0; done
	done
	if [ "$DATADIR_ROW" = 1 ]; then
		n=4
		[[ " $NS " == *" 4 "* ]] || n=${NS%% *}
		run_config lib "$n" 1
	fi
	printf 'params %s\nmodel_bytes %s\nversions %s\nwarmup %s\ncpus %s\nload_start %s\nload_end %s\nseconds %s\ncommand %s\n' \
		"$PARAMS" "$MODEL_BYTES" "$NDELTA" "$WARM" "$(nproc)" "$LOAD0" "$(cut -d' ' -f1-3 /proc/loadavg)" \
		"$SECONDS" "$(run_cmd)" >"$ROOT/meta"
	"$PY" "$REPORT" table "$ROOT" "$DOC" || die "report"
}

main
