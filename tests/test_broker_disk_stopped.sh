#!/usr/bin/env bash
# Broker --data-dir: a stopped consumer's frames read from disk, queued
# for it and counted against the read cap (64 MiB over all consumers), do
# not stall another consumer: each keeps a floor of its own (4 MiB sent and
# not yet credited back).  A 192 MiB anchor, durable and served from its
# segment; one consumer with a 256 MiB window joins and is stopped
# (SIGSTOP) with more than 60 MiB read for it; a second consumer then
# receives the whole version bit-exact while it is still stopped (the
# heartbeat is long: the stopped one is not dropped meanwhile); after
# SIGCONT the first ends bit-exact too.
. "$(dirname "$0")/tools/broker_lib.sh"

ELEMS=33554432 # x 3 bf16 tensors: 192 MiB
FLAGS=(--elems "$ELEMS" --chunk-elems 262144 --timeout-ms 60000)

start_broker_metrics b --data-dir "$TMP/data" --heartbeat-ms 30000
"$WC" produce "$b_PROD" m --versions 1 "${FLAGS[@]}" 2>"$TMP/p.err" || fail "producer exited $?"
wait_metric b deltacast_versions_to_disk_total 1 # its payloads are served from the segment
bg slow "$WC" consume "$b_CONS" m --until 1 --window 268435456 "${FLAGS[@]}"
SLOW=$LAST_PID
wait_consumers b 1
kill -STOP "$SLOW"
wait_metric b deltacast_disk_read_in_flight_bytes 62914560 20
bg fast "$WC" consume "$b_CONS" m --until 1 --window 16777216 "${FLAGS[@]}"
wait "$LAST_PID" || fail "the second consumer exited $? while the first was stopped"
grep -q "applied=1 .*bit-exact" "$TMP/fast.out" || fail "fast: $(cat "$TMP/fast.out")"
metrics_addr b
echo "while stopped: $(metric_of "$ADDR" deltacast_disk_read_in_flight_bytes) bytes read for it, not yet sent"
kill -CONT "$SLOW"
wait "$SLOW" || fail "the stopped consumer exited $? after SIGCONT"
grep -q "applied=1 .*bit-exact" "$TMP/slow.out" || fail "slow: $(cat "$TMP/slow.out")"
stop_broker b
echo "test_broker_disk_stopped: ok"
