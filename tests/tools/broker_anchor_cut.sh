#!/usr/bin/env bash
# Time a broker-made anchor cut on a larger model: 3 BF16 tensors of ELEMS
# elements (default 16M: a 96 MiB model), --anchor-every 3, 8 versions at 1%
# density, one consumer streaming from the start and a late joiner; prints
# both consumers' results, the broker's "made anchor" lines (cut duration
# from start to publish) and its peak RSS.
# Usage: tests/tools/broker_anchor_cut.sh [ELEMS]  (run from the repo root)
. "$(dirname "$0")/broker_lib.sh"
C=(--tensors 3 --elems "${1:-16777216}" --density-ppm 10000 --chunk-elems 1048576
   --timeout-ms 120000 --window 8388608)
start_broker big --anchor-every 3 --anchor-fraction 0
bg early "$WC" consume "$big_CONS" mb --until 8 "${C[@]}"
E=$LAST_PID
"$WC" produce "$big_PROD" mb --versions 8 "${C[@]}" 2>"$TMP/p.err" || fail producer
wait "$E" || fail "early consumer"
"$WC" consume "$big_CONS" mb --until 8 "${C[@]}" >"$TMP/late.out" 2>&1 || fail "late joiner"
cat "$TMP/early.out" "$TMP/late.out"
grep 'made anchor' "$TMP/big.log"
grep VmHWM "/proc/$big_PID/status"
stop_broker big
