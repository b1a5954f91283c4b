#!/usr/bin/env bash
# Broker --data-dir: consumers that want the same chunk share one read of
# the segment (the read cache, broker/ondisk.c), and a kept frame is never
# served as anything but the chunk it was read for.
#  - one read: 5 consumers wait, one of them stopped (SIGSTOP); a producer
#    publishes an anchor and a delta; the 4 others end bit-exact, and the
#    payload bytes read from the data dir are under 3/4 of what was sent
#    (a quarter at best, more when a consumer falls a window behind the
#    others; one pread per consumer per chunk read all of it);
#    what the cache still holds is what it kept for the stopped consumer,
#    within that consumer's window (what its credit would have in flight).
#  - invalidation: `deltacast model delete` drops those frames (cache
#    bytes 0), and the name published again with other contents and the
#    same version numbers reaches 2 consumers bit-exact: nothing of the
#    deleted run is served.
#  - poison: a consumer stopped mid-way through a dense delta v2 (a wrong
#    digest) leaves frames of v2 kept for it; when the fold (at v3,
#    --anchor-every 2) finds v2 bad, they are dropped (cache bytes 0).
. "$(dirname "$0")/tools/broker_lib.sh"

ELEMS=1048576 # x 3 bf16 tensors: 6 MiB an anchor, 32 KiB chunks, 1 MiB windows
SOCK=$TMP/admin.sock
metric() { metric_of "$b_METRICS" "$1"; }

# consumers NAME N SEED: N bit-exact consumers of m to version 2 (background, PIDS in CPIDS).
consumers() {
	CPIDS=()
	for i in $(seq 1 "$2"); do
		bg "$1$i" "$WC" consume "$b_CONS" m --until 2 --elems "$ELEMS" --seed "$3" --timeout-ms 60000
		CPIDS+=("$LAST_PID")
	done
}
consumers_ok() {
	for i in $(seq 1 "${#CPIDS[@]}"); do
		wait "${CPIDS[$((i - 1))]}" || fail "consumer $1$i exited $?: $(cat "$TMP/$1$i.err")"
		grep -q "applied=2 .*bit-exact" "$TMP/$1$i.out" || fail "consumer $1$i: $(cat "$TMP/$1$i.out")"
	done
}

start_broker_metrics b --data-dir "$TMP/data" --admin-socket "$SOCK" --anchor-fraction 0 \
	--heartbeat-ms 5000
bg s "$WC" consume "$b_CONS" m --until 2 --elems "$ELEMS" --seed 1 --timeout-ms 60000
stopped=$LAST_PID
consumers c 4 1
wait_consumers b 5
kill -STOP "$stopped"
"$WC" produce "$b_PROD" m --versions 2 --elems "$ELEMS" --seed 1 >"$TMP/p1.log" 2>&1 ||
	fail "producer exited $?: $(cat "$TMP/p1.log")"
consumers_ok c
read=$(metric deltacast_disk_read_bytes_total) sent=$(metric deltacast_bytes_out_total)
# Frames kept only while a send held them go on the next loop turns.
kept_for_stopped() { kept=$(metric deltacast_read_cache_bytes); [ "${kept:-0}" -le 1048576 ]; }
wait_for 10 kept_for_stopped
hits=$(metric deltacast_read_cache_hits_total)
echo "one read: ${read:-absent} bytes read from the data dir, $sent sent, ${hits:-absent} cache hits," \
	"${kept:-absent} bytes kept for the stopped consumer"
[ -n "$read" ] && [ "$sent" -gt 0 ] || fail "no disk read counter (read ${read:-absent}, sent $sent)"
[ $((read * 4)) -lt $((sent * 3)) ] || fail "$read bytes read from the data dir for $sent sent"
[ "${kept:-0}" -gt 0 ] && [ "$kept" -le 1048576 ] ||
	fail "${kept:-absent} bytes kept for the stopped consumer, want 1 to 1048576 (its window)"

"$BUILD/deltacast" model delete m --admin-socket "$SOCK" >"$TMP/del.out" 2>&1 || fail "delete: $(cat "$TMP/del.out")"
check_metric b deltacast_read_cache_bytes 0
kill -9 "$stopped"

# The name again, other contents, the same version numbers.
consumers n 2 2
wait_consumers b 2
"$WC" produce "$b_PROD" m --versions 2 --elems "$ELEMS" --seed 2 >"$TMP/p2.log" 2>&1 ||
	fail "second producer exited $?: $(cat "$TMP/p2.log")"
consumers_ok n
stop_broker b

# ---- poison ----
DENSE=(--elems "$ELEMS" --density-ppm 1000000 --timeout-ms 60000)
kept_none() { [ "$(metric_of "$p_METRICS" deltacast_read_cache_bytes)" = 0 ]; }
start_broker_metrics p --data-dir "$TMP/data-p" --anchor-fraction 0 --anchor-every 2 \
	--heartbeat-ms 5000
bg ps "$WC" receive "$p_CONS" m --until 3 "${DENSE[@]}"
stopped=$LAST_PID
bg pc1 "$WC" receive "$p_CONS" m --until 1 "${DENSE[@]}"
wait_consumers p 2
"$WC" produce "$p_PROD" m --versions 1 "${DENSE[@]}" >"$TMP/pp1.log" 2>&1 || fail "v1: $(cat "$TMP/pp1.log")"
wait_metric p deltacast_bytes_out_total $((2 * ELEMS * 3 * 2)) # v1 to both
kill -STOP "$stopped"
bg pc2 "$WC" receive "$p_CONS" m --until 2 "${DENSE[@]}"
wait_consumers p 2 # the stopped one and pc2 (pc1 is done)
"$WC" produce "$p_PROD" m --versions 2 --bad-digest-at 2 "${DENSE[@]}" >"$TMP/pp2.log" 2>&1 ||
	fail "v2: $(cat "$TMP/pp2.log")"
wait "$LAST_PID" || fail "pc2 exited $?: $(cat "$TMP/pc2.err")"
kept=$(metric_of "$p_METRICS" deltacast_read_cache_bytes)
echo "poison: ${kept:-absent} bytes of v2 kept for the stopped consumer"
[ "${kept:-0}" -gt 0 ] || fail "nothing of v2 kept for the stopped consumer"
# The fold at v3 finds v2 bad: the producer of v3 is told so (exit 1).
"$WC" produce "$p_PROD" m --versions 3 "${DENSE[@]}" >"$TMP/pp3.log" 2>&1
grep -q "ERROR DCAST_EPOISONED version 2" "$TMP/pp3.log" || fail "v3: $(cat "$TMP/pp3.log")"
wait_metric p deltacast_versions_poisoned_total 1 20
wait_for 10 kept_none || fail "$(metric_of "$p_METRICS" deltacast_read_cache_bytes) bytes of poisoned v2 still kept"
kill -9 "$stopped"
stop_broker p
echo "test_broker_read_cache: ok"
