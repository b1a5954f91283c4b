#!/usr/bin/env bash
# Broker: a consumer joining after 50 versions gets the anchor plus the 49
# deltas after it and ends bit-identical to the source; a re-HELLO resets
# the cursor.  With --retain-versions 20 the broker asks its producer for a
# new anchor (WELCOME need_anchor) and a late joiner starts from that anchor.
. "$(dirname "$0")/tools/broker_lib.sh"

start_broker b --anchor-fraction 0 # log as the producer sent it (no broker-made anchors)
"$WC" produce "$b_PROD" m4 --versions 50 --elems 16384 2>"$TMP/p.err" || fail "producer exited $?"
"$WC" consume "$b_CONS" m4 --until 50 --elems 16384 >"$TMP/c1.out" 2>"$TMP/c1.err" || fail "late joiner exited $?"
grep -q "applied=50 versions=50 anchors=1 .*bit-exact" "$TMP/c1.out" || fail "late joiner: $(cat "$TMP/c1.out")"
stop_broker b

start_broker r --retain-versions 20 --anchor-fraction 0
"$WC" produce "$r_PROD" m5 --versions 30 --elems 16384 2>"$TMP/p2.err" || fail "producer exited $?"
grep -q "past retention, asking for an anchor" "$TMP/r.log" || fail "no anchor requested past retention"
grep -q "anchor 22 replaces 21 older versions" "$TMP/r.log" || fail "anchor 22 did not replace the log"
"$WC" consume "$r_CONS" m5 --until 30 --elems 16384 >"$TMP/c2.out" 2>"$TMP/c2.err" || fail "consumer exited $?"
grep -q "applied=30 versions=9 anchors=1 .*bit-exact" "$TMP/c2.out" || fail "after retention: $(cat "$TMP/c2.out")"
stop_broker r
echo "test_broker_late_join: ok"
