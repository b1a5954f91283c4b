#!/usr/bin/env bash
# A version no consumer can take (its COMMIT carries a wrong digest: a
# poisoned log) costs a bounded rate of refusals: the
# consumer backs off 100 ms after the second refusal of the same version,
# doubling to 30 s, instead of re-joining thousands of times a second.
# The live weights stay at the version before it (digests checked).
. "$(dirname "$0")/tools/broker_lib.sh"

start_broker s --anchor-fraction 0
"$WC" produce "$s_PROD" poison --versions 5 --bad-digest-at 3 >"$TMP/prod.log" 2>&1 ||
	fail "producer exited $?"
timeout 6 "$BUILD/deltacast" subscribe --broker "$s_CONS" --model poison --dir "$TMP/sub" --until 5 \
	>"$TMP/sub.out" 2>"$TMP/sub.err"
rc=$?
[ $rc = 124 ] || fail "subscribe exited $rc, expected to be stopped at version 2"
refusals=$(grep -c "version 3 refused" "$TMP/sub.err")
echo "refusals of version 3 in 6 s: $refusals"
[ "$refusals" -ge 2 ] || fail "version 3 was never refused: $(tail -3 "$TMP/sub.err")"
[ "$refusals" -le 20 ] || fail "$refusals refusals in 6 s: no backoff"
grep -q "joining again in [0-9]* ms" "$TMP/sub.err" || fail "no backoff line"
tail -1 "$TMP/sub.out" | grep -q "^version 2 " || fail "not at version 2: $(tail -1 "$TMP/sub.out")"
stop_broker s
echo "test_consumer_backoff: ok"
