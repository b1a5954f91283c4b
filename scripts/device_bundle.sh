#!/usr/bin/env bash
# Put what a GPU host needs into .dev/ (ignored by git; it is copied to
# the host with the working tree), laid out as a small copy of the
# repo so that the scripts run there unchanged: .dev/build/ the programs the
# GPU tests, the GPU bench, the fan-out probes, `make bench-sync` and the
# fault suite run,
# built here (`make` first); .dev/lib/ the shared libraries they link that
# the device image lacks; .dev/scripts/ bench_sync.sh with e2e_lib.sh, its
# report and its Python consumer; .dev/python/ the binding; .dev/tests/tools/
# the fan-out probe's scripts; scripts/device_run.sh as .dev/run.sh.  Then,
# on the GPU host: `bash .dev/run.sh` (see docs/benchmarks.md, "Hosts").
# No rebuild happens there, and nothing outside .dev/ is read.
# BASE_CONSUMER=PATH: an older build of tests/tools/bench_sync_consumer,
# carried as .dev/base/ for the run's sync-base step (an A/B of the
# consumer on the same machine); BASE_PUBLISH=PATH likewise an older
# tests/tools/fault_publish, for the step sync-gpu-base (an A/B of the
# producer); BASE_BROKER=PATH an older deltacast-broker, for the step
# fanout-threads (an A/B of the broker's listeners).
# HTTP=0: no .dev/http/ (this machine's nginx and curl with the libraries
# they link, behind wrappers in .dev/bin/, for the run's bench-fanout step:
# the GPU host's image has neither).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${DELTACAST_BUILD:-build}
TOOLS=(bench_gpu_codec bench_gpu_model bench_gpu_ranges faultproxy fault_consumer fault_digest producer_reader bench_tcp fault_publish bench_sync_consumer wire_client bench_sync_floor)
TESTS=(test_gpu_codec test_consumer_gpu test_producer_gpu)
# `make all` does not relink tests/ and tools/: name each one.
make -s all "${TOOLS[@]/#/$B/tools/}" "${TESTS[@]/#/$B/tests/}"
X=$(git rev-parse --git-path info/exclude) # a worktree's is its main checkout's
grep -qx '/.dev/' "$X" 2>/dev/null || { mkdir -p "$(dirname "$X")"; echo '/.dev/' >>"$X"; }
rm -rf .dev && mkdir -p .dev/build/tests .dev/build/tools .dev/lib .dev/scripts .dev/tests/tools
cp "$B/deltacast" "$B/deltacast-broker" "$B/libdeltacast.so" .dev/build/
for t in "${TESTS[@]}"; do cp "$B/tests/$t" .dev/build/tests/; done
for t in "${TOOLS[@]}"; do cp "$B/tools/$t" .dev/build/tools/; done
# no debug sections: the working tree sent to a GPU host is at most 64 MiB
strip --strip-debug .dev/build/deltacast .dev/build/deltacast-broker .dev/build/libdeltacast.so .dev/build/tests/* .dev/build/tools/*
cp scripts/bench_sync.sh scripts/e2e_lib.sh scripts/bench_sync_report.py scripts/bench_sync_consumer.py scripts/faults.sh .dev/scripts/
cp scripts/bench_fanout.sh scripts/bench_baselines.sh scripts/bench_fanout_report.py .dev/scripts/
cp tests/tools/broker_lib.sh tests/tools/anchor_join.sh tests/tools/fanout_threads.sh .dev/tests/tools/
cp -r python .dev/python
find .dev/python -name __pycache__ -prune -exec rm -rf {} +
# every shared library but the C runtime's (the device has its own)
CRT='/(libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so'
ldd .dev/build/deltacast .dev/build/deltacast-broker .dev/build/libdeltacast.so .dev/build/tests/* .dev/build/tools/* |
	awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
	grep -Ev "$CRT" |
	while read -r l; do cp -L "$l" .dev/lib/; done
cp scripts/device_run.sh .dev/run.sh
# http_carry PROGRAM: PROGRAM and its libraries but the C runtime's in
# .dev/http/, run by a wrapper .dev/bin/NAME that sets the library path for
# it alone and execs it (the PID stays the program's).
http_carry() {
	local p n
	p=$(command -v "$1") || { echo "device_bundle: no $1 here (scripts/deps.sh bench)" >&2; return 1; }
	n=$(basename "$p")
	mkdir -p .dev/http/lib .dev/bin
	cp -L "$p" ".dev/http/$n"
	ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | grep -Ev "$CRT" |
		while read -r l; do cp -L "$l" .dev/http/lib/; done
	printf '#!/bin/sh\nd=$(dirname "$0")/../http\nLD_LIBRARY_PATH=$d/lib exec "$d/%s" "$@"\n' "$n" >".dev/bin/$n"
	chmod +x ".dev/bin/$n"
}
if [ "${HTTP:-1}" = 1 ]; then http_carry nginx && http_carry curl; fi
# The programs share most of their bytes (the library and its kernels are
# linked into each): packed with xz they travel at a fifth of their size,
# and .dev/run.sh unpacks them on the GPU host (PACK=0: not packed).
pack() {
	local d n=()
	for d in build lib http bin base; do [ ! -e ".dev/$d" ] || n+=("$d"); done
	tar -C .dev -cf - "${n[@]}" | xz -T2 -6 >.dev/payload.tar.xz
	(cd .dev && rm -rf "${n[@]}")
}
if [ -n "${BASE_CONSUMER:-}" ]; then mkdir -p .dev/base && cp "$BASE_CONSUMER" .dev/base/; fi
if [ -n "${BASE_PUBLISH:-}" ]; then mkdir -p .dev/base && cp "$BASE_PUBLISH" .dev/base/fault_publish; fi
if [ -n "${BASE_BROKER:-}" ]; then mkdir -p .dev/base && cp "$BASE_BROKER" .dev/base/deltacast-broker; fi
if [ "${PACK:-1}" = 1 ]; then pack; fi
du -sh .dev
