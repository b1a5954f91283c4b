#!/usr/bin/env bash
# A producer's anchor reaches the consumers that hold the version before it
# as a delta the broker makes from it.  Versions 1..3 go out (an anchor, two
# deltas) to a subscriber of broker o and to one of relay r below it; a new
# producer that fetches no baseline then publishes version 4 as an anchor.
# Both subscribers must take 4 as a delta (a small share of the model's
# bytes) and end with its tensors bit for bit; o must log the delta it
# made and count it, and r, which takes o's delta as any delta, makes none;
# a late joiner still gets the anchor.  The same with --data-dir and with
# --cut-through; with --no-anchor-deltas, or folding off, the subscriber
# at 3 takes anchor 4 whole, and so it does when the delta is not made
# within --anchor-delta-max-ms.  An anchor whose digests differ from its bytes
# is poisoned while its delta is made; one on a version whose COMMIT
# claimed a wrong digest goes whole, not poisoned.  A consumer stopped part-way
# through version 3 goes on with 3, then 4 as the delta.
. "$(dirname "$0")/tools/broker_lib.sh"
B=$BUILD tmp=$TMP
"$B/deltacast" gen-trace --params 3M --steps 4 --density 0.01 -o "$tmp/trace" 2>"$tmp/gentrace.err" ||
	fail "gen-trace: $(tail -2 "$tmp/gentrace.err")"
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

# single NAME WANT [BROKER FLAGS...]: one subscriber of a broker with
# FLAGS takes version 4 as WANT (delta or anchor), bit for bit.
single() {
	local name=$1 want=$2 sub
	shift 2
	start_broker "$name" "$@"
	bg "$name-sub" "$B/deltacast" subscribe --broker "$(eval echo "\$${name}_CONS")" --model m \
		--dir "$tmp/$name-held" --until 4
	sub=$LAST_PID
	versions "$(eval echo "\$${name}_PROD")" "$tmp/$name-sub.out"
	wait "$sub" || fail "$name: subscribe exited $?"
	if [ "$want" = delta ]; then
		small_delta "$tmp/$name-sub.out" 4 "${f[3]}"
	else
		grep -q '^version 4 anchor' "$tmp/$name-sub.out" ||
			fail "$name: version 4 was not an anchor: $(grep '^version 4' "$tmp/$name-sub.out")"
	fi
	same_tensors "$tmp/$name-held/model.safetensors" "${f[3]}" ||
		fail "$name: the subscriber's version 4 differs"
	stop_broker "$name"
}

# --data-dir: the state and the delta's payloads in files there
single d delta --data-dir "$tmp/data"
# --cut-through: the open anchor is not forwarded to the subscriber at 3
single c delta --cut-through
grep -q 'anchor 4 goes to consumers at 3 as a delta' "$TMP/c.log" || fail "c: no delta made"
# --no-anchor-deltas, or folding off: the anchor goes whole
single n anchor --no-anchor-deltas
single z anchor --anchor-fraction 0
# --anchor-delta-max-ms: a delta not made in time (the test fault
# slowfold: each share of the work starts 400 ms late) is given up and
# logged, and the subscriber at 3 takes anchor 4 whole; one made
# within its limit still goes as the delta.
DELTACAST_BROKER_FAULT=slowfold:400 single t anchor --anchor-delta-max-ms 200
grep -q 'anchor 4 goes whole to consumers at 3: no delta made (DCAST_ETIMEDOUT): not made within --anchor-delta-max-ms 200' \
	"$TMP/t.log" || fail "t: the late delta was not given up: $(grep 'anchor 4' "$TMP/t.log")"
DELTACAST_BROKER_FAULT=slowfold:100 single u delta --anchor-delta-max-ms 60000

# An anchor whose COMMIT digest differs from its bytes: found while its
# delta is made, poisoned, never served; the consumer at 3 stays there and
# moves on, digests checked, to the next anchor.
start_broker_metrics p
"$WC" produce "$p_PROD" bad --versions 3 >"$TMP/bad1.log" 2>&1 || fail "versions 1..3: exit $?"
bg bc "$WC" consume "$p_CONS" bad --until 5 --timeout-ms 20000 --stats "$TMP/bc.stats"
BC=$LAST_PID
wait_for 10 grep -qs "applied=3 " "$TMP/bc.stats" || fail "consumer not at 3"
"$WC" produce "$p_PROD" bad --versions 4 --anchor-at 4 --bad-digest-at 4 --wait-error 1 \
	--timeout-ms 10000 >"$TMP/bad2.log" 2>&1
grep -q "ERROR DCAST_EPOISONED version 4:" "$TMP/bad2.log" ||
	fail "the producer got no ERROR naming 4: $(tail -2 "$TMP/bad2.log")"
grep -q "anchor 4 goes whole to consumers at 3: no delta made (DCAST_EDIGEST)" "$TMP/p.log" ||
	fail "no failed delta logged"
grep -q "model bad version 4 poisoned (DCAST_EDIGEST" "$TMP/p.log" || fail "4 not poisoned"
check_metric p deltacast_anchor_deltas_failed_total 1
grep -q "applied=3 " "$TMP/bc.stats" || fail "the consumer moved past 3: $(cat "$TMP/bc.stats")"
"$WC" produce "$p_PROD" bad --versions 5 >"$TMP/bad3.log" 2>&1 || fail "anchor 5: exit $?"
wait "$BC" || fail "consumer exited $?: $(tail -2 "$TMP/bc.err")"
grep -q "applied=5 versions=4 anchors=2 " "$TMP/bc.stats" || fail "consumer: $(cat "$TMP/bc.stats")"

# V's COMMIT claims a wrong digest (a consumer that only receives took it):
# W's check fails, but W's bytes match its own digests, so W goes whole,
# not poisoned.
start_broker v
"$WC" produce "$v_PROD" claim --versions 3 --bad-digest-at 3 >"$TMP/claim1.log" 2>&1 ||
	fail "claim 1..3"
bg vr "$WC" receive "$v_CONS" claim --until 4 --timeout-ms 20000
VR=$LAST_PID
wait_for 10 grep -q "consumer .* of claim joined" "$TMP/v.log" || fail "receiver not joined"
"$WC" produce "$v_PROD" claim --versions 4 --anchor-at 4 >"$TMP/claim2.log" 2>&1 || fail "claim 4"
wait "$VR" || fail "receiver exited $?: $(tail -2 "$TMP/vr.err")"
grep -q "anchor 4 goes whole to consumers at 3: no delta made (DCAST_EDIGEST)" "$TMP/v.log" ||
	fail "no failed delta logged: $(grep 'anchor 4' "$TMP/v.log")"
grep -q "version 4 poisoned" "$TMP/v.log" && fail "anchor 4 poisoned for version 3's claim"
grep -q "^received 4 chunks 12 bytes 393216 " "$TMP/vr.out" || fail "receiver (anchor 4 whole): $(cat "$TMP/vr.out")"

# A consumer behind V: stopped part-way through version 3 (deltas of 20%
# outgrow its 32 KiB window), it goes on with the rest of 3, then takes 4
# as the broker's delta, bit for bit (wire_client checks every version).
start_broker q --heartbeat-ms 5000 # it stays joined while stopped
SLOW=(--density-ppm 200000)
"$WC" produce "$q_PROD" slow --versions 2 "${SLOW[@]}" >"$TMP/slow1.log" 2>&1 || fail "slow 1..2"
bg qc "$WC" consume "$q_CONS" slow --until 4 --window 32768 --timeout-ms 30000 \
	--stats "$TMP/qc.stats" "${SLOW[@]}"
QC=$LAST_PID
wait_for 10 grep -qs "applied=2 " "$TMP/qc.stats" || fail "slow consumer not at 2"
kill -STOP "$QC"
"$WC" produce "$q_PROD" slow --versions 3 "${SLOW[@]}" >"$TMP/slow2.log" 2>&1 || fail "slow 3"
"$WC" produce "$q_PROD" slow --versions 4 --anchor-at 4 "${SLOW[@]}" >"$TMP/slow3.log" 2>&1 ||
	fail "slow anchor 4"
wait_for 10 grep -q "anchor 4 goes to consumers at 3 as a delta" "$TMP/q.log" ||
	fail "no delta made for the consumer behind 3"
kill -CONT "$QC"
wait "$QC" || fail "slow consumer exited $?: $(tail -2 "$TMP/qc.err")"
grep -q "applied=4 versions=4 anchors=1 " "$TMP/qc.stats" || fail "slow consumer: $(cat "$TMP/qc.stats")"
echo "test_broker_anchor_delta: ok"
