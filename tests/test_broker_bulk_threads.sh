#!/usr/bin/env bash
# Bulk transfers written by the broker's bulk threads (--bulk-threads;
# broker/bulkpump.c), off its event loop:
# - with 3 threads, a receiver that stops reading mid-transfer holds one
#   thread's transfer while three more receivers take the same 48 MiB
#   anchor over TCP at once, checksums checked: each thread's bytes are
#   counted, at least two threads wrote, and their sum is every byte
#   written; the stalled one, let go, takes the rest and its COMMIT;
# - a transfer whose consumer the broker dropped (silent for 3 heartbeats
#   while it stalls) is cancelled on its thread at once, not after the
#   transfer's 30 s quiet limit: the broker logs it and closes the
#   connection (the receiver finds it closed before the COMMIT), and
#   serves the next receiver over bulk;
# - --bulk-threads out of range is refused at start, naming the range.
. "$(dirname "$0")/tools/broker_lib.sh"

# receive NAME BROKER [ARGS...]: a receiver of "bk" to version 1 over bulk.
receive() {
	local name=$1 b=$2 cons
	shift 2
	eval "cons=\$${b}_CONS"
	"$WC" receive "$cons" bk --until 1 --window 4194304 --timeout-ms 20000 --verify 1 --bulk 1 "$@" \
		>"$TMP/$name.out" 2>"$TMP/$name.err" || fail "$name exited $?: $(tail -2 "$TMP/$name.err")"
	grep -q "^received 1 chunks" "$TMP/$name.out" || fail "$name: $(cat "$TMP/$name.out")"
}

# thread_bytes BROKER K: thread K's bytes written.
thread_bytes() {
	metrics_addr "$1"
	metric_of "$ADDR" "deltacast_bulk_thread_bytes_total{thread=\"$2\"}"
}

start_broker_metrics t --heartbeat-ms 2000 --bulk 127.0.0.1:0 --bulk-no-local --data-dir "$TMP/t" \
	--bulk-threads 3
grep -q "bulk: 3 threads write the transfers" "$TMP/t.log" || fail "the threads were not logged"
"$WC" produce "$t_PROD" bk --versions 1 --elems 8388608 >"$TMP/prod.out" 2>&1 ||
	fail "producer: $(tail -2 "$TMP/prod.out")"

receive held t --bulk-hold-file "$TMP/go" &
held=$!
wait_for 10 grep -qs "^bulk holding" "$TMP/held.err" || fail "the held receiver did not start its transfer"
P=()
for i in 1 2 3; do receive "r$i" t & P+=($!); done
for p in "${P[@]}"; do wait "$p" || fail "a receiver failed"; done
grep -q "bulk failed" "$TMP"/r[123].err && fail "a transfer failed: $(cat "$TMP"/r[123].err)"
wait_metric t deltacast_bulk_versions_total 3
touch "$TMP/go"
wait "$held" || fail "the held receiver failed"
grep -q "bulk failed" "$TMP/held.err" && fail "held: $(cat "$TMP/held.err")"
wait_metric t deltacast_bulk_versions_total 4
sum=0
wrote=0
for k in 0 1 2; do
	v=$(thread_bytes t "$k")
	[ -n "$v" ] || fail "no bytes counted for thread $k"
	sum=$((sum + v))
	[ "$v" -gt 0 ] && wrote=$((wrote + 1))
done
[ -z "$(thread_bytes t 3)" ] || fail "a fourth thread counted"
check_metric t deltacast_bulk_bytes_total "$sum"
[ "$wrote" -ge 2 ] || fail "one thread wrote every transfer, one of them stalled"
[ "$sum" -gt $((4 * 50331648)) ] || fail "$sum bytes written: less than 4 anchors of 48 MiB"
stop_broker t

# A stalled transfer whose consumer the broker drops: cancelled on its
# thread once the consumer is gone (heartbeats of 200 ms: gone after 600).
start_broker_metrics c --heartbeat-ms 200 --bulk 127.0.0.1:0 --bulk-no-local --data-dir "$TMP/c"
"$WC" produce "$c_PROD" bk --versions 1 --elems 8388608 >"$TMP/prodc.out" 2>&1 ||
	fail "producer: $(tail -2 "$TMP/prodc.out")"
"$WC" receive "$c_CONS" bk --until 1 --window 4194304 --timeout-ms 5000 --bulk 1 \
	--bulk-hold-file "$TMP/gone.go" >"$TMP/gone.out" 2>"$TMP/gone.err" &
gone=$!
wait_for 10 grep -qs "^bulk holding" "$TMP/gone.err" || fail "the stalled receiver did not start its transfer"
wait_for 10 grep -qs "bulk: version 1: its consumer re-joined or left: connection closed" "$TMP/c.log" ||
	fail "the stalled transfer was not cancelled: $(grep 'bulk' "$TMP/c.log" | tail -3)"
touch "$TMP/gone.go"
wait "$gone" # dropped by the broker, it may or may not take the anchor over ZeroMQ
grep -q "bulk failed: the connection ended before the COMMIT" "$TMP/gone.err" ||
	fail "gone: its transfer did not end: $(cat "$TMP/gone.err")"
check_metric c deltacast_bulk_versions_total 0
receive after c
wait_metric c deltacast_bulk_versions_total 1
stop_broker c

"$BROKER" --producers 'tcp://127.0.0.1:*' --consumers 'tcp://127.0.0.1:*' --bulk 127.0.0.1:0 \
	--bulk-threads 17 2>"$TMP/range.err" && fail "--bulk-threads 17 started"
grep -q -- "--bulk-threads must be in \[0, 16\]" "$TMP/range.err" || fail "range: $(cat "$TMP/range.err")"
echo "test_broker_bulk_threads: ok"
