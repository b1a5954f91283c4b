#!/usr/bin/env bash
# Broker --data-dir: committed payloads go out from a read-only mapping of
# their segment's pages (broker/ondisk.c), no copy into the heap.
#  - mapped: an anchor and a dense delta of 32 KiB chunks reach 2
#    consumers and a late joiner bit-exact, and every payload byte taken from the data dir was sent
#    from a mapping (deltacast_disk_mapped_bytes_total equals
#    deltacast_disk_read_bytes_total, both over 0); once sent, nothing is
#    held (bytes in flight back to 0: every mapping let go).
#  - refused: with every mmap failing (DELTACAST_BROKER_FAULT=nomap, as on
#    a file system without mmap) the payloads are read instead, the
#    consumers end bit-exact just the same, nothing counts as mapped, and
#    the broker says so once in its log, not once per chunk.
. "$(dirname "$0")/tools/broker_lib.sh"

ELEMS=1048576 # x 3 bf16 tensors: 6 MiB a version, 32 KiB chunks
DATA=(--elems "$ELEMS" --density-ppm 1000000) # dense deltas: no chunk under 16 KiB

# serve NAME SEED: 2 consumers of m to version 2, bit-exact, from broker NAME.
serve() {
	local cons pids=() i
	cons=$(eval echo "\$${1}_CONS")
	for i in 1 2; do
		bg "$1c$i" "$WC" consume "$cons" m --until 2 "${DATA[@]}" --seed "$2" --timeout-ms 60000
		pids+=("$LAST_PID")
	done
	wait_consumers "$1" 2
	"$WC" produce "$(eval echo "\$${1}_PROD")" m --versions 2 "${DATA[@]}" --seed "$2" \
		>"$TMP/$1p.log" 2>&1 || fail "producer exited $?: $(cat "$TMP/$1p.log")"
	for i in 1 2; do
		wait "${pids[$((i - 1))]}" || fail "consumer $1c$i exited $?: $(cat "$TMP/$1c$i.err")"
		grep -q "applied=2 .*bit-exact" "$TMP/$1c$i.out" || fail "consumer $1c$i: $(cat "$TMP/$1c$i.out")"
	done
}

# late NAME SEED: one more consumer of m, joining after both versions are
# committed, bit-exact: it takes them from the segment (the first two may
# be served from memory while the writer is still on them).
late() {
	bg "$1late" "$WC" consume "$(eval echo "\$${1}_CONS")" m --until 2 "${DATA[@]}" --seed "$2" \
		--timeout-ms 60000
	wait "$LAST_PID" || fail "late consumer exited $?: $(cat "$TMP/$1late.err")"
	grep -q "applied=2 .*bit-exact" "$TMP/$1late.out" || fail "late consumer: $(cat "$TMP/$1late.out")"
}

# ---- mapped ----
start_broker_metrics b --data-dir "$TMP/data" --anchor-fraction 0
serve b 1
late b 1
read=$(metric_of "$b_METRICS" deltacast_disk_read_bytes_total)
mapped=$(metric_of "$b_METRICS" deltacast_disk_mapped_bytes_total)
echo "mapped: ${mapped:-absent} of ${read:-absent} payload bytes taken from the data dir sent from a mapping"
[ "${read:-0}" -gt 0 ] || fail "nothing taken from the data dir (read ${read:-absent})"
[ "${mapped:-absent}" = "$read" ] || fail "${mapped:-absent} bytes sent from a mapping, $read taken from the data dir"
held_none() { [ "$(metric_of "$b_METRICS" deltacast_disk_read_in_flight_bytes)" = 0 ]; }
wait_for 10 held_none ||
	fail "$(metric_of "$b_METRICS" deltacast_disk_read_in_flight_bytes) bytes still held after every send"
grep -q "mmap of" "$TMP/b.log" && fail "a refused mmap logged: $(grep "mmap of" "$TMP/b.log")"
stop_broker b

# ---- refused ----
DELTACAST_BROKER_FAULT=nomap start_broker_metrics r --data-dir "$TMP/data-r" --anchor-fraction 0
serve r 2
late r 2
read=$(metric_of "$r_METRICS" deltacast_disk_read_bytes_total)
mapped=$(metric_of "$r_METRICS" deltacast_disk_mapped_bytes_total)
lines=$(grep -c "mmap of .* bytes at offset .*: No such device; such payloads are read" "$TMP/r.log")
echo "refused: ${read:-absent} bytes read, ${mapped:-absent} mapped, $lines log line(s)"
[ "${read:-0}" -gt 0 ] && [ "${mapped:-absent}" = 0 ] ||
	fail "mmap refused: ${read:-absent} bytes read, ${mapped:-absent} mapped (want some, 0)"
[ "$lines" = 1 ] || fail "$lines log lines for the refused mmap, want 1: $(grep "mmap" "$TMP/r.log")"
stop_broker r
echo "test_broker_disk_map: ok"
