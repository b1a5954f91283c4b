#!/usr/bin/env bash
# deltacast publish after a restart: one process publishes versions 1..3
# and ends; a new one, given the broker's consumer endpoint (--consumers),
# fetches version 3 as its baseline and publishes version 4 as a delta.  A
# subscriber that held 3 receives 4 as a delta (its bytes a small share of
# the model) and ends with the file's tensors bit for bit.  Then --base
# FILE: a copy of version 4 the caller holds is checked against the
# broker's digests (a wrong one refused) and version 5 goes as a delta on
# it.  A late joiner still starts from the anchor; --no-fetch-base sends an
# anchor; without --consumers, publish fetches from the endpoint the broker
# names (test_cli_publish_restart_named.sh has that case in full).
. "$(dirname "$0")/tools/broker_lib.sh"
B=$BUILD tmp=$TMP
"$B/deltacast" gen-trace --params 3M --steps 4 --density 0.01 -o "$tmp/trace" 2>/dev/null ||
	fail "gen-trace"
f=("$tmp"/trace/v000*.safetensors)
start_broker b
bg sub "$B/deltacast" subscribe --broker "$b_CONS" --model m --dir "$tmp/held" --until 4
sub=$LAST_PID

# a broker that holds nothing: --consumers fetches nothing, 1 is an anchor
"$B/deltacast" publish --broker "$b_PROD" --consumers "$b_CONS" --model m "${f[0]}" "${f[1]}" \
	"${f[2]}" 2>"$tmp/pub1.err" || fail "publish 1..3: $(cat "$tmp/pub1.err")"
grep -q '^version 1 anchor' "$tmp/pub1.err" || fail "version 1 was not an anchor"
grep -q '^baseline' "$tmp/pub1.err" && fail "a baseline fetched from an empty broker"
wait_for 30 grep -q '^version 3 ' "$tmp/sub.out" || fail "the subscriber did not reach version 3"

"$B/deltacast" publish --broker "$b_PROD" --consumers "$b_CONS" --model m --first-version 4 \
	"${f[3]}" 2>"$tmp/pub2.err" || fail "publish 4 after a restart: $(cat "$tmp/pub2.err")"
cat "$tmp/pub2.err"
grep -q '^baseline version 3 fetched' "$tmp/pub2.err" || fail "no baseline fetched"
grep -q '^version 4 delta' "$tmp/pub2.err" || fail "version 4 was not published as a delta"
wait "$sub" || fail "subscribe exited $?"
small_delta "$tmp/sub.out" 4 "${f[3]}"

same_tensors "$tmp/held/model.safetensors" "${f[3]}" || fail "the subscriber's version 4 differs"

# --base FILE: the checkpoint published last, checked against the broker's
# digests before it is trusted (a wrong one is refused, naming the tensor)
if "$B/deltacast" publish --broker "$b_PROD" --consumers "$b_CONS" --base "${f[2]}" --model m \
	--first-version 5 "${f[4]}" 2>"$tmp/wrong.err"; then
	fail "a base that is not the broker's newest version was taken"
fi
grep -q 'digest mismatch.*differ from the broker' "$tmp/wrong.err" ||
	fail "the wrong base was not refused by its digests: $(cat "$tmp/wrong.err")"
"$B/deltacast" publish --broker "$b_PROD" --consumers "$b_CONS" --base "${f[3]}" --model m \
	--first-version 5 "${f[4]}" 2>"$tmp/pub3.err" || fail "publish 5 on --base: $(cat "$tmp/pub3.err")"
grep -q '^version 5 delta' "$tmp/pub3.err" || fail "version 5 on --base was not a delta"
"$B/deltacast" subscribe --broker "$b_CONS" --model m --dir "$tmp/held" --until 5 \
	>"$tmp/held5.out" 2>"$tmp/held5.err" || fail "subscriber to 5: $(cat "$tmp/held5.err")"
small_delta "$tmp/held5.out" 5 "${f[4]}"
same_tensors "$tmp/held/model.safetensors" "${f[4]}" || fail "the subscriber's version 5 differs"

late_joiner "$b_CONS" "$tmp/late" 5 "${f[4]}"

"$B/deltacast" publish --broker "$b_PROD" --consumers "$b_CONS" --no-fetch-base --model m \
	--first-version 6 "${f[4]}" 2>"$tmp/pub4.err" || fail "publish 6: $(cat "$tmp/pub4.err")"
grep -q '^version 6 anchor' "$tmp/pub4.err" || fail "--no-fetch-base did not send an anchor"
"$B/deltacast" publish --broker "$b_PROD" --model m --first-version 7 "${f[4]}" \
	2>"$tmp/pub5.err" || fail "publish 7: $(cat "$tmp/pub5.err")"
grep -q "^baseline version 6 fetched from $b_CONS," "$tmp/pub5.err" &&
	grep -q '^version 7 delta' "$tmp/pub5.err" ||
	fail "without --consumers, no delta on the named endpoint's version: $(cat "$tmp/pub5.err")"
echo "test_cli_publish_restart: ok"
