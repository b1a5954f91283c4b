#!/usr/bin/env bash
# Local bulk transfers: a consumer or relay on the broker's host takes an
# anchor over the broker's unix socket (@deltacast-bulk-PORT), its payloads
# in the data dir's files as references to them, read by the receiver
# itself (schema/bulkrx.c; broker/bulk.c):
# - `deltacast subscribe` (the consumer library) to version 4 of a
#   gen-trace model, bit-exact; the broker logs the transfer as local and
#   counts every payload byte of the anchor as passed by reference, none
#   written with sendfile;
# - (test_consumer_bulk.sh: a consumer holding a version takes a newer
#   anchor by reference through its staging, its window holding reads back);
# - references that are wrong (the test fault bulk_ref_off): one past the
#   payload's bytes fails its checksum, one past the end of the file is
#   named as such; either way nothing of that anchor is applied and the
#   consumer ends bit-exact;
# - without --data-dir the payloads come inline over the same socket, and
#   so do they where the broker cannot reopen its files read-only (the
#   test fault bulk_noproc: as without /proc);
# - a relay takes its anchor from its upstream so, and serves it
#   bit-exact, its own consumer by reference to the relay's files;
# - a second broker on the same --bulk port (another address): its
#   consumer and relay, refused at the first one's socket of that name,
#   take the same transfer over TCP, not the anchor over ZeroMQ;
# - with --bulk-no-local the same consumer connects over TCP.
. "$(dirname "$0")/tools/broker_lib.sh"

"$BUILD/deltacast" gen-trace --params 1M --steps 3 --density 0.01 -o "$TMP/trace" 2>/dev/null || fail "gen-trace"
last=$(ls "$TMP"/trace/v000*.safetensors | tail -1)

# broker NAME ARGS...: a broker with --bulk and ARGS, the trace published.
broker() {
	local name=$1 prod
	shift
	start_broker_metrics "$name" --heartbeat-ms 200 --bulk 127.0.0.1:0 "$@"
	eval "prod=\$${name}_PROD"
	"$BUILD/deltacast" publish --broker "$prod" --model sm "$TMP"/trace/v000*.safetensors \
		2>"$TMP/$name.pub.err" || fail "publish to $name: $(cat "$TMP/$name.pub.err")"
}

# subscribe NAME BROKER [VAR=VALUE...]: a late joiner to version 4 with
# those in its environment, its model.safetensors then equal to the trace's
# last.
subscribe() {
	local name=$1 cons
	eval "cons=\$${2}_CONS"
	shift 2
	env "$@" "$BUILD/deltacast" subscribe --broker "$cons" --model sm --dir "$TMP/$name" --until 4 \
		>"$TMP/$name.out" 2>"$TMP/$name.err" || fail "subscribe $name exited $?: $(tail -3 "$TMP/$name.err")"
	"$BUILD/deltacast" diff "$last" "$TMP/$name/model.safetensors" --json >"$TMP/$name.diff" ||
		fail "diff $name exited $?"
	grep -q '^{"elements":[0-9]*,"changed":0,' "$TMP/$name.diff" ||
		fail "subscriber $name differs: $(head -c 200 "$TMP/$name.diff")"
}

# over_bulk NAME: subscriber NAME took anchor 1 over bulk, with no failure.
over_bulk() {
	grep -q "^version 1 anchor .* bulk_versions 1 bulk_failures 0$" "$TMP/$1.out" ||
		fail "$1: anchor 1 not over bulk: $(cat "$TMP/$1.out")"
}

broker d --data-dir "$TMP/d"
grep -q "bulk anchors to consumers on this host on @deltacast-bulk-[1-9]" "$TMP/d.log" ||
	fail "no local listener logged"
subscribe s1 d
over_bulk s1
grep -q "version 1 over a bulk connection to port [1-9][0-9]*, by its unix socket" "$TMP/s1.err" ||
	fail "s1: not by the unix socket: $(grep 'bulk' "$TMP/s1.err")"
grep -q "bulk: consumer .* of sm takes version 1 (.*, local)" "$TMP/d.log" ||
	fail "the transfer was not local: $(grep 'bulk:' "$TMP/d.log")"
local_bytes=$(metric_of "$d_METRICS" deltacast_bulk_local_bytes_total)
anchor=$(sed -n 's/.*takes version 1 ([0-9]* chunks, \([0-9]*\) bytes.*/\1/p' "$TMP/d.log")
[ "$local_bytes" = "$anchor" ] || fail "local bytes $local_bytes: not the anchor's $anchor payload bytes"
check_metric d deltacast_bulk_sendfile_bytes_total 0
written=$(metric_of "$d_METRICS" deltacast_bulk_bytes_total)
[ "$written" -lt 100000 ] || fail "the broker wrote $written bytes to a local connection: payloads, not references"

# Wrong references, one transfer each (the fault spoils the first only).
DELTACAST_BROKER_FAULT=bulk_ref_off:1 broker f1 --data-dir "$TMP/f1"
subscribe s2 f1
grep -q "checksum" "$TMP/s2.err" || fail "s2: an offset 1 byte off was not caught: $(tail -5 "$TMP/s2.err")"
grep -q "^version 4 " "$TMP/s2.out" || fail "s2: $(cat "$TMP/s2.out")"
stop_broker f1
DELTACAST_BROKER_FAULT=bulk_ref_off:1099511627776 broker f2 --data-dir "$TMP/f2"
subscribe s3 f2
grep -q "bulk frame [0-9]*: the broker's file ends at [0-9]* bytes, inside the payload its reference names" \
	"$TMP/s3.err" || fail "s3: a reference past the file's end was not named: $(tail -5 "$TMP/s3.err")"
grep -q "anchor 1 taken over ZeroMQ; bulk on again" "$TMP/s3.err" || fail "s3: no fallback to ZeroMQ"
stop_broker f2

# Inline: from memory, and from files the broker cannot reopen.
broker m
subscribe s4 m
over_bulk s4
grep -q "takes version 1 (.*, local)" "$TMP/m.log" || fail "m: not local"
check_metric m deltacast_bulk_local_bytes_total 0
stop_broker m
DELTACAST_BROKER_FAULT=bulk_noproc broker np --data-dir "$TMP/np"
subscribe s7 np
over_bulk s7
grep -q "bulk: version 1: /proc/self/fd/[0-9]*, read-only: No such file or directory; its payloads go inline" \
	"$TMP/np.log" || fail "np: the failed reopen was not logged: $(grep 'bulk:' "$TMP/np.log")"
check_metric np deltacast_bulk_local_bytes_total 0
stop_broker np

# A relay on the upstream's host (a data dir of its own), and its own
# consumer over the relay's unix socket, by reference to the relay's files.
start_broker_metrics r --heartbeat-ms 200 --upstream "$d_CONS" --upstream-model sm --bulk 127.0.0.1:0 \
	--data-dir "$TMP/r"
subscribe s5 r
grep -q "relay sm: version 1 came over the bulk connection" "$TMP/r.log" || fail "relay r: not over bulk"
grep -q "relay sm: version 1 over a bulk connection to port [1-9][0-9]*, by its unix socket" "$TMP/r.log" ||
	fail "relay r: not by the unix socket: $(grep 'relay sm' "$TMP/r.log")"
[ "$(metric_of "$d_METRICS" deltacast_bulk_local_bytes_total)" -ge $((2 * local_bytes)) ] ||
	fail "the relay's anchor did not go by reference"
grep -q "takes version 1 (.*, local)" "$TMP/r.log" || fail "r: its consumer did not come over its unix socket"
check_metric r deltacast_bulk_local_bytes_total "$anchor"
stop_broker r

# A second broker in this network namespace on the same --bulk port (on
# another address) cannot have the unix socket of that name, and its
# consumer, whose token the first broker refuses there, goes over to the
# second's TCP port for the same transfer.
port=$(sed -n 's/.*bulk anchors on 127.0.0.1:\([0-9]*\)$/\1/p' "$TMP/d.log" | head -1)
start_broker_metrics e --heartbeat-ms 200 --producers 'tcp://127.0.0.2:*' --consumers 'tcp://127.0.0.2:*' \
	--bulk "127.0.0.2:$port" --data-dir "$TMP/e"
grep -q "bulk: local listener @deltacast-bulk-$port: Address already in use; consumers on this host connect over TCP" \
	"$TMP/e.log" || fail "e: the taken socket name was not logged: $(grep 'bulk' "$TMP/e.log")"
"$BUILD/deltacast" publish --broker "$e_PROD" --model sm "$TMP"/trace/v000*.safetensors \
	2>"$TMP/e.pub.err" || fail "publish to e: $(cat "$TMP/e.pub.err")"
subscribe s8 e
grep -q "bulk: the unix socket of port $port closed before the first frame of version 1 (another broker's socket of that name?): over TCP instead" \
	"$TMP/s8.err" || fail "s8: no fallback to TCP logged: $(grep 'bulk' "$TMP/s8.err")"
over_bulk s8
grep -q "takes version 1 (.*, copy)" "$TMP/e.log" || fail "e: its consumer did not come over TCP"
grep -q "bulk: token [0-9a-f]* .*: connection closed" "$TMP/d.log" || fail "d: the stranger's token was not refused"
start_broker_metrics r2 --heartbeat-ms 200 --upstream "$e_CONS" --upstream-model sm
subscribe s9 r2
grep -q "bulk: the unix socket of port $port closed before the first frame of version 1 .*: over TCP instead" \
	"$TMP/r2.log" || fail "relay r2: no fallback to TCP logged: $(grep 'bulk' "$TMP/r2.log")"
grep -q "relay sm: version 1 came over the bulk connection" "$TMP/r2.log" || fail "relay r2: not over bulk"
stop_broker r2
stop_broker e
stop_broker d

# --bulk-no-local: TCP.
broker t --data-dir "$TMP/t" --bulk-no-local
grep -q "@deltacast-bulk" "$TMP/t.log" && fail "a local listener with --bulk-no-local"
subscribe s6 t
grep -q "takes version 1 (.*, copy)" "$TMP/t.log" || fail "t: not over TCP"
check_metric t deltacast_bulk_local_bytes_total 0
stop_broker t
echo "test_bulk_local: ok"
