#!/usr/bin/env bash
# Broker: a consumer that crashes after 5 versions and restarts from its
# saved state (HELLO have_version=5) receives only the deltas after it: no
# anchor resent, fewer bytes than the first run, and ends bit-exact.
. "$(dirname "$0")/tools/broker_lib.sh"

start_broker b --anchor-fraction 0 # log as the producer sent it (no broker-made anchors)
"$WC" produce "$b_PROD" m3 --versions 20 2>"$TMP/p.err" || fail "producer exited $?"
"$WC" consume "$b_CONS" m3 --until 20 --exit-after 5 --state "$TMP/state" --stats "$TMP/s1" \
	>"$TMP/c1.out" 2>"$TMP/c1.err" || fail "first consumer run exited $?"
[ "$(stat_of "$TMP/s1" applied)" = 5 ] || fail "first run: $(cat "$TMP/s1")"
[ "$(stat_of "$TMP/s1" anchors)" = 1 ] || fail "first run should start from the anchor"
"$WC" consume "$b_CONS" m3 --until 20 --state "$TMP/state" --stats "$TMP/s2" \
	>"$TMP/c2.out" 2>"$TMP/c2.err" || fail "second consumer run exited $?"
grep -q "applied=20 versions=15 anchors=0 .*bit-exact" "$TMP/c2.out" || fail "restart: $(cat "$TMP/c2.out")"
b1=$(stat_of "$TMP/s1" bytes)
b2=$(stat_of "$TMP/s2" bytes)
[ "$b2" -lt "$b1" ] || fail "restart received $b2 bytes, first run $b1: anchor resent?"
# A consumer whose version is not in the log (never published) gets the anchor path.
printf '\x39\x05\0\0\0\0\0\0' | dd of="$TMP/state" bs=8 count=1 conv=notrunc 2>/dev/null # version 1337
"$WC" consume "$b_CONS" m3 --until 20 --state "$TMP/state" --stats "$TMP/s3" --timeout-ms 3000 \
	>"$TMP/c3.out" 2>"$TMP/c3.err" && fail "version 1337 is ahead of the log; nothing should arrive"
stop_broker b
echo "test_broker_restart: ok"
