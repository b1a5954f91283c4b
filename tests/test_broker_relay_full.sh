#!/usr/bin/env bash
# A relay whose data dir filled up is durable again after its own fold's
# next made anchor, without its upstream sending one.  Relay r keeps its
# log in a tmpfs of its own (--anchor-every 2); v1 is written, then the
# tmpfs is shrunk to what it holds and v2's write fails (ENOSPC: a hole,
# nothing more written); the room comes back, and v3's fold cuts a made
# anchor that starts a whole segment: v3..v6 are durable.  Restarted on
# its data dir, r restores version 6 and joins its upstream with it.
# Exit 77 without tmpfs mounts (not root).
. "$(dirname "$0")/tools/broker_lib.sh"

RD=$TMP/rdata
mkdir -p "$RD"
mount -t tmpfs -o size=64m tmpfs "$RD" 2>/dev/null || { echo "test_broker_relay_full: no tmpfs mounts (root): skipped"; exit 77; }
trap 'umount -l "$RD"; cleanup' EXIT # lazy: the relay may still hold files there

start_broker s --anchor-fraction 0 --heartbeat-ms 100
R_ARGS=(--upstream "$s_CONS" --upstream-model full --data-dir "$RD" --anchor-every 2 --anchor-fraction 0
	--heartbeat-ms 100)
start_broker r "${R_ARGS[@]}"
"$WC" produce "$s_PROD" full --versions 1 >"$TMP/prod1.log" 2>&1 || fail "anchor v1: exit $?"
wait_for 10 grep -q "model full: version 1 durable" "$TMP/r.log" || fail "the relay did not write v1"
mount -o remount,size="$(df -k --output=used "$RD" | tail -n 1 | tr -d ' ')k" "$RD" || fail "remount"
"$WC" produce "$s_PROD" full --versions 2 >"$TMP/prod2.log" 2>&1 || fail "v2: exit $?"
wait_for 10 grep -q "model full: version 2 not durable (DCAST_EIO).*No space left" "$TMP/r.log" ||
	fail "v2's write did not fail: $(grep -m2 'version 2' "$TMP/r.log")"
mount -o remount,size=64m "$RD" || fail "remount"
for v in 3 4 5 6; do
	"$WC" produce "$s_PROD" full --versions "$v" >"$TMP/prod$v.log" 2>&1 || fail "v$v: exit $?"
done
wait_for 10 grep -q "model full: version 6 durable" "$TMP/r.log" ||
	fail "the relay is not durable again: $(grep 'durable\|made anchor' "$TMP/r.log" | tail -4)"
grep -q "model full: made anchor 3 " "$TMP/r.log" || fail "no made anchor at v3: $(grep 'made anchor' "$TMP/r.log")"
stop_broker r
start_broker r "${R_ARGS[@]}"
wait_for 10 logged_since "$TMP/r.log" "$START_FROM" "relay full: HELLO to .* with version 6" ||
	fail "the restarted relay did not restore v6: $(tail -n +"$START_FROM" "$TMP/r.log" | grep -m3 'restored\|HELLO')"
stop_broker r
stop_broker s
echo "test_broker_relay_full: ok"
