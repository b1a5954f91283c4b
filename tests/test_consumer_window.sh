#!/usr/bin/env bash
# A consumer whose window (a quarter of its staging budget) is smaller than
# a chunk of the stream is told so within seconds: the
# broker sends ERROR DCAST_ETOO_LARGE naming the chunk size and the window,
# and `deltacast subscribe` prints it, instead of both waiting forever.  A
# big enough budget then takes the same stream.
. "$(dirname "$0")/tools/broker_lib.sh"

start_broker s
"$WC" produce "$s_PROD" wide --tensors 1 --elems 262144 --chunk-elems 262144 --versions 2 \
	>"$TMP/prod.log" 2>&1 || fail "producer exited $?"
"$BUILD/deltacast" subscribe --broker "$s_CONS" --model wide --dir "$TMP/small" --until 2 \
	--budget 1048576 >"$TMP/small.out" 2>"$TMP/small.err" &
small=$!
PIDS+=("$small")
told() { grep -q "DCAST_ETOO_LARGE.*more than this consumer's whole window" "$TMP/small.err"; }
wait_for 15 told || fail "no error for a window smaller than a chunk: $(tail -3 "$TMP/small.err")"
kill "$small"
"$BUILD/deltacast" subscribe --broker "$s_CONS" --model wide --dir "$TMP/big" --until 2 \
	--budget 8388608 >"$TMP/big.out" 2>"$TMP/big.err" || fail "subscribe with 8 MiB exited $?"
grep -q "^version 2 " "$TMP/big.out" || fail "no version 2: $(cat "$TMP/big.out")"
stop_broker s
echo "test_consumer_window: ok"
