#!/usr/bin/env bash
# The consumer library takes an anchor over a bulk connection: a gen-trace
# model (an anchor and 3 deltas) published to a broker with --bulk and
# --data-dir, then late joiners (`deltacast subscribe`, the consumer
# library) to version 4, each bit-exact to the trace's last checkpoint:
# - by default the anchor comes over bulk (bulk_versions 1 on its lines,
#   the broker's deltacast_bulk_versions_total 1) and the deltas over
#   ZeroMQ;
# - with the test fault bulk_cut:1 the connection is cut after the first
#   CHUNK frame: bulk_failures 1, a warning naming the cause, and the
#   anchor comes over ZeroMQ;
# - with DELTACAST_BULK=0 no BULK is offered (the broker's counter stays).
. "$(dirname "$0")/tools/broker_lib.sh"

"$BUILD/deltacast" gen-trace --params 1M --steps 3 --density 0.01 -o "$TMP/trace" 2>/dev/null || fail "gen-trace"
last=$(ls "$TMP"/trace/v000*.safetensors | tail -1)
start_broker_metrics b --heartbeat-ms 200 --bulk 127.0.0.1:0 --data-dir "$TMP/data"
"$BUILD/deltacast" publish --broker "$b_PROD" --model sm "$TMP"/trace/v000*.safetensors 2>"$TMP/pub.err" ||
	fail "publish: $(cat "$TMP/pub.err")"

# subscribe NAME [VAR=VALUE...]: a late joiner to version 4 with those in
# its environment, its model.safetensors then equal to the trace's last.
subscribe() {
	local name=$1
	shift
	env "$@" "$BUILD/deltacast" subscribe --broker "$b_CONS" --model sm --dir "$TMP/$name" --until 4 \
		>"$TMP/$name.out" 2>"$TMP/$name.err" || fail "subscribe $name exited $?: $(tail -3 "$TMP/$name.err")"
	grep -q '^version 4 ' "$TMP/$name.out" || fail "subscribe $name: $(cat "$TMP/$name.out")"
	"$BUILD/deltacast" diff "$last" "$TMP/$name/model.safetensors" --json >"$TMP/$name.diff" ||
		fail "diff $name exited $?"
	grep -q '^{"elements":[0-9]*,"changed":0,' "$TMP/$name.diff" ||
		fail "subscriber $name differs: $(head -c 200 "$TMP/$name.diff")"
}

# lines NAME K F: each version line of NAME ends "bulk_versions K bulk_failures F".
lines() {
	awk -v want="bulk_versions $2 bulk_failures $3" '/^version /{ n++; if (index($0, want) != length($0) - length(want) + 1) bad = 1 }
		END { exit !(n && !bad) }' "$TMP/$1.out" || fail "$1: want $2 $3 on every line: $(cat "$TMP/$1.out")"
}

subscribe bulk
grep -q '^version 1 anchor ' "$TMP/bulk.out" || fail "bulk: no anchor 1: $(cat "$TMP/bulk.out")"
lines bulk 1 0
check_metric b deltacast_bulk_versions_total 1
grep -q "bulk: consumer .* of sm has version 1" "$TMP/b.log" || fail "the broker did not send 1 over bulk"
grep -q "over a bulk connection" "$TMP/bulk.err" || fail "bulk: $(tail -3 "$TMP/bulk.err")"

subscribe cut DELTACAST_CONSUMER_FAULT=bulk_cut:1
lines cut 0 1
grep -q "bulk transfer of version 1 failed: .*(test fault bulk_cut); bulk off until an anchor" "$TMP/cut.err" ||
	fail "cut: no warning naming the cause: $(tail -3 "$TMP/cut.err")"
grep -q "anchor 1 taken over ZeroMQ; bulk on again" "$TMP/cut.err" ||
	fail "cut: bulk not on again after the anchor came over ZeroMQ: $(tail -3 "$TMP/cut.err")"
sent=$(metric_of "$b_METRICS" deltacast_bulk_versions_total)

subscribe off DELTACAST_BULK=0
lines off 0 0
grep -q "over a bulk connection" "$TMP/off.err" && fail "off: took a bulk connection"
check_metric b deltacast_bulk_versions_total "$sent"
stop_broker b
echo "test_consumer_bulk: ok"
