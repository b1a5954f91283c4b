#!/usr/bin/env bash
# Runs on a GPU host as .dev/run.sh (scripts/device_bundle.sh makes
# .dev/, a small copy of the repo: build/, lib/, scripts/, python/,
# tests/tools/, bin/ and http/; nothing outside .dev/ is read).  Steps, in this order, each
# in its own process under a time limit, a failing one recorded and the next
# run anyway:
#   gpu      the machine, the three GPU tests, `make bench-gpu`'s program,
#            tests/tools/bench_gpu_ranges (the producer's device encode
#            per range against whole tensors)
#   gpu-tests the three GPU tests alone
#   bench-fanout `make bench-fanout` on this host's cores, print only, with
#            the nginx and curl that scripts/device_bundle.sh carries in
#            .dev/bin (N's FANOUT_N, default "1 4 16"; FANOUT_RUNS_N1
#            rounds at N = 1, default 7; FANOUT_LIMIT s, default 270); its
#            cells and meta in fanout-cells.tgz
#   pause    the device pause alone, a few minutes at most: test_gpu_codec
#            (the batch kernels against their CPU twin), test_consumer_gpu
#            (decode-ahead, a wrong digest refused before READY, an apply
#            cut off halfway undone from the device undo buffer, 8-byte
#            values), `make bench-gpu`'s two programs: bench_gpu_codec,
#            whose last line is
#            `gpu_pause_gbps P decode_ahead_gbps D encode_gbps E copy_gbps C`
#            (1% density), copied to pause-line.txt, and bench_gpu_ranges;
#            then bench_gpu_codec again with the batch's payloads in
#            compact v2 (BENCH_GPU_COMPACT2=1), its last line appended
#   model    bench_gpu_model, the device path on a 7B-shaped model (13.5 GB
#            of bf16 in chunks of 1M elements): encode, decode-ahead (v1
#            and v2) and the pause per density, first on 2 of its 32 layers
#            (a quick check that it runs), then whole; its last line
#            `gpu_pause_gbps P decode_ahead_gbps D encode_gbps E copy_gbps C`
#            copied to model-line.txt
#   sync     `make bench-sync` on this host's cores: forms
#            SYNC_FORMS ("lib sub"), N's SYNC_N ("1 4 8"), the --data-dir row
#            (SYNC_DATADIR=1); its logs (no model files) in sync-logs.tgz
#   sync-gpu bench-sync's library form (N's SYNC_N) with the producer's
#            tensors and baseline in CUDA memory, as a trainer's are
#            (fault_publish FAULT_PUBLISH_DEVICE=1); logs in sync-gpu-logs.tgz
#   sync-base the library form again with the bench_sync_consumer in
#            base/ (scripts/device_bundle.sh's BASE_CONSUMER: an older
#            build of it, for an A/B of the consumer on one host); logs
#            in sync-base-logs.tgz
#   sync-gpu-base sync-gpu again with the fault_publish in base/
#            (BASE_PUBLISH: an A/B of the producer); sync-gpu-base-logs.tgz
#   fanout   an anchor to N joining consumers (raw TCP, the broker to
#            receive-only joiners, library joiners until READY); N's: NS
#   sync-gpu-batch sync-gpu once per DELTACAST_DEVICE_BATCH_ELEMS in
#            BATCH_ELEMS, the producer's debug lines in publish.err
#   sync-gpu-cons bench-sync's device form (gpu): the producer's and the
#            consumers' tensors in CUDA memory (apply into the GPU)
#   fanout-threads 16 receive-only joiners of an anchor, the broker with 8
#            I/O threads: each thread's share of the sending and the time
#            (tests/tools/fanout_threads.sh), 3 runs, alternating with the
#            broker in base/ when there is one (BASE_BROKER: the listeners'
#            A/B)
#   bulk-ab  the 100M anchor over --bulk (TCP, --bulk-no-local, a data dir)
#            to N's BULK_N (default "4 16") library joiners until READY
#            (tests/tools/anchor_join.sh) and to as many receive-only ones
#            (tests/tools/fanout_threads.sh), 3 rounds, alternating with
#            the broker in base/ (BASE_BROKER): an A/B of the broker's bulk
#            sending on this host's cores
#   faults-gpu the fault suite (scripts/faults.sh) with the producer's
#            tensors and baseline in CUDA memory (FAULT_PUBLISH_DEVICE=1):
#            FAULT_SEEDS trials (default 20) from FAULT_SEED_BASE
#   sync-py  bench-sync's Python-binding form (same N's, no --data-dir row),
#            if a python3 there imports numpy; logs in sync-py-logs.tgz
# STEPS picks (default "gpu sync sync-gpu fanout sync-py"); DEADLINE (370 s): no step
# runs past it, and one that would get under 30 s is skipped.  Each step's
# own limit: gpu 240 s (a failing test_consumer_gpu spends ~110 s in the
# consumer's rejoin back-off), sync 200 s, sync-gpu and sync-base 120 s, fanout and
# sync-py 75 s.  On an H200 host (2026-11-26) gpu, sync, fanout and sync-py
# took 150 + 42 + 19 + 17 s.  PARAMS (100M)
# sizes the model of sync and fanout; BARGS: flags for fanout's brokers.
# The pause step's limit is 240 s; `STEPS=pause bash .dev/run.sh` runs it alone.
# Output: STEP.txt and steps.txt (each step's rc and seconds) in $OUT.
# bench_sync_report.py needs only python3's standard library; with no
# python3 there the logs still come back (the table is made from them
# afterwards, `scripts/bench_sync_report.py table DIR 0`).
set -u
cd "$(dirname "$0")" || exit 1
D=$PWD
# scripts/device_bundle.sh packs the programs: unpacked once, here.
if [ ! -d build ] && [ -f payload.tar.xz ]; then
	tar -xJf payload.tar.xz 2>/dev/null ||
		python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(".")' payload.tar.xz ||
		{ echo "run.sh: cannot unpack payload.tar.xz" >&2; exit 1; }
fi
export LD_LIBRARY_PATH=$D/lib DELTACAST_BUILD=$D/build PYTHONDONTWRITEBYTECODE=1
B=$DELTACAST_BUILD
O=${OUT:-/tmp/devout}
mkdir -p "$O"
export BARGS=${BARGS:-} PARAMS=${PARAMS:-100M}
# gen-trace's versions: outside .dev/, so that a rehearsal does not make
# .dev/ (what is copied to the GPU host) 1.4 GB bigger.
export SYNC_TRACE=${SYNC_TRACE:-${TMPDIR:-/tmp}/dev-bench-sync-$PARAMS-6}

# A python3 for bench_sync_report.py (standard library only): PYTHON, else
# the first python3 on PATH, else /usr/bin/python3; none: a stand-in that
# answers delta-bytes with awk and leaves the table for later.
pick_python() {
	local p
	for p in ${PYTHON:-} python3 /usr/bin/python3; do
		command -v "$p" >/dev/null 2>&1 && "$p" -c 'import statistics' 2>/dev/null && { command -v "$p"; return; }
	done
	cat >"${TMPDIR:-/tmp}/dev-nopy" <<'EOF'
#!/bin/sh
case $2 in
delta-bytes) awk '{ for (k = 3; k < NF; k += 2) if ($k == "payload_bytes") print $(k + 1) }' "$3/floor.log" |
	sort -n | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print int((a[NR / 2] + a[NR / 2 + 1]) / 2) }' ;;
table) echo "(no python3 here: make the table from the logs, scripts/bench_sync_report.py table DIR 0)" ;;
*) exit 1 ;;
esac
EOF
	chmod +x "${TMPDIR:-/tmp}/dev-nopy"
	echo "${TMPDIR:-/tmp}/dev-nopy"
}

gpu_tests() {
	echo "== GPU tests"
	for t in test_gpu_codec test_consumer_gpu test_producer_gpu; do
		echo "-- $t"; timeout 120 "$B/tests/$t"; echo "rc=$?"
	done
}

gpu() {
	echo "== machine"
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
	echo "cpus $(nproc), kernel $(uname -r), $(grep MemTotal /proc/meminfo), $(python3 --version 2>&1) at $(command -v python3)"
	nvidia-smi 2>&1 | head -20
	echo "== libraries not found"
	ldd "$B/deltacast" "$B/deltacast-broker" "$B/libdeltacast.so" "$B"/tests/* "$B"/tools/* | grep "not found"
	gpu_tests
	echo "== bench_gpu_codec"; timeout 200 "$B/tools/bench_gpu_codec"; echo "rc=$?"
	echo "== bench_gpu_ranges"; timeout 60 "$B/tools/bench_gpu_ranges"; echo "rc=$?"
}

pause() {
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
	for t in test_gpu_codec test_consumer_gpu; do
		echo "-- $t"; timeout 60 "$B/tests/$t"; echo "rc=$?"
	done
	echo "-- test_gpu_codec, the ranges' encode in one pass"
	DELTACAST_CUDA_ONE_PASS=1 timeout 60 "$B/tests/test_gpu_codec"; echo "rc=$?"
	echo "== bench_gpu_codec"
	timeout 100 "$B/tools/bench_gpu_codec" | tee "$O/pause-bench.txt"
	echo "rc=${PIPESTATUS[0]}"
	echo "== bench_gpu_ranges"; timeout 60 "$B/tools/bench_gpu_ranges"; echo "rc=$?"
	grep '^gpu_pause_gbps ' "$O/pause-bench.txt" | tail -n 1 | tee "$O/pause-line.txt"
	echo "== bench_gpu_codec, the batch's payloads in compact v2"
	BENCH_GPU_COMPACT2=1 timeout 100 "$B/tools/bench_gpu_codec" | tee "$O/pause-bench-v2.txt"
	echo "rc=${PIPESTATUS[0]}"
	grep '^gpu_pause_gbps ' "$O/pause-bench-v2.txt" | tail -n 1 | tee -a "$O/pause-line.txt"
}

model() {
	echo "== bench_gpu_model, 2 layers"
	BENCH_GPU_MODEL_LAYERS=2 timeout 60 "$B/tools/bench_gpu_model" || { echo "rc=$?"; return 1; }
	echo "== bench_gpu_model"
	timeout 200 "$B/tools/bench_gpu_model" | tee "$O/model-bench.txt"
	echo "rc=${PIPESTATUS[0]}"
	grep '^gpu_pause_gbps ' "$O/model-bench.txt" | tail -n 1 | tee "$O/model-line.txt"
}

# bench_sync NAME FORMS DATADIR: scripts/bench_sync.sh, its logs (without
# the consumers' folders and models) in $O/NAME-logs.tgz.
bench_sync() {
	local name=$1 py tmp root
	py=$(pick_python)
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/dev-$name.XXXXXX")
	echo "== bench-sync: forms $2, N ${SYNC_N:-1 4 8}, --data-dir row $3, $PARAMS, $(nproc) cores, python $py"
	TMPDIR=$tmp PYTHON=$py BENCH_SYNC_PARAMS=$PARAMS BENCH_SYNC_N="${SYNC_N:-1 4 8}" BENCH_SYNC_FORMS="$2" \
		BENCH_SYNC_DATADIR=$3 BENCH_SYNC_DOC=0 BENCH_SYNC_KEEP=1 BENCH_SYNC_TRACE=$SYNC_TRACE \
		bash scripts/bench_sync.sh
	local rc=$?
	echo "bench_sync.sh rc=$rc"
	for root in "$tmp"/deltacast-bench-sync.*; do
		[ -d "$root" ] || continue
		(cd "$root" && find . -type f \( -name '*.log' -o -name '*.err' -o -name config -o -name meta \) \
			-not -path './bin/*' -not -path './*/c[0-9]*/*' -not -path '*/broker-data/*' |
			tar -czf "$O/$name-logs.tgz" -T -)
		echo "logs: $name-logs.tgz ($(du -h "$O/$name-logs.tgz" | cut -f1))"
		rm -rf "$root"
	done
	rmdir "$tmp" 2>/dev/null
	return $rc
}

sync_lib() { bench_sync sync "${SYNC_FORMS:-lib sub}" "${SYNC_DATADIR:-1}"; }

# base_build PROGRAM: a copy of the build with .dev/base/PROGRAM (an older
# build of it, scripts/device_bundle.sh's BASE_CONSUMER or BASE_PUBLISH) in
# its tools/; prints its path.
base_build() {
	local b=${TMPDIR:-/tmp}/dev-build-base-$1
	[ -x "$D/base/$1" ] || { echo "== skipped, no base/$1" >&2; return 3; }
	rm -rf "$b" && cp -r "$B" "$b" && cp "$D/base/$1" "$b/tools/" && echo "$b"
}

sync_base() {
	local b
	b=$(base_build bench_sync_consumer) || return
	DELTACAST_BUILD=$b bench_sync sync-base lib 0
}

sync_gpu() {
	export FAULT_PUBLISH_DEVICE=1
	bench_sync sync-gpu lib 0
}

# sync-gpu-batch: sync-gpu once per DELTACAST_DEVICE_BATCH_ELEMS in
# BATCH_ELEMS, the producer's debug lines (batches, first chunk, ACK) in
# each publish.err.
sync_gpu_batch() {
	local e
	export FAULT_PUBLISH_DEVICE=1 BENCH_SYNC_PUBLISH_ENV=DELTACAST_LOG=debug
	for e in ${BATCH_ELEMS:-8388608 33554432 134217728}; do
		DELTACAST_DEVICE_BATCH_ELEMS=$e bench_sync "sync-gpu-b$e" lib 0
	done
}

# sync-gpu-cons: bench-sync's device form (gpu): the producer's tensors and
# every consumer's in CUDA memory: apply into the GPU.
sync_gpu_cons() {
	bench_sync sync-gpu-cons gpu 0
}

sync_gpu_base() {
	local b
	b=$(base_build fault_publish) || return
	export FAULT_PUBLISH_DEVICE=1
	DELTACAST_BUILD=$b bench_sync sync-gpu-base lib 0
}

faults_gpu() {
	echo "== the fault suite, producer on the GPU, $(nproc) cores"
	FAULT_PUBLISH_DEVICE=1 SEEDS=${FAULT_SEEDS:-20} FAULT_SEED_BASE=${FAULT_SEED_BASE:-9100} \
		PYTHON=$(pick_python) bash scripts/faults.sh
}

sync_py() {
	local py
	py=$(pick_python)
	if ! DELTACAST_LIB=$B/libdeltacast.so PYTHONPATH=$D/python "$py" -c 'import numpy, deltacast' 2>&1; then
		echo "== sync-py: skipped, $py cannot import numpy and the binding"
		return 3
	fi
	bench_sync sync-py py 0
}

# recv_run N MODEL: the broker to N consumers that only receive.
recv_run() {
	bash -c '. tests/tools/broker_lib.sh
	start_broker s $BARGS
	"$BUILD/tools/fault_publish" "$s_PROD" bench 1 0 "$2" >"$TMP/pub.log" 2>&1 || fail publish
	sync; t0=$(date +%s%N); P=()
	for i in $(seq "$1"); do
		"$WC" receive "$s_CONS" bench --until 1 --window 16777216 --timeout-ms 60000 >"$TMP/r$i.log" 2>&1 &
		P+=($!)
	done
	for p in "${P[@]}"; do wait "$p" || fail "receiver exited $?"; done
	cat "$TMP"/r*.log | awk -v t0="$t0" -v n="$1" '\''$1 == "received" {
		for (k = 1; k < NF; k++) if ($k == "t_ns" && $(k + 1) > m) m = $(k + 1) }
		END { printf "recv n=%d: last at %.0f ms\n", n, (m - t0) / 1e6 }'\''
	stop_broker s' _ "$1" "$2"
}

# The anchor of fanout's runs: bench-sync's first version, else one made.
anchor_model() {
	if [ -f "$SYNC_TRACE/done" ]; then
		echo "$SYNC_TRACE/v0000.safetensors"
		return
	fi
	rm -rf "${TMPDIR:-/tmp}/dev-trace"
	timeout 90 "$B/deltacast" gen-trace --params "$PARAMS" --steps 0 --density 0.01 -o "${TMPDIR:-/tmp}/dev-trace" >/dev/null 2>&1
	echo "${TMPDIR:-/tmp}/dev-trace/v0000.safetensors"
}

fanout_threads() {
	local m n=${FT_N:-16} k
	m=$(anchor_model)
	echo "== $n receive-only joiners, broker --io-threads 8, $(nproc) cores; model $(stat -c %s "$m") bytes"
	for k in 1 2 3; do
		[ -x "$D/base/deltacast-broker" ] && echo "base: $(DELTACAST_BROKER=$D/base/deltacast-broker \
			FANOUT_THREADS_BROKER_ARGS="--io-threads 8" timeout 60 bash tests/tools/fanout_threads.sh "$n" "$m" | tail -n 1)"
		echo "this: $(FANOUT_THREADS_BROKER_ARGS="--io-threads 8" timeout 60 bash tests/tools/fanout_threads.sh "$n" "$m" | tail -n 1)"
	done
}

# bulk_ab_one NAME N MODEL [BROKER]: one library join and one receive-only
# join over --bulk, with BROKER (DELTACAST_BROKER) when given.
bulk_ab_one() {
	local a="--bulk 127.0.0.1:0 --bulk-no-local --data-dir ${TMPDIR:-/tmp}/dev-bulk-ab" lib recv
	rm -rf "${TMPDIR:-/tmp}/dev-bulk-ab"
	lib=$(DELTACAST_BROKER=${4:-} ANCHOR_JOIN_BROKER_ARGS="$a" timeout 60 bash tests/tools/anchor_join.sh "$2" "$3" 2>&1 |
		awk '/^broker: cpu/ { c = $3 } /READY at/ { v = $5 + 0; if (v > m) m = v } END { printf "last READY %d ms, broker cpu %s ms", m, c }')
	rm -rf "${TMPDIR:-/tmp}/dev-bulk-ab"
	recv=$(DELTACAST_BROKER=${4:-} FANOUT_THREADS_BROKER_ARGS="$a" FANOUT_THREADS_RECV_ARGS="--bulk 1" \
		timeout 60 bash tests/tools/fanout_threads.sh "$2" "$3" | tail -n 1)
	rm -rf "${TMPDIR:-/tmp}/dev-bulk-ab"
	echo "$1 n=$2 lib: $lib; recv: $recv"
}

bulk_ab() {
	local m n k
	m=$(anchor_model)
	echo "== the anchor over --bulk to N joiners, $(nproc) cores; model $(stat -c %s "$m") bytes"
	for n in ${BULK_N:-4 16}; do
		for k in 1 2 3; do
			[ -x "$D/base/deltacast-broker" ] && bulk_ab_one base "$n" "$m" "$D/base/deltacast-broker"
			bulk_ab_one this "$n" "$m"
		done
	done
}

fanout() {
	echo "== an anchor to N joining consumers, $(nproc) cores, broker flags: ${BARGS:-none}"
	local m n
	m=$(anchor_model)
	echo "model $(stat -c %s "$m") bytes"
	for n in ${NS:-1 4 16}; do
		for _ in 1 2 3; do echo "raw_tcp n=$n: $("$B/tools/bench_tcp" "$(stat -c %s "$m")" "$n")"; done
		for _ in 1 2 3; do recv_run "$n" "$m"; done
		for _ in 1 2 3; do
			ANCHOR_JOIN_BROKER_ARGS="$BARGS" timeout 60 bash tests/tools/anchor_join.sh "$n" "$m" 2>&1 |
				awk -v n="$n" '/READY at/ { v = $5 + 0; if (v > m) m = v } END { printf "lib n=%d: last READY at %d ms\n", n, m }'
		done
	done
}

# bench-fanout: `make bench-fanout` on this host's cores (print only), with
# the nginx and curl of .dev/bin (scripts/device_bundle.sh); N's FANOUT_N,
# FANOUT_RUNS_N1 rounds at N = 1, under FANOUT_LIMIT seconds; its cells and
# meta (the report's input: scripts/bench_fanout_report.py DIR 0) in
# fanout-cells.tgz, whatever it got to.
bench_fanout() {
	local tmp=${TMPDIR:-/tmp}/dev-fanout root rc
	rm -rf "$tmp" && mkdir -p "$tmp"
	echo "== make bench-fanout: $(nproc) cores, N ${FANOUT_N:-1 4 16}"
	PATH=$D/bin:$PATH TMPDIR=$tmp PYTHON=$(pick_python) BENCH_FANOUT_DOC=0 BENCH_FANOUT_KEEP=1 \
		BENCH_FANOUT_N="${FANOUT_N:-1 4 16}" BENCH_FANOUT_RUNS_N1=${FANOUT_RUNS_N1:-7} \
		timeout -k 5 "${FANOUT_LIMIT:-270}" bash scripts/bench_fanout.sh
	rc=$?
	echo "bench_fanout.sh rc=$rc"
	for root in "$tmp"/deltacast-bench-fanout.*; do
		[ -f "$root/cells.log" ] && tar -czf "$O/fanout-cells.tgz" -C "$root" cells.log $(cd "$root" && ls meta 2>/dev/null)
	done
	rm -rf "$tmp"
	return $rc
}

# `run.sh step NAME`: one step (the process the time limit ends).
if [ "${1:-}" = step ]; then
	case $2 in
	gpu) gpu ;;
	gpu-tests) gpu_tests ;;
	bench-fanout) bench_fanout ;;
	pause) pause ;;
	model) model ;;
	sync) sync_lib ;;
	sync-py) sync_py ;;
	sync-gpu) sync_gpu ;;
	sync-base) sync_base ;;
	sync-gpu-base) sync_gpu_base ;;
	faults-gpu) faults_gpu ;;
	sync-gpu-batch) sync_gpu_batch ;;
	sync-gpu-cons) sync_gpu_cons ;;
	fanout) fanout ;;
	fanout-threads) fanout_threads ;;
	bulk-ab) bulk_ab ;;
	*) echo "no step $2"; exit 2 ;;
	esac
	exit
fi

DEADLINE=${DEADLINE:-370}
declare -A CAP=([gpu]=240 [gpu-tests]=200 [bench-fanout]=285 [pause]=240 [model]=270 [sync]=200 [sync-gpu]=120 [sync-base]=120 [sync-gpu-base]=120 [faults-gpu]=240 [sync-gpu-batch]=150 [sync-gpu-cons]=120 [fanout]=75 [fanout-threads]=120 [bulk-ab]=240 [sync-py]=75)
{
	echo "start $(date -u +%FT%TZ), $(nproc) cpus, steps: ${STEPS:-gpu sync sync-gpu fanout sync-py}, deadline ${DEADLINE} s"
	nvidia-smi -L 2>&1
} | tee "$O/steps.txt"
for s in ${STEPS:-gpu sync sync-gpu fanout sync-py}; do
	[ "$s" = gpu ] && [ -n "${SKIP_GPU:-}" ] && continue
	left=$((DEADLINE - SECONDS))
	lim=${CAP[$s]:-120}
	[ "$lim" -le "$left" ] || lim=$left
	if [ "$lim" -lt 30 ]; then
		echo "step $s: skipped, ${left} s left" | tee -a "$O/steps.txt"
		continue
	fi
	t0=$SECONDS
	timeout -k 5 "$lim" bash "$D/run.sh" step "$s" 2>&1 | tee "$O/$s.txt"
	rc=${PIPESTATUS[0]}
	echo "step $s: rc=$rc in $((SECONDS - t0)) s (limit $lim s)$([ "$rc" = 124 ] && echo ', TIMED OUT')" | tee -a "$O/steps.txt"
done
echo "done in $SECONDS s" | tee -a "$O/steps.txt"
