#!/usr/bin/env bash
# A producer's anchor reaches the consumers that hold the version before it
# as a delta the broker makes from it.  Versions 1..3 go out (an anchor, two
# deltas) to a subscriber of broker o and to one of relay r below it; a new
# producer that fetches no baseline then publishes version 4 as an anchor.
# Both subscribers must take 4 as a delta (a small share of the model's
# bytes) and end with its tensors bit for bit; o must log the delta it
# made and count it, and r, which takes o's delta as any delta, makes none;
# a late joiner still gets the anchor.  With --no-anchor-deltas the
# subscriber at 3 takes anchor 4 whole.
. "$(dirname "$0")/tools/broker_lib.sh"
B=$BUILD tmp=$TMP
"$B/deltacast" gen-trace --params 3M --steps 4 --density 0.01 -o "$tmp/trace" 2>/dev/null ||
	fail "gen-trace"
f=("$tmp"/trace/v000*.safetensors)

# versions PROD SUBSCRIBER-LOG...: 1..3 published to PROD, each subscriber
# at 3, then 4 as an anchor from a producer that fetches no baseline.
versions() {
	local prod=$1 log
	shift
	"$B/deltacast" publish --broker "$prod" --model m "${f[0]}" "${f[1]}" "${f[2]}" \
		2>"$tmp/pub1.err" || fail "publish 1..3: $(cat "$tmp/pub1.err")"
	for log in "$@"; do
		wait_for 30 grep -q '^version 3 ' "$log" || fail "$log: no version 3"
	done
	"$B/deltacast" publish --broker "$prod" --no-fetch-base --model m --first-version 4 \
		"${f[3]}" 2>"$tmp/pub2.err" || fail "publish anchor 4: $(cat "$tmp/pub2.err")"
	grep -q '^version 4 anchor' "$tmp/pub2.err" || fail "version 4 was not an anchor"
}

start_broker_metrics o
start_broker r --upstream "$o_CONS" --upstream-model m
bg sub "$B/deltacast" subscribe --broker "$o_CONS" --model m --dir "$tmp/held" --until 4
sub=$LAST_PID
bg rsub "$B/deltacast" subscribe --broker "$r_CONS" --model m --dir "$tmp/rheld" --until 4
rsub=$LAST_PID
versions "$o_PROD" "$tmp/sub.out" "$tmp/rsub.out"
wait "$sub" || fail "subscribe exited $?"
wait "$rsub" || fail "the relay's subscribe exited $?"
small_delta "$tmp/sub.out" 4 "${f[3]}"
small_delta "$tmp/rsub.out" 4 "${f[3]}"
same_tensors "$tmp/held/model.safetensors" "${f[3]}" || fail "the subscriber's version 4 differs"
same_tensors "$tmp/rheld/model.safetensors" "${f[3]}" ||
	fail "the relay's subscriber's version 4 differs"
grep 'anchor 4 goes to consumers at 3 as a delta' "$TMP/o.log" ||
	fail "broker o logged no delta made of anchor 4"
grep -q 'as a delta of' "$TMP/r.log" && fail "relay r made a delta of its own"
check_metric o deltacast_anchor_deltas_total 1
check_metric o deltacast_anchor_deltas_failed_total 0
late_joiner "$o_CONS" "$tmp/late" 4 "${f[3]}"
late_joiner "$r_CONS" "$tmp/rlate" 4 "${f[3]}"
stop_broker r
stop_broker o

# --no-anchor-deltas: the anchor goes whole
start_broker n --no-anchor-deltas
bg nsub "$B/deltacast" subscribe --broker "$n_CONS" --model m --dir "$tmp/nheld" --until 4
nsub=$LAST_PID
versions "$n_PROD" "$tmp/nsub.out"
wait "$nsub" || fail "subscribe to n exited $?"
grep -q '^version 4 anchor' "$tmp/nsub.out" ||
	fail "with --no-anchor-deltas version 4 was not an anchor: $(grep '^version 4' "$tmp/nsub.out")"
same_tensors "$tmp/nheld/model.safetensors" "${f[3]}" || fail "n: the subscriber's version 4 differs"
echo "test_broker_anchor_delta: ok"
