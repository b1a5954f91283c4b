#!/usr/bin/env bash
# Bulk anchors (--bulk): a consumer that says x-bulk takes the anchor over
# a TCP connection with every chunk's checksum good and the COMMIT's
# counts met, then the deltas over ZeroMQ; from the segment files
# (--data-dir) and from memory.  --bulk-send: to this host (auto) and with
# copy, payloads in files are read (never mapped), then sent with send(),
# and a segment cut short fails the transfer naming where the file ends;
# with sendfile, with sendfile(2); any other
# value is refused at start.  A connection closed mid-way, or one that
# names a token never offered, is closed by the broker, which goes on: the
# consumer re-joins without x-bulk and takes the anchor over ZeroMQ.  A
# consumer without x-bulk, or a broker without --bulk, uses ZeroMQ only;
# --bulk with CURVE and a bad address are refused at start.  Connections
# that are not a transfer (an HTTP request, silence, more than the slots)
# are closed and leave the broker serving.
. "$(dirname "$0")/tools/broker_lib.sh"

# receive NAME BROKER [ARGS...]: a receiver of "bk" to version 3; waits.
receive() {
	local name=$1 b=$2 cons
	shift 2
	eval "cons=\$${b}_CONS"
	"$WC" receive "$cons" bk --until 3 --window 4194304 --timeout-ms 20000 --verify 1 "$@" \
		>"$TMP/$name.out" 2>"$TMP/$name.err" || fail "$name exited $?: $(tail -2 "$TMP/$name.err")"
	grep -q "^received 3 chunks" "$TMP/$name.out" || fail "$name: $(cat "$TMP/$name.out")"
}

# publish BROKER [ELEMS]: versions 1 (the anchor) to 3 of "bk", 3
# tensors of ELEMS (262144) elements, acknowledged.
publish() {
	local prod
	eval "prod=\$${1}_PROD"
	"$WC" produce "$prod" bk --versions 3 --elems "${2:-262144}" >"$TMP/$1.prod.out" 2>&1 ||
		fail "producer to $1: $(tail -2 "$TMP/$1.prod.out")"
}

# An anchor of 48 MiB: more than loopback's socket buffers hold, so a
# transfer abandoned after 2 frames is still under way at the broker.
start_broker_metrics disk --heartbeat-ms 200 --bulk 127.0.0.1:0 --data-dir "$TMP/disk"
grep -q "bulk anchors on 127.0.0.1:[1-9]" "$TMP/disk.log" || fail "no bulk listener logged"
publish disk 8388608
receive r1 disk --bulk 1
wait_metric disk deltacast_bulk_versions_total 1
grep -q "bulk: consumer wire_client-[0-9]* of bk has version 1" "$TMP/disk.log" ||
	fail "the anchor did not go over bulk"
grep -q "bulk failed" "$TMP/r1.err" && fail "r1: $(cat "$TMP/r1.err")"
bytes=$(metric_of "$disk_METRICS" deltacast_bulk_bytes_total)
[ "$bytes" -gt 50331648 ] || fail "bulk bytes $bytes: less than the anchor's 48 MiB"
grep -q "bulk: consumer wire_client-[0-9]* of bk takes version 1 (.*, copy)" "$TMP/disk.log" ||
	fail "auto did not copy to a consumer on this host"
check_metric disk deltacast_bulk_sendfile_bytes_total 0

# Closed after 2 frames by the consumer: the broker closes its end and
# goes on; the re-join takes the anchor over ZeroMQ.
receive r2 disk --bulk 1 --bulk-stop-after 2
grep -q "bulk failed: --bulk-stop-after" "$TMP/r2.err" || fail "r2: $(cat "$TMP/r2.err")"
wait_for 10 grep -qs "its consumer re-joined or left: connection closed\|frame [0-9]*: .*connection closed" \
	"$TMP/disk.log" || fail "the broker did not close the abandoned transfer"

# A token never offered: closed at once, and the same fallback.
receive r3 disk --bulk 1 --bulk-bad-token 1
grep -q "was never offered or is withdrawn: connection closed" "$TMP/disk.log" ||
	fail "a bad token was not refused"
grep -q "bulk failed" "$TMP/r3.err" || fail "r3 did not see its transfer fail"

# Not the bulk opening (an HTTP request): logged and closed at once.  A
# connection that says nothing, and 70 of them at once (more than the 64
# slots): each closed by its deadline (3 heartbeats) or at once, and the
# broker goes on serving.
# closed FD: the broker closed FD's connection (EOF or reset) within 5 s.
closed() {
	timeout 5 cat <&"$1" >/dev/null 2>&1
	[ $? != 124 ]
}
port=$(sed -n 's/.*bulk anchors on 127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/disk.log" | tail -n 1)
exec 3<>"/dev/tcp/127.0.0.1/$port" || fail "no bulk port $port"
printf 'GET / HTTP/1.0\r\n\r\n' >&3
closed 3 || fail "the broker kept an HTTP request's connection open"
exec 3<&-
grep -q 'a connection that does not start with "DCB1": closed' "$TMP/disk.log" || fail "HTTP not logged"
fds=()
for i in $(seq 70); do exec {fd}<>"/dev/tcp/127.0.0.1/$port" || fail "connection $i"; fds+=("$fd"); done
for fd in "${fds[@]}"; do closed "$fd" || fail "a silent connection stayed open"; exec {fd}<&-; done
receive r3b disk --bulk 1
grep -q "bulk failed" "$TMP/r3b.err" && fail "r3b: $(cat "$TMP/r3b.err")"

# Without x-bulk: ZeroMQ only.
n=$(metric_of "$disk_METRICS" deltacast_bulk_versions_total)
receive r4 disk
check_metric disk deltacast_bulk_versions_total "$n"
stop_broker disk

# From memory (no --data-dir).
start_broker_metrics mem --heartbeat-ms 200 --bulk 127.0.0.1:0
publish mem
receive r5 mem --bulk 1
wait_metric mem deltacast_bulk_versions_total 1
stop_broker mem

# --bulk-send sendfile: the payloads from the page cache with sendfile(2).
start_broker_metrics sf --heartbeat-ms 200 --bulk 127.0.0.1:0 --bulk-send sendfile --data-dir "$TMP/sf"
publish sf 8388608
receive r7 sf --bulk 1
wait_metric sf deltacast_bulk_versions_total 1
grep -q "takes version 1 (.*, sendfile)" "$TMP/sf.log" || fail "sf: no sendfile transfer logged"
bytes=$(metric_of "$sf_METRICS" deltacast_bulk_sendfile_bytes_total)
[ "$bytes" -ge 50331648 ] || fail "sendfile bytes $bytes: less than the anchor's 48 MiB"
stop_broker sf

# --bulk-send copy: each payload read from its file (pread into the
# transfer's buffer), never mapped, then sent.  A segment cut short behind
# the broker's back: the read names the offset where the file ends, the
# transfer is closed, and the broker goes on serving.
start_broker_metrics cp --heartbeat-ms 200 --bulk 127.0.0.1:0 --bulk-send copy --data-dir "$TMP/cp"
publish cp 8388608
receive r8 cp --bulk 1
wait_metric cp deltacast_bulk_versions_total 1
grep -q "takes version 1 (.*, copy)" "$TMP/cp.log" || fail "cp: no copy transfer logged"
check_metric cp deltacast_bulk_sendfile_bytes_total 0
check_metric cp deltacast_disk_mapped_bytes_total 0
read=$(metric_of "$cp_METRICS" deltacast_disk_read_bytes_total)
[ "$read" -ge 50331648 ] || fail "cp: $read payload bytes read, less than the anchor's 48 MiB"
seg=$(ls -S "$TMP"/cp/bk-*/seg-*.log 2>/dev/null | head -n 1)
[ -n "$seg" ] || fail "cp: no segment file in $(ls -R "$TMP/cp")"
truncate -s 4194304 "$seg"
"$WC" receive "$cp_CONS" bk --until 1 --timeout-ms 1500 --bulk 1 >"$TMP/r9.out" 2>"$TMP/r9.err" &&
	fail "r9 took version 1 from a segment cut short: $(cat "$TMP/r9.out")"
grep -q "bulk: version 1, chunk [0-9]*: .*segment.*ends\|bulk: version 1, chunk [0-9]*: .*segment.*short" "$TMP/cp.log" ||
	fail "cp: the short read was not logged"
check_metric cp deltacast_bulk_versions_total 1
stop_broker cp

# A broker without --bulk ignores x-bulk.
start_broker_metrics off --heartbeat-ms 200
publish off
receive r6 off --bulk 1
check_metric off deltacast_bulk_versions_total 0
stop_broker off

# Refused at start, naming the problem.
"$BUILD/deltacast" keygen -o "$TMP/key" >/dev/null 2>&1 || fail "keygen"
"$BROKER" --producers 'tcp://127.0.0.1:*' --consumers 'tcp://127.0.0.1:*' --bulk 127.0.0.1:0 \
	--curve-secret "$TMP/key.secret" --producer-keys /dev/null 2>"$TMP/curve.err" &&
	fail "--bulk with --curve-secret started"
grep -q -- "--bulk with --curve-secret" "$TMP/curve.err" || fail "curve: $(cat "$TMP/curve.err")"
"$BROKER" --producers 'tcp://127.0.0.1:*' --consumers 'tcp://127.0.0.1:*' --bulk nowhere 2>"$TMP/addr.err" &&
	fail "--bulk nowhere started"
grep -q -- '--bulk "nowhere": want HOST:PORT' "$TMP/addr.err" || fail "addr: $(cat "$TMP/addr.err")"
"$BROKER" --producers 'tcp://127.0.0.1:*' --consumers 'tcp://127.0.0.1:*' --bulk 127.0.0.1:0 \
	--bulk-send splice 2>"$TMP/send.err" && fail "--bulk-send splice started"
grep -q -- "--bulk-send must be auto, sendfile or copy" "$TMP/send.err" || fail "send: $(cat "$TMP/send.err")"
echo "PASS"
