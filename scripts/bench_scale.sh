#!/usr/bin/env bash
# `make bench-scale`: a generated model as large as this machine allows
# through a broker with --data-dir to 2 workers, and what each process
# costs in memory and disk.  One run:
#   - gen-trace of BENCH_SCALE_PARAMS bf16 parameters (default 1B), an
#     anchor and 4 steps at ~1% (cached in $BUILD/bench-scale-PARAMS);
#   - a broker with --data-dir and 2 `deltacast subscribe` workers
#     (--fold-every 2, so that their directories fold during the run);
#   - one producer process (tests/tools/fault_publish) publishes versions
#     1-4 (the anchor, then deltas), each once both workers applied the one
#     before, and ends;
#   - a new producer process, `deltacast publish` with no other flag (as a
#     sidecar runs it), publishes version 5: it fetches version 4 as its
#     baseline from the consumer endpoint the broker names, so the workers
#     receive a delta although this producer never sent one before;
#   - meanwhile each worker directory's size is sampled (du, every 0.2 s).
# scripts/bench_scale_report.py prints the table and rewrites the
# bench-scale section of docs/benchmarks.md: each version's time to both
# workers and wire bytes per worker, each process's peak RSS (VmHWM) over
# the model, each worker directory's peak over the model, and the
# restarted producer's version against the deltas of the first one.
# Its last line: `restart_wire_over_delta R broker_hwm_over_model S
# worker_dir_peak_over_model T`.
# Knobs: BENCH_SCALE_PARAMS (1B), BENCH_SCALE_DOC (docs/benchmarks.md; 0:
# print only), BENCH_SCALE_KEEP=1 keeps the logs and directories.
# Every process started here is killed on any exit.
set -u
. "$(dirname "$0")/e2e_lib.sh"

PARAMS=${BENCH_SCALE_PARAMS:-1B}
STEPS=4
DOC=${BENCH_SCALE_DOC:-$E2E_ROOT/docs/benchmarks.md}
TRACE=$BUILD/bench-scale-$PARAMS
ROOT=$(mktemp -d "${TMPDIR:-/tmp}/deltacast-bench-scale.XXXXXX")
NEVER=1000000
trap 'e2e_cleanup; [ "${BENCH_SCALE_KEEP:-0}" = 1 ] && echo "bench-scale: kept $ROOT" >&2 || rm -rf "$ROOT"' EXIT
trap 'exit 130' INT TERM
die() { echo "bench-scale: FAILED: $*" >&2; exit 1; }
say() { echo "bench-scale: $*" >&2; }

make_trace() {
	e2e_trace "$TRACE" "$PARAMS" "$STEPS" "$ROOT/gentrace.log" || die "gen-trace (see $ROOT/gentrace.log)"
	FILES=()
	for ((k = 0; k <= STEPS; k++)); do FILES+=("$(printf '%s/v%04d.safetensors' "$TRACE" "$k")"); done
	MODEL_BYTES=$(stat -c %s "${FILES[0]}")
}

# hwm PID: its peak resident set (VmHWM), KiB.
hwm() { awk '/^VmHWM/ { print $2 }' "/proc/$1/status"; }

# applied LOG V: LOG (stamped) has worker's line for version V.
applied() {
	local w
	while read -r -a w; do
		[ "${w[1]:-}" = version ] && [ "${w[2]:-}" = "$2" ] && return 0
	done <"$1"
	return 1
}

# wait_all V: both workers applied V (one dying fails).
wait_all() {
	local v=$1 i deadline=$((SECONDS + 1800))
	for i in 1 2; do
		until applied "$ROOT/w$i.log" "$v"; do
			kill -0 "${WPIDS[i - 1]}" 2>/dev/null || die "worker $i exited ($(tail -n 2 "$ROOT/w$i.err"))"
			[ $SECONDS -lt $deadline ] || die "worker $i has no version $v after 1800 s"
			read -r -t 0.05 -u "$NAP"
		done
	done
}

# sample_dirs: each worker directory's size in bytes (blocks on disk),
# every 0.2 s, as "T W1 W2" lines, until killed.
sample_dirs() {
	local a b
	while :; do
		a=$(du -sB1 "$ROOT/w1" 2>/dev/null | cut -f1)
		b=$(du -sB1 "$ROOT/w2" 2>/dev/null | cut -f1)
		echo "$EPOCHREALTIME ${a:-0} ${b:-0}"
		read -r -t 0.2 -u "$NAP"
	done
}

start_workers() {
	local i pid
	WPIDS=()
	for i in 1 2; do
		mkfifo "$ROOT/w$i.out" && : >"$ROOT/w$i.log"
		"$DC" subscribe --broker "$CONS_EP" --model scale --dir "$ROOT/w$i" --until $NEVER --fold-every 2 \
			>"$ROOT/w$i.out" 2>"$ROOT/w$i.err" &
		pid=$!
		e2e_track "$pid"
		WPIDS+=("$pid")
		e2e_stamp "$ROOT/w$i.log" <"$ROOT/w$i.out" &
		e2e_track $!
	done
}

# publish_first: versions 1-4 from one producer process, paced.
publish_first() {
	local v go pub
	mkfifo "$ROOT/go"
	FAULT_PUBLISH_ACK_WAIT_MS=1800000 /usr/bin/time -f '%M' -o "$ROOT/producer1.maxrss" \
		"$BIN/tools/fault_publish" "$PROD_EP" scale 1 -1 \
		"${FILES[@]:0:4}" <"$ROOT/go" >"$ROOT/publish.log" 2>"$ROOT/publish.err" &
	pub=$!
	e2e_track $pub
	exec {go}>"$ROOT/go"
	for v in 1 2 3 4; do
		say "version $v"
		(echo go >&$go) 2>/dev/null || die "fault_publish is gone ($(cat "$ROOT/publish.err"))"
		wait_all "$v"
	done
	exec {go}>&-
	wait $pub || die "fault_publish ($(cat "$ROOT/publish.err"))"
	echo "hwm producer1 $(cat "$ROOT/producer1.maxrss")" >>"$ROOT/hwm.log"
}

# publish_restarted: version 5 from a new producer process that fetches
# its baseline from the broker.
publish_restarted() {
	say "version 5, a new producer process (baseline fetched from the broker)"
	echo "start5 $EPOCHREALTIME" >>"$ROOT/publish.log"
	/usr/bin/time -f '%M' -o "$ROOT/producer2.maxrss" "$DC" publish --broker "$PROD_EP" \
		--model scale --first-version 5 "${FILES[4]}" 2> >(e2e_stamp "$ROOT/publish2.log") ||
		die "publish of version 5 ($(tail -n 3 "$ROOT/publish2.log"))"
	echo "hwm producer2 $(cat "$ROOT/producer2.maxrss")" >>"$ROOT/hwm.log"
	wait_all 5
}

# settle: both workers' folds done (no fold file left), then every peak.
settle() {
	local i deadline=$((SECONDS + 600))
	for i in 1 2; do
		while [ -e "$ROOT/w$i/model.safetensors.fold" ] || [ -e "$ROOT/w$i/model.safetensors.applied" ]; do
			[ $SECONDS -lt $deadline ] || die "worker $i still folding after 600 s"
			read -r -t 0.2 -u "$NAP"
		done
	done
	echo "hwm broker $(hwm "$BROKER_PID")" >>"$ROOT/hwm.log"
	for i in 1 2; do echo "hwm worker$i $(hwm "${WPIDS[i - 1]}")" >>"$ROOT/hwm.log"; done
	echo "broker_data $(du -sB1 "$ROOT/broker-data" | cut -f1)" >>"$ROOT/hwm.log"
}

main() {
	local sampler
	e2e_snapshot "$ROOT" fault_publish || die "build the tools first (make bench-scale)"
	mkfifo "$ROOT/nap" && exec {NAP}<>"$ROOT/nap" || die "nap fifo"
	make_trace
	say "model $MODEL_BYTES bytes; $(nproc) CPUs; logs in $ROOT"
	e2e_start_broker "$ROOT/broker.log" --data-dir "$ROOT/broker-data" --heartbeat-ms 10000 ||
		die "no broker (see $ROOT/broker.log)"
	mkdir -p "$ROOT/w1" "$ROOT/w2"
	sample_dirs >"$ROOT/du.log" &
	sampler=$!
	e2e_track $sampler
	start_workers
	publish_first
	publish_restarted
	settle
	kill $sampler 2>/dev/null
	"$DC" delta "${FILES[3]}" "${FILES[4]}" -o "$ROOT/ref.patch" >/dev/null 2>&1 || die "deltacast delta"
	echo "patch $(stat -c %s "$ROOT/ref.patch")" >>"$ROOT/hwm.log"
	"$PY" "$E2E_ROOT/scripts/bench_scale_report.py" "$ROOT" "$MODEL_BYTES" "$PARAMS" "$DOC"
}

main "$@"
