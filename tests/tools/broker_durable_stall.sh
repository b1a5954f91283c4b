#!/usr/bin/env bash
# The event loop's stall on durable writes: a broker with --data-dir takes a
# dense anchor of 4 BF16 tensors of ELEMS elements (default 25M: 200 MB) and
# VERSIONS-1 deltas at 1% density, one consumer streaming throughout.
# Prints the broker's "durable:" lines (write + fsync time; before the
# writer thread that time was spent on the event loop itself), any "event
# loop busy" / "durable work" lines, and deltacast_loop_stall_max_ms (the
# longest loop turn spent on durable work; absent on brokers before it).
# Usage: tests/tools/broker_durable_stall.sh [ELEMS] [VERSIONS]
#        (run from the repo root; DELTACAST_BUILD=DIR picks another build)
. "$(dirname "$0")/broker_lib.sh"
C=(--tensors 4 --elems "${1:-25000000}" --density-ppm 10000 --chunk-elems 1048576
   --timeout-ms 300000 --window 268435456)
VERSIONS=${2:-3}
start_broker_metrics st --data-dir "$TMP/data" --anchor-fraction 0
bg cons "$WC" consume "$st_CONS" stall --until "$VERSIONS" "${C[@]}"
CP=$LAST_PID
"$WC" produce "$st_PROD" stall --versions "$VERSIONS" "${C[@]}" 2>"$TMP/p.err" || fail producer
wait "$CP" || fail consumer
grep -E 'durable:|event loop|durable work' "$TMP/st.log"
exec 3<>"/dev/tcp/${st_METRICS%:*}/${st_METRICS#*:}"
printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3
grep -E '^deltacast_(loop_stall_max_ms|durable_)' <&3 || echo "deltacast_loop_stall_max_ms: not served by this broker"
exec 3<&-
stop_broker st
