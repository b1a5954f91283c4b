#!/usr/bin/env bash
# scripts/bench_fanout.sh at its smallest (a 1M model, N = 1 and 4, one run
# per cell, print only): every cell carries its receivers' and its sender's
# CPU seconds, more than 0, and the last line is
#   intake_cpu_over_tcp R broker_cpu_over_nginx S fanout_over_raw_tcp_n1 T
# with finite ratios, and the targets table has a row for each of the
# targets in CPU per byte and for N = 1 against raw TCP, and the
# references with the broker at --bulk-send sendfile (the libsf column)
# and over its unix socket (liblocal),
# against the disk column (its cells: a time, no CPU), against raw TCP
# from the file through a 1 MiB buffer to keeping receivers (keepread),
# against receivers that do the library's work alone (check), and the
# library's time and CPU counted from its open() (every lib cell has both:
# its exec's CPU, more than 0 and less than the whole); and bench_tcp's
# check mode names a directory it cannot write into and leaves none of its
# files behind.  Needs nginx and
# curl (`scripts/deps.sh bench`).
set -u
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$NGINX" ] && command -v curl >/dev/null ||
	{ echo "SKIP: no nginx or curl (scripts/deps.sh bench installs them)"; exit 77; }
out=$(mktemp /tmp/dcast-test-fanout-XXXXXX)
root=""
trap 'rm -f "$out"; [ -z "$root" ] || rm -rf $root' EXIT
BENCH_FANOUT_PARAMS=1M BENCH_FANOUT_N="1 4" BENCH_FANOUT_RUNS=1 BENCH_FANOUT_RUNS_N1=1 BENCH_FANOUT_DOC=0 BENCH_FANOUT_KEEP=1 \
	bash "$(dirname "$0")/../scripts/bench_fanout.sh" >"$out" 2>&1
rc=$?
cat "$out"
root=$(sed -n 's/^bench-fanout: keeping the logs in \(\/.*\)$/\1/p' "$out")
[ $rc = 0 ] || { echo "FAIL: bench_fanout.sh exited $rc"; exit 1; }
[ -f "$root/cells.log" ] || { echo "FAIL: no cells.log in '$root'"; exit 1; }
[ "$(wc -l <"$root/cells.log")" = 22 ] || { echo "FAIL: not 22 cells (11 columns, N = 1 and 4)"; exit 1; }
[ "$(awk '$1 == "check"' "$root/cells.log" | wc -l)" = 2 ] || { echo "FAIL: not 2 check cells"; exit 1; }
# Every cell has its two CPU figures; the broker's cells a nonzero pair
# (raw TCP at 1M moves 2 MB in a few ms, under the kernel's accounting
# tick: its threads may read 0).
bad=$(awk '$5 !~ /^[0-9]+\.[0-9]+$/ || $6 !~ /^[0-9]+\.[0-9]+$/ ||
	(($1 == "recv" || $1 == "lib" || $1 == "libsf" || $1 == "live") && !($5 > 0 && $6 > 0)) ||
	($1 == "liblocal" && !($5 > 0))' "$root/cells.log")
[ -z "$bad" ] || { echo "FAIL: cells without receiver or sender CPU: $bad"; exit 1; }
last=$(tail -n 1 "$out")
[[ "$last" =~ ^intake_cpu_over_tcp\ [0-9]+\.[0-9]+\ broker_cpu_over_nginx\ [0-9]+\.[0-9]+\ fanout_over_raw_tcp_n1\ [0-9]+\.[0-9]+$ ]] ||
	{ echo "FAIL: last line '$last'"; exit 1; }
grep -q '^CPU seconds (user + system) per GB moved' "$out" || { echo "FAIL: no CPU table"; exit 1; }
for row in "library consumers' CPU per GB until READY / raw TCP receivers' that keep the model, N = 4" \
	"the broker's CPU per GB sent to library consumers / nginx's to curl, N = 4" \
	"library consumers until READY / raw TCP, N = 1"; do
	grep -qF "| $row | at most " "$out" || { echo "FAIL: no target row '$row'"; exit 1; }
done
grep -qF "| (a reference, not a target) with \`--bulk-send sendfile\`, N = 4: " "$out" ||
	{ echo "FAIL: no reference row for --bulk-send sendfile"; exit 1; }
grep -qF "| (a reference, not a target) with the broker's unix socket (local), N = 4: " "$out" ||
	{ echo "FAIL: no reference row for the local column"; exit 1; }
grep -qF "| (a reference, not a target) library consumers until READY / their checkpoints' bytes written alone, N = 4 |" \
	"$out" || { echo "FAIL: no reference row against the disk"; exit 1; }
awk '$1 == "disk" && !($4 > 0)' "$root/cells.log" | grep -q . && { echo "FAIL: a disk cell without a time"; exit 1; }
for ref in "the same, the library's time from its \`dcast_consumer_open()\` call" \
	"the same from their \`dcast_consumer_open()\` calls (their exec and library loading left out, as the receivers' counts leave out theirs), N = 4" \
	"library consumers until READY / raw TCP from the model file through a 1 MiB buffer to receivers that keep the model, N = 1" \
	"the library's work alone (receivers that keep the model, hash it as the library does and write it with O_DIRECT), N = 4: "; do
	grep -qF "| (a reference, not a target) $ref" "$out" || { echo "FAIL: no reference row '$ref'"; exit 1; }
done
awk '$1 == "lib" && !($10 > 0)' "$root/cells.log" | grep -q . && { echo "FAIL: a lib cell without its time from open()"; exit 1; }
awk '$1 == "lib" && !($11 > 0 && $11 < $5)' "$root/cells.log" | grep -q . &&
	{ echo "FAIL: a lib cell without its exec's CPU under its whole"; exit 1; }
# bench_tcp's check mode on its own: a directory it cannot write into is
# named, and one it can is left as it was found (its files unlinked at once).
tcp=${DELTACAST_BUILD:-build}/tools/bench_tcp
err=$("$tcp" 1048576 1 check /nonexistent/dir 2>&1) && { echo "FAIL: check into /nonexistent/dir passed"; exit 1; }
[[ "$err" == *"bench_tcp: check: /nonexistent/dir: No such file or directory"* ]] || { echo "FAIL: check error '$err'"; exit 1; }
dir=$(mktemp -d /tmp/dcast-test-fanout-dir-XXXXXX)
root="$root $dir"
out2=$("$tcp" 4194304 2 check "$dir") || { echo "FAIL: bench_tcp check: $out2"; exit 1; }
[[ "$out2" =~ ^seconds\ [0-9.]+\ bytes\ 8388608\ send_cpu_s ]] || { echo "FAIL: bench_tcp check printed '$out2'"; exit 1; }
[ -z "$(ls -A "$dir")" ] || { echo "FAIL: bench_tcp check left $(ls -A "$dir")"; exit 1; }
echo "test_bench_fanout: ok"
