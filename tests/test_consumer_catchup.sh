#!/usr/bin/env bash
# A fresh `deltacast subscribe` joins a log of an anchor and hundreds of
# one-chunk deltas (no broker-made anchors) and applies every one of them:
# the consumer stops reading while all 16 staging slots hold READY versions
# instead of refusing the next version and re-joining (which livelocked:
# 0 versions applied in 60 s behind 40 queued versions).
# Digests are checked on every version (the default), so reaching the last
# version means the weights are the producer's, bit for bit.
. "$(dirname "$0")/tools/broker_lib.sh"

N=400
start_broker s --anchor-fraction 0
"$WC" produce "$s_PROD" one --tensors 1 --elems 4096 --chunk-elems 4096 --versions $N \
	>"$TMP/prod.log" 2>&1 || fail "producer exited $?"
timeout 60 "$BUILD/deltacast" subscribe --broker "$s_CONS" --model one --dir "$TMP/sub" --until $N \
	>"$TMP/sub.out" 2>"$TMP/sub.err" || fail "subscribe exited $?"
applied=$(grep -c '^version [0-9]* \(anchor\|delta\) ' "$TMP/sub.out")
[ "$applied" = $N ] || fail "subscribe applied $applied versions, want $N"
grep -q "^version $N delta " "$TMP/sub.out" || fail "no version $N: $(tail -2 "$TMP/sub.out")"
! grep -q "refused" "$TMP/sub.err" || fail "versions refused: $(grep -m3 refused "$TMP/sub.err")"
stop_broker s
echo "test_consumer_catchup: ok ($N versions)"
