#!/usr/bin/env bash
# A relay takes its anchor over its upstream's --bulk connection, as a
# consumer does (broker/relaybulk.c), and serves it bit-exact:
# - a relay that joins late says x-bulk, takes anchor 1 over a bulk
#   connection (both brokers count it) and the deltas over ZeroMQ; a
#   relay below it, joining later still, takes the anchor from it so;
# - a transfer cut mid-way (the test fault relay_bulk_cut:2) is dropped
#   whole: the relay re-joins without x-bulk, takes the anchor over
#   ZeroMQ, says bulk is on again, and its consumers get every version
#   bit-exact;
# - a relay slow to read the connection (the test fault relay_bulk_hold)
#   reads its DEALER only after the anchor's COMMIT frame, though the
#   deltas wait there: no refusal, no re-join;
# - --upstream-no-bulk: the anchor comes over ZeroMQ, no transfer offered.
. "$(dirname "$0")/tools/broker_lib.sh"

ELEMS=1048576 # 3 tensors of 2 MiB: 192 chunks in the anchor

# consume NAME BROKER [MODEL ELEMS]: a consumer of MODEL (m8) through BROKER
# to version 5, bit-exact.
consume() {
	local cons
	eval "cons=\$${2}_CONS"
	"$WC" consume "$cons" "${3:-m8}" --until 5 --elems "${4:-$ELEMS}" >"$TMP/$1.out" 2>"$TMP/$1.err" ||
		fail "consumer $1 exited $?: $(tail -2 "$TMP/$1.err")"
	grep -q "applied=5 versions=5 anchors=1 .*bit-exact" "$TMP/$1.out" || fail "$1: $(cat "$TMP/$1.out")"
}

start_broker_metrics a --bulk 127.0.0.1:0 --data-dir "$TMP/a"
"$WC" produce "$a_PROD" m8 --versions 5 --elems $ELEMS 2>"$TMP/p.err" || fail "producer exited $?"

# Late, over bulk; and a relay below it over its bulk.
start_broker_metrics r --upstream "$a_CONS" --upstream-model m8 --bulk 127.0.0.1:0
consume c1 r
grep -q "relay m8: version 1 over a bulk connection to port [1-9].* (192 chunks, 6291456 bytes)" \
	"$TMP/r.log" || fail "relay r: no bulk transfer: $(grep 'relay m8' "$TMP/r.log")"
grep -q "relay m8: version 1 came over the bulk connection" "$TMP/r.log" || fail "relay r: not done"
grep -q "bulk: consumer relay of m8 takes version 1" "$TMP/a.log" || fail "upstream: no transfer logged"
check_metric r deltacast_relay_bulk_versions_total 1
check_metric r deltacast_relay_bulk_bytes_total 6291456
check_metric r deltacast_relay_bulk_failures_total 0
check_metric a deltacast_bulk_versions_total 1
start_broker_metrics r2 --upstream "$r_CONS" --upstream-model m8
consume c2 r2
check_metric r2 deltacast_relay_bulk_versions_total 1
check_metric r deltacast_bulk_versions_total 1
stop_broker r2
stop_broker r

# A relay slow to read its bulk connection (the test fault relay_bulk_hold:
# nothing read for 600 ms): the upstream has sent every frame of m9's
# small anchor (it fits the sockets' buffers) and handed the stream back,
# the deltas wait on ZeroMQ, and the relay reads them only after the
# anchor's COMMIT frame (before, it took delta 2 while the anchor was open,
# refused it and re-joined); nor is the upstream silent meanwhile.
"$WC" produce "$a_PROD" m9 --versions 5 --elems 4096 2>"$TMP/p9.err" || fail "producer m9 exited $?"
DELTACAST_BROKER_FAULT=relay_bulk_hold:600 start_broker_metrics h --upstream "$a_CONS" \
	--upstream-model m9 --heartbeat-ms 100
consume c5 h m9 4096
grep -q "relay m9: version 1 came over the bulk connection" "$TMP/h.log" || fail "relay h: not over bulk"
wait_for 5 grep -q "bulk: consumer relay of m9 has version 1" "$TMP/a.log" || fail "upstream: m9 not sent"
! grep -q "while version 1 is open\|HELLO to .*(\(DCAST\|upstream silent\)" "$TMP/h.log" ||
	fail "relay h read ZeroMQ before the COMMIT frame: $(grep -m2 'relay m9: \(DCAST\|HELLO\)' "$TMP/h.log")"
check_metric h deltacast_relay_bulk_failures_total 0
check_metric h deltacast_versions_committed_total 5
stop_broker h

# Cut after two frames: the open anchor is dropped, and it comes over ZeroMQ.
DELTACAST_BROKER_FAULT=relay_bulk_cut:2 start_broker_metrics f --upstream "$a_CONS" --upstream-model m8
consume c3 f
grep -q "relay m8: bulk transfer of version 1 failed: .*cut after 2 frames .*; bulk off" "$TMP/f.log" ||
	fail "relay f: no failure logged: $(grep 'relay m8' "$TMP/f.log")"
grep -q "relay m8: version 1 came over ZeroMQ; bulk on again" "$TMP/f.log" ||
	fail "relay f: the anchor did not come over ZeroMQ: $(grep 'relay m8' "$TMP/f.log")"
check_metric f deltacast_relay_bulk_failures_total 1
check_metric f deltacast_relay_bulk_versions_total 0
check_metric f deltacast_versions_committed_total 5
stop_broker f

# Off: ZeroMQ only, the upstream offers nothing.
start_broker_metrics z --upstream "$a_CONS" --upstream-model m8 --upstream-no-bulk
consume c4 z
! grep -q "bulk connection" "$TMP/z.log" || fail "relay z took a bulk connection"
check_metric z deltacast_relay_bulk_versions_total 0
check_metric a deltacast_bulk_versions_total 2 # r and h: f cut its transfer, z asked for none
stop_broker z
stop_broker a
echo "test_broker_relay_bulk: ok"
