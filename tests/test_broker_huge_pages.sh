#!/usr/bin/env bash
# DELTACAST_HUGE_PAGES=0 in a broker's environment: the payloads it keeps
# in memory (no --data-dir) stay as ZeroMQ received them, not copied onto
# huge-page slabs, so after a 48 MiB anchor and two deltas the broker
# holds no transparent huge page (AnonHugePages 0 in its smaps_rollup);
# it says so at start, and a consumer still takes every version with its
# checksums good.  The same broker without the variable, beside it, must
# hold huge pages after the same versions: else the kernel gives none
# here (THP off, or memory too fragmented) and the test cannot tell the
# two apart (exit 77, naming which).
. "$(dirname "$0")/tools/broker_lib.sh"

thp=/sys/kernel/mm/transparent_hugepage/enabled
[ -r "$thp" ] || { echo "SKIP: no $thp: no transparent huge pages in this kernel"; exit 77; }
grep -q '\[never\]' "$thp" && { echo "SKIP: transparent huge pages are off ($(cat "$thp"))"; exit 77; }

# huge_kb PID: the process's anonymous memory on huge pages, in kB.
huge_kb() {
	awk '$1 == "AnonHugePages:" { print $2 }' "/proc/$1/smaps_rollup"
}

# versions NAME: versions 1..3 of "hp" (a 48 MiB anchor of 2 MiB chunks,
# two deltas) to broker NAME, then a consumer of all three, checksums
# checked.
versions() {
	local prod cons
	eval "prod=\$${1}_PROD cons=\$${1}_CONS"
	"$WC" produce "$prod" hp --versions 3 --elems 8388608 --chunk-elems 1048576 >"$TMP/$1.prod.out" 2>&1 ||
		fail "producer to $1: $(tail -2 "$TMP/$1.prod.out")"
	"$WC" receive "$cons" hp --until 3 --window 4194304 --timeout-ms 20000 --verify 1 \
		>"$TMP/$1.recv.out" 2>"$TMP/$1.recv.err" || fail "$1: receive exited $?: $(tail -2 "$TMP/$1.recv.err")"
	grep -q "^received 3 chunks" "$TMP/$1.recv.out" || fail "$1: $(cat "$TMP/$1.recv.out")"
}

DELTACAST_HUGE_PAGES=0 start_broker off
grep -q "memory: huge pages off (DELTACAST_HUGE_PAGES=0)" "$TMP/off.log" || fail "off: no line says huge pages are off"
versions off
off_kb=$(huge_kb "$off_PID")

start_broker on
grep -q "huge pages off" "$TMP/on.log" && fail "on: says huge pages are off without the variable"
versions on
on_kb=$(huge_kb "$on_PID")
echo "AnonHugePages: ${on_kb:-?} kB by default, ${off_kb:-?} kB with DELTACAST_HUGE_PAGES=0"
[ "${off_kb:-x}" = 0 ] || fail "off: ${off_kb:-no} kB on huge pages with DELTACAST_HUGE_PAGES=0"
[ "${on_kb:-0}" -gt 0 ] ||
	{ echo "SKIP: the default broker got no huge page either ($(cat "$thp")): nothing to tell apart"; exit 77; }
stop_broker off
stop_broker on
echo "test_broker_huge_pages: ok"
