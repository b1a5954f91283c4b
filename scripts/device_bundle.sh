#!/usr/bin/env bash
# Put what a lent GPU machine needs into .dev/ (ignored by git; the device
# tool carries it with `carry: [".dev"]`): the programs the GPU tests, the
# GPU bench and the fan-out probes run, built here (`make` first), with the
# shared libraries they link that the device image lacks, and
# scripts/device_run.sh.  Then, with the device tool: `bash .dev/run.sh`
# (see docs/benchmarks.md, "On a GPU host").  No rebuild happens there.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${DELTACAST_BUILD:-build}
make -s "$B/tools/bench_gpu_codec" "$B/tools/producer_reader" "$B/tools/bench_tcp" \
	"$B/tools/fault_publish" "$B/tools/bench_sync_consumer" "$B/tools/wire_client" all
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.dev/' >>.git/info/exclude; }
rm -rf .dev && mkdir -p .dev/build/tests .dev/build/tools .dev/lib
cp "$B/deltacast" "$B/deltacast-broker" .dev/build/
cp "$B"/tests/test_gpu_codec "$B"/tests/test_consumer_gpu "$B"/tests/test_producer_gpu .dev/build/tests/
for t in bench_gpu_codec producer_reader bench_tcp fault_publish bench_sync_consumer wire_client; do
	cp "$B/tools/$t" .dev/build/tools/
done
# every shared library but the C runtime's (the device has its own)
ldd .dev/build/deltacast .dev/build/deltacast-broker .dev/build/tests/* .dev/build/tools/* |
	awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
	grep -Ev '/(libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
	while read -r l; do cp -L "$l" .dev/lib/; done
cp scripts/device_run.sh .dev/run.sh
du -sh .dev
