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
# - with DELTACAST_BULK=0 no BULK is offered (the broker's counter stays);
# - a consumer that holds a version takes a newer anchor over bulk through
#   its staging, not in place: a 4M model (8.4 MB) against a 4 MiB window
#   (--budget 16 MiB), so the bulk reader holds back whenever a window's
#   bytes are not yet freed.  The consumer holds version 1; the broker
#   folds anchor 3 (--anchor-every 2), dropping 1 from its log; the
#   consumer re-started at 1 takes anchor 3 over bulk, then delta 4,
#   bit-exact; over TCP (--bulk-no-local), and again over the broker's
#   unix socket, the anchor's payloads read by reference from its files
#   (test_bulk_local.sh).
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

"$BUILD/deltacast" gen-trace --params 4M --steps 3 --density 0.01 -o "$TMP/big" 2>/dev/null || fail "gen-trace 4M"
# held_run NAME [BROKER ARGS...]: the held consumer's case against a broker
# with those flags too.
held_run() {
	local f=$1
	shift
	start_broker_metrics "$f" --heartbeat-ms 200 --bulk 127.0.0.1:0 --data-dir "$TMP/$f.data" \
		--anchor-every 2 "$@"
	publish_f() { # FIRST FILES...: publish FILES of the 4M trace from version FIRST
		local first=$1 prod
		shift
		eval "prod=\$${f}_PROD"
		"$BUILD/deltacast" publish --broker "$prod" --model big --first-version "$first" "$@" \
			2>"$TMP/pubf.err" || fail "publish from $first: $(tail -2 "$TMP/pubf.err")"
	}
	held() { # UNTIL: `deltacast subscribe` of "big" in DIR held, 16 MiB staging, to UNTIL
		local cons
		eval "cons=\$${f}_CONS"
		"$BUILD/deltacast" subscribe --broker "$cons" --model big --dir "$TMP/$f.held" --until "$1" \
			--budget 16777216 >"$TMP/held$1.out" 2>"$TMP/held$1.err" ||
			fail "subscribe to $1 exited $?: $(tail -3 "$TMP/held$1.err")"
	}
	publish_f 1 "$TMP/big/v0000.safetensors"
	held 1
	publish_f 2 "$TMP"/big/v000[123].safetensors
	wait_for 10 grep -qs "made anchor 3 " "$TMP/$f.log" || fail "the broker made no anchor 3"
	held 4
	grep -q "^loaded version 1 " "$TMP/held4.out" || fail "held: did not start from version 1: $(cat "$TMP/held4.out")"
	grep -q "^version 3 anchor .* bulk_versions 1 bulk_failures 0$" "$TMP/held4.out" ||
		fail "held: anchor 3 not over bulk: $(cat "$TMP/held4.out")"
	grep -q "^version 4 delta " "$TMP/held4.out" || fail "held: no delta 4: $(cat "$TMP/held4.out")"
	"$BUILD/deltacast" diff "$TMP/big/v0003.safetensors" "$TMP/$f.held/model.safetensors" --json \
		>"$TMP/held.diff" || fail "diff held exited $?"
	grep -q '^{"elements":[0-9]*,"changed":0,' "$TMP/held.diff" || fail "held differs: $(head -c 200 "$TMP/held.diff")"
	stop_broker "$f"
}
held_run f --bulk-no-local
grep -q "takes version 3 (.*, copy)" "$TMP/f.log" || fail "f: anchor 3 not over TCP"
held_run fl
grep -q "takes version 3 (.*, local)" "$TMP/fl.log" || fail "fl: anchor 3 not local"
echo "test_consumer_bulk: ok"
