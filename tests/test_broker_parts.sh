#!/usr/bin/env bash
# Broker: two producer parts (each owning half of every tensor) make one
# version each time; a version commits only when both parts committed, and
# consumers get one COMMIT per version carrying both parts' digests.  The
# broker's fold checks each version against the two parts' digests (out of
# range order in the COMMIT) and finds none bad.
. "$(dirname "$0")/tools/broker_lib.sh"

start_broker_metrics b --anchor-every 2
bg c1 "$WC" consume "$b_CONS" m2 --until 8
C1=$LAST_PID
bg p0 "$WC" produce "$b_PROD" m2 --part 0 --parts 2 --versions 8
P0=$LAST_PID
# part 0 has committed its share of version 1: alone, it commits nothing
wait_for 10 metric_at_least "$b_METRICS" 'deltacast_model_parts_committed{model="m2"}' 1 ||
	fail "part 0's COMMIT never reached the broker"
check_metric b deltacast_versions_committed_total 0 # one part of two commits nothing
bg p1 "$WC" produce "$b_PROD" m2 --part 1 --parts 2 --versions 8
P1=$LAST_PID
wait "$P0" || fail "part 0 exited $?"
wait "$P1" || fail "part 1 exited $?"
wait "$C1" || fail "consumer exited $?"
grep -q "applied=8 versions=8 anchors=1 .*bit-exact" "$TMP/c1.out" || fail "consumer: $(cat "$TMP/c1.out")"
check_metric b deltacast_versions_committed_total 8
wait_metric b deltacast_anchors_made_total 3 # at 3, 5 and 7
check_metric b deltacast_versions_poisoned_total 0
stop_broker b
echo "test_broker_parts: ok"
