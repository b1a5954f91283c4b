#!/usr/bin/env bash
# --bulk-send auto chooses per peer: a consumer in a network namespace of
# its own (behind a veth pair: another address) takes its anchor with
# sendfile(2); one on the broker's host that reached it at the same address
# (the host's side of the pair) takes it copied.  Both check every chunk.
# The library's consumers: the one on the host (the broker's address is
# one it can bind) takes its anchor over the broker's unix socket, by
# reference; the one in the namespace cannot reach that socket (nor bind
# the address) and takes it over TCP with sendfile; both bit-exact.
# The namespace and the pair are this test's own, removed on exit; exit 77
# where they cannot be made (not root, no ip).
. "$(dirname "$0")/tools/broker_lib.sh"

NS=dcast-bp-$$
HOST_IF=dcb$$a
NET=10.232.$(($$ % 200))
trap 'veth_down "$NS" "$HOST_IF"; cleanup' EXIT
veth_up "$NS" "$HOST_IF" "dcb$$b" "$NET"

start_broker_metrics b --heartbeat-ms 200 --consumers "tcp://$NET.1:*" --bulk "$NET.1:0" --data-dir "$TMP/data"
"$WC" produce "$b_PROD" bk --versions 3 --elems 262144 >"$TMP/prod.out" 2>&1 || fail "producer: $(tail -2 "$TMP/prod.out")"

# receive NAME [ip netns exec NS]: a bulk receiver of "bk" to version 3.
receive() {
	local name=$1
	shift
	"$@" "$WC" receive "$b_CONS" bk --until 3 --window 4194304 --timeout-ms 20000 --verify 1 --bulk 1 \
		>"$TMP/$name.out" 2>"$TMP/$name.err" || fail "$name exited $?: $(tail -2 "$TMP/$name.err")"
	grep -q "^received 3 chunks" "$TMP/$name.out" || fail "$name: $(cat "$TMP/$name.out")"
	grep -q "bulk failed" "$TMP/$name.err" && fail "$name: $(cat "$TMP/$name.err")"
}

receive far ip netns exec "$NS"
wait_metric b deltacast_bulk_versions_total 1
grep -q "takes version 1 (.*, sendfile)" "$TMP/b.log" || fail "the peer behind veth was not sent sendfile's way"
sent=$(metric_of "$b_METRICS" deltacast_bulk_sendfile_bytes_total)
[ "$sent" -ge 1572864 ] || fail "sendfile bytes $sent: less than the anchor's 1.5 MiB (3 x 262144 bf16)"

receive near
wait_metric b deltacast_bulk_versions_total 2
[ "$(grep -c "takes version 1 (.*, copy)" "$TMP/b.log")" = 1 ] || fail "the peer on this host was not copied to"
check_metric b deltacast_bulk_sendfile_bytes_total "$sent"

"$BUILD/deltacast" gen-trace --params 1M --steps 1 --density 0.01 -o "$TMP/trace" 2>/dev/null || fail "gen-trace"
"$BUILD/deltacast" publish --broker "$b_PROD" --model m "$TMP"/trace/v000*.safetensors 2>"$TMP/pub.err" ||
	fail "publish: $(cat "$TMP/pub.err")"
late_joiner "$b_CONS" "$TMP/lnear" 2 "$TMP/trace/v0001.safetensors"
grep -q "consumer deltacast-subscribe of m takes version 1 (.*, local)" "$TMP/b.log" ||
	fail "the library on this host did not go local: $(grep 'takes version' "$TMP/b.log")"
sent=$(metric_of "$b_METRICS" deltacast_bulk_sendfile_bytes_total)
ip netns exec "$NS" "$BUILD/deltacast" subscribe --broker "$b_CONS" --model m --dir "$TMP/lfar" --until 2 \
	>"$TMP/lfar.out" 2>"$TMP/lfar.err" || fail "lfar: $(tail -3 "$TMP/lfar.err")"
same_tensors "$TMP/lfar/model.safetensors" "$TMP/trace/v0001.safetensors" || fail "lfar differs"
[ "$(grep -c "consumer deltacast-subscribe of m takes version 1 (.*, sendfile)" "$TMP/b.log")" = 1 ] ||
	fail "the library in the namespace did not take sendfile's way: $(grep 'takes version' "$TMP/b.log")"
[ "$(metric_of "$b_METRICS" deltacast_bulk_sendfile_bytes_total)" -gt "$sent" ] || fail "no sendfile bytes for lfar"
stop_broker b
echo "PASS"
