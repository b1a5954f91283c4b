#!/usr/bin/env bash
# Broker-made anchors: a producer sends one anchor then 20 deltas at ~5%
# density to a broker with --anchor-every 5 (fraction off).  The broker folds
# the deltas and cuts anchors at 6, 11, 16, 21 (each checked against the
# producer's digests).  A late joiner gets the made anchor 21 only: its bytes
# are one model, not the first anchor + 20 deltas, and it ends bit-identical
# with every digest equal.  Consumers connected from the start keep
# receiving deltas (21 versions, 1 anchor, bit-exact), also one stopped at
# version 1 while the deltas it needs were folded out of the log.  Then
# --anchor-fraction alone cuts anchors by size, a --data-dir broker
# restarted after made anchors serves the made anchor from disk, a version
# whose digests differ from its state is poisoned and not cut, and the
# real publish/subscribe tools go through a made anchor bit-exact.
. "$(dirname "$0")/tools/broker_lib.sh"

T=3 E=65536 MODEL_BYTES=$((3 * 65536 * 2))
COMMON=(--tensors $T --elems $E --density-ppm 50000)

# Bad values are refused at start with the flag named (exit 2), and --help lists both flags.
for bad in abc -1 1e9 nan; do
	"$BROKER" --producers tcp://127.0.0.1:1 --consumers tcp://127.0.0.1:2 --anchor-fraction "$bad" 2>"$TMP/bad.err"
	rc=$?; [ $rc = 2 ] || fail "--anchor-fraction $bad: exit $rc"
	grep -q "anchor-fraction: \"$bad\" is not a number in \[0, 1000\]" "$TMP/bad.err" || fail "unclear: $(cat "$TMP/bad.err")"
done
"$BROKER" --producers tcp://127.0.0.1:1 --consumers tcp://127.0.0.1:2 --anchor-every x 2>"$TMP/bad.err"
[ $? = 2 ] && grep -q "anchor-every" "$TMP/bad.err" || fail "--anchor-every x: $(cat "$TMP/bad.err")"
[ "$("$BROKER" --help | grep -c -- '--anchor-\(fraction\|every\)')" = 2 ] || fail "--help lacks the anchor flags"

start_broker_metrics a --anchor-every 5 --anchor-fraction 0
bg early "$WC" consume "$a_CONS" ma --until 21 "${COMMON[@]}" --window 65536
EARLY=$LAST_PID
bg lag "$WC" consume "$a_CONS" ma --until 21 "${COMMON[@]}" --stats "$TMP/lag.stats"
LAG=$LAST_PID
wait_consumers a 2
"$WC" produce "$a_PROD" ma --versions 1 "${COMMON[@]}" 2>"$TMP/p1.err" || fail "producer exited $?"
wait_for 10 grep -qs "applied=1 " "$TMP/lag.stats" || fail "lagging consumer did not apply the first anchor"
kill -STOP "$LAG" # held at version 1 while every delta up to 21 is folded away
"$WC" produce "$a_PROD" ma --versions 21 "${COMMON[@]}" 2>"$TMP/p.err" || fail "producer exited $?"
wait "$EARLY" || fail "early consumer exited $?: $(cat "$TMP/early.err")"
grep -q "applied=21 versions=21 anchors=1 .*bit-exact" "$TMP/early.out" ||
	fail "early consumer: $(cat "$TMP/early.out")"
# made anchors 6, 11, 16 and 21 (a made anchor is published only with the
# producer's digests equal): 21 heads the log, and it is the fourth
wait_metric a 'deltacast_model_anchor_version{model="ma"}' 21
check_metric a deltacast_anchors_made_total 4
kill -CONT "$LAG"
wait "$LAG" || fail "lagging consumer exited $?: $(cat "$TMP/lag.err")"
grep -q "applied=21 versions=21 anchors=1 .*bit-exact" "$TMP/lag.out" ||
	fail "lagging consumer did not go on with deltas: $(cat "$TMP/lag.out")"
"$WC" consume "$a_CONS" ma --until 21 "${COMMON[@]}" >"$TMP/late.out" 2>"$TMP/late.err" ||
	fail "late joiner exited $?: $(cat "$TMP/late.err")"
grep -q "applied=21 versions=1 anchors=1 .*bit-exact" "$TMP/late.out" || fail "late joiner: $(cat "$TMP/late.out")"
late_bytes=$(sed -n 's/.* bytes=\([0-9]*\) .*/\1/p' "$TMP/late.out")
early_bytes=$(sed -n 's/.* bytes=\([0-9]*\) .*/\1/p' "$TMP/early.out")
[ "$late_bytes" = "$MODEL_BYTES" ] || fail "late joiner received $late_bytes bytes, one model is $MODEL_BYTES"
[ "$early_bytes" -gt "$((MODEL_BYTES * 2))" ] || fail "early consumer received only $early_bytes bytes"
check_metric a deltacast_anchor_digest_errors_total 0 # no made anchor refused
check_metric a deltacast_anchors_made_total 4
stop_broker a

# Fraction 0.5 alone: a 5%-density delta is ~7% of the model, so an anchor is
# cut about every 8 deltas; a late joiner's bytes stay within one model plus
# the fraction (plus the one delta that crosses it).
start_broker_metrics f --anchor-fraction 0.5
"$WC" produce "$f_PROD" mf --versions 21 "${COMMON[@]}" 2>"$TMP/pf.err" || fail "producer exited $?"
wait_metric f deltacast_anchors_made_total 1 # fraction: a made anchor
"$WC" consume "$f_CONS" mf --until 21 "${COMMON[@]}" >"$TMP/lf.out" 2>"$TMP/lf.err" || fail "late joiner exited $?"
grep -q "applied=21 .*anchors=1 .*bit-exact" "$TMP/lf.out" || fail "fraction late joiner: $(cat "$TMP/lf.out")"
versions=$(sed -n 's/.* versions=\([0-9]*\) .*/\1/p' "$TMP/lf.out")
bytes=$(sed -n 's/.* bytes=\([0-9]*\) .*/\1/p' "$TMP/lf.out")
[ "$versions" -lt 10 ] || fail "fraction late joiner streamed $versions versions"
[ "$bytes" -le $((MODEL_BYTES * 16 / 10)) ] || fail "fraction late joiner received $bytes bytes"
stop_broker f

# --data-dir: the made anchor is a new segment; after SIGKILL + restart the
# broker serves the made anchor 21 and nothing older.
mkdir -p "$TMP/data"
start_broker_metrics d --anchor-every 10 --anchor-fraction 0 --data-dir "$TMP/data"
"$WC" produce "$d_PROD" md --versions 23 "${COMMON[@]}" 2>"$TMP/pd.err" || fail "producer exited $?"
wait_metric d 'deltacast_model_anchor_version{model="md"}' 21 # durable: made anchor 21
kill -9 "$d_PID"; wait "$d_PID" 2>/dev/null
start_broker_metrics d2 --anchor-every 10 --anchor-fraction 0 --data-dir "$TMP/data"
# restored: anchor 21 + 22, 23
check_metric d2 'deltacast_model_log_versions{model="md"}' 3
check_metric d2 'deltacast_model_anchor_version{model="md"}' 21
check_metric d2 'deltacast_model_version{model="md"}' 23
"$WC" consume "$d2_CONS" md --until 23 "${COMMON[@]}" >"$TMP/ld.out" 2>"$TMP/ld.err" || fail "consumer exited $?"
grep -q "applied=23 versions=3 anchors=1 .*bit-exact" "$TMP/ld.out" || fail "after restart: $(cat "$TMP/ld.out")"
stop_broker d2
# A version whose state does not hash to its COMMIT's digests (the
# producer's COMMIT of 6 carries a wrong digest) is found as it is folded,
# before an anchor is cut from it: 6 is poisoned (an error line, the
# counter, ERROR DCAST_EPOISONED to the producer), nothing is published:
# the log keeps the producer's anchor (test_broker_poison has the rest).
start_broker_metrics g --anchor-every 5 --anchor-fraction 0
"$WC" produce "$g_PROD" mg --versions 8 "${COMMON[@]}" --bad-digest-at 6 --wait-error 1 \
	--timeout-ms 10000 2>"$TMP/pg.err"
grep -q "ERROR DCAST_EPOISONED version 6:" "$TMP/pg.err" || fail "producer not told: $(cat "$TMP/pg.err")"
wait_metric g deltacast_versions_poisoned_total 1
grep -q "model mg version 6 poisoned (DCAST_EDIGEST" "$TMP/g.log" || fail "digest mismatch not reported"
"$BUILD/deltacast" status --broker "$g_METRICS" --raw >"$TMP/g.metrics" || fail "status --raw exited $?"
grep -q '^deltacast_anchors_made_total 0$' "$TMP/g.metrics" || fail "an anchor was made"
grep -q '^deltacast_model_anchor_version{model="mg"} 1$' "$TMP/g.metrics" || fail "the log's anchor changed"
"$WC" consume "$g_CONS" mg --until 5 "${COMMON[@]}" >"$TMP/lg.out" 2>"$TMP/lg.err" || fail "consumer exited $?"
grep -q "applied=5 versions=5 anchors=1 .*bit-exact" "$TMP/lg.out" || fail "after refusal: $(cat "$TMP/lg.out")"
stop_broker g
# The host copy of the state exists only while an anchor is made: after made anchor 6 the broker holds none (before: one model's
# bytes for as long as the model lived).
start_broker_metrics h --anchor-every 5 --anchor-fraction 0
"$WC" produce "$h_PROD" mh --versions 8 "${COMMON[@]}" 2>"$TMP/ph.err" || fail "producer exited $?"
wait_metric h 'deltacast_model_anchor_version{model="mh"}' 6 # made anchor 6
"$BUILD/deltacast" status --broker "$h_METRICS" --raw >"$TMP/h.metrics" || fail "status --raw exited $?"
grep -q '^deltacast_fold_state_bytes 0$' "$TMP/h.metrics" ||
	fail "fold state kept after the cut: $(grep fold_state "$TMP/h.metrics")"
"$WC" consume "$h_CONS" mh --until 8 "${COMMON[@]}" >"$TMP/lh.out" 2>"$TMP/lh.err" || fail "consumer exited $?"
grep -q "applied=8 versions=3 anchors=1 .*bit-exact" "$TMP/lh.out" || fail "after the cut: $(cat "$TMP/lh.out")"
stop_broker h
# The real tools: deltacast publish (producer library) sends a gen-trace
# model's anchor + 6 deltas; the broker makes anchors 4 and 7; a late
# deltacast subscribe (consumer library, digest verification on) starts
# from the made anchor 7 and its file equals the trace's last checkpoint.
"$BUILD/deltacast" gen-trace --params 3M --steps 6 --density 0.01 -o "$TMP/trace" 2>/dev/null || fail "gen-trace"
start_broker_metrics t --anchor-every 3 --anchor-fraction 0
"$BUILD/deltacast" publish --broker "$t_PROD" --model tm "$TMP"/trace/v000*.safetensors 2>"$TMP/pub.err" ||
	fail "publish: $(cat "$TMP/pub.err")"
# made anchor 7, with the producer library's digests equal
wait_metric t 'deltacast_model_anchor_version{model="tm"}' 7
check_metric t deltacast_anchor_digest_errors_total 0
"$BUILD/deltacast" subscribe --broker "$t_CONS" --model tm --dir "$TMP/sub" --until 7 >"$TMP/sub.out" 2>"$TMP/sub.err" ||
	fail "subscribe exited $?: $(tail -3 "$TMP/sub.err")"
[ "$(grep -c '^version' "$TMP/sub.out")" = 1 ] && grep -q '^version 7 anchor' "$TMP/sub.out" ||
	fail "late subscriber: $(cat "$TMP/sub.out")"
"$BUILD/deltacast" diff "$TMP/trace/v0006.safetensors" "$TMP/sub/model.safetensors" --json >"$TMP/diff.json" ||
	fail "diff exited $?"
grep -q '^{"elements":[0-9]*,"changed":0,' "$TMP/diff.json" || fail "subscriber's model differs: $(head -c 200 "$TMP/diff.json")"
stop_broker t
echo "test_broker_anchor: ok"
