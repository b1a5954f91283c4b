#!/usr/bin/env bash
# deltacast subscribe with each digest mode: a gen-trace model's anchor and
# deltas published with deltacast publish, then three subscribers (default:
# blocks each version writes; --verify-all: every block; --no-verify) reach
# the last version and their model.safetensors equal the trace's last
# checkpoint, element for element.
. "$(dirname "$0")/tools/broker_lib.sh"

"$BUILD/deltacast" gen-trace --params 1M --steps 3 --density 0.01 -o "$TMP/trace" 2>/dev/null || fail "gen-trace"
start_broker s
"$BUILD/deltacast" publish --broker "$s_PROD" --model sm "$TMP"/trace/v000*.safetensors 2>"$TMP/pub.err" ||
	fail "publish: $(cat "$TMP/pub.err")"
last=$(ls "$TMP"/trace/v000*.safetensors | tail -1)
for mode in default --verify-all --no-verify; do
	flag=$mode; [ "$mode" = default ] && flag=
	"$BUILD/deltacast" subscribe --broker "$s_CONS" --model sm --dir "$TMP/sub$mode" --until 4 $flag \
		>"$TMP/sub$mode.out" 2>"$TMP/sub$mode.err" || fail "subscribe $mode exited $?: $(tail -3 "$TMP/sub$mode.err")"
	grep -q '^version 4 ' "$TMP/sub$mode.out" || fail "subscribe $mode: $(cat "$TMP/sub$mode.out")"
	"$BUILD/deltacast" diff "$last" "$TMP/sub$mode/model.safetensors" --json >"$TMP/diff$mode.json" ||
		fail "diff $mode exited $?"
	grep -q '^{"elements":[0-9]*,"changed":0,' "$TMP/diff$mode.json" ||
		fail "subscriber $mode differs: $(head -c 200 "$TMP/diff$mode.json")"
done
# log_write_bytes L is a running total (the stats' counter since open), and
# the help says so; it said "bytes V added".
"$BUILD/deltacast" subscribe --help | grep -q "L: bytes written to DIR's record log since start" ||
	fail "subscribe --help does not say L counts since start"
awk '/^version /{for(i=1;i<NF;i++) if($i=="log_write_bytes"){if($(i+1)+0<l) exit 1; l=$(i+1)+0}}' \
	"$TMP/subdefault.out" || fail "log_write_bytes went down: $(cat "$TMP/subdefault.out")"
stop_broker s
echo "test_consumer_cli: ok"
