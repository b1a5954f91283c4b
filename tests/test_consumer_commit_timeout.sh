#!/usr/bin/env bash
# The consumer's COMMIT timeout: a broker with --cut-through (and a long
# --part-timeout-ms) streams version 3 ahead while its producer holds inside
# it.  `deltacast subscribe` (the consumer library) with
# DELTACAST_COMMIT_TIMEOUT_MS=500 drops what it staged of 3 when no COMMIT
# comes, says so and re-joins, staying at 2; once the producer goes on and
# 3 commits, it applies 3 and 4, digests checked, and a raw consumer of
# the same broker shows them bit-exact.
. "$(dirname "$0")/tools/broker_lib.sh"

start_broker_metrics b --heartbeat-ms 200 --cut-through --part-timeout-ms 600000
DELTACAST_COMMIT_TIMEOUT_MS=500 bg sub "$BUILD/deltacast" subscribe --broker "$b_CONS" --model ct \
	--dir "$TMP/sub" --until 4
SUB=$LAST_PID
bg raw "$WC" consume "$b_CONS" ct --until 4
RAW=$LAST_PID
wait_consumers b 2
bg p "$WC" produce "$b_PROD" ct --versions 4 --hold-at 3 --hold-file "$TMP/go"
wait_for 20 grep -qs "holding inside version 3" "$TMP/p.err" || fail "producer never held in v3"
wait_for 10 grep -q "version 3: no COMMIT [0-9]* ms after its last chunk (commit_timeout_ms 500); dropped, re-joining" \
	"$TMP/sub.err" || fail "subscribe did not time out version 3: $(tail -3 "$TMP/sub.err")"
joins=$(metric_of "$b_METRICS" deltacast_consumer_joins_total)
[ "$joins" -ge 3 ] || fail "subscribe did not re-join ($joins joins)"
tail -1 "$TMP/sub.out" | grep -q "^version 2 " || fail "subscribe not at 2: $(tail -1 "$TMP/sub.out")"
check_metric b 'deltacast_model_version{model="ct"}' 2
touch "$TMP/go"
wait "$SUB" || fail "subscribe exited $?: $(tail -3 "$TMP/sub.err")"
grep -q "^version 3 " "$TMP/sub.out" || fail "subscribe skipped 3: $(cat "$TMP/sub.out")"
grep -q "^version 4 " "$TMP/sub.out" || fail "subscribe: $(cat "$TMP/sub.out")"
wait "$RAW" || fail "raw consumer exited $?: $(tail -2 "$TMP/raw.err")"
grep -q "applied=4 versions=4 anchors=1 .*bit-exact" "$TMP/raw.out" || fail "raw: $(cat "$TMP/raw.out")"
stop_broker b
echo "test_consumer_commit_timeout: ok"
