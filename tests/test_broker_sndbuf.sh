#!/usr/bin/env bash
# Broker: --consumer-sndbuf-bytes sets the kernel send buffer (SO_SNDBUF) of
# every consumer connection, read back from the kernel (ss: skmem tb, which
# Linux keeps at twice the value asked), both where ZeroMQ binds the
# endpoint (--io-threads 1) and where the broker's own listeners do
# (--io-threads 2, broker/listen.c); a consumer streams versions bit-exact
# through it; a value out of range is refused at start, naming the flag.
. "$(dirname "$0")/tools/broker_lib.sh"

command -v ss >/dev/null || { echo "test_broker_sndbuf: skip: no ss (iproute2) to read socket buffers"; exit 77; }
BYTES=24576

expect_refusal() { # ARGS...
	local rc
	"$BROKER" --producers tcp://127.0.0.1:1 --consumers tcp://127.0.0.1:2 "$@" 2>"$TMP/refusal.err"
	rc=$?
	[ $rc = 2 ] || fail "broker $* exited $rc, expected 2"
	grep -q -- "--consumer-sndbuf-bytes must be 0 or in \[4096, 2147483647\]" "$TMP/refusal.err" ||
		fail "no clear message for $*: $(cat "$TMP/refusal.err")"
}
expect_refusal --consumer-sndbuf-bytes 100
expect_refusal --consumer-sndbuf-bytes 2147483648

# tb_of PORT: the send buffer of the established connection on local PORT.
tb_of() { ss -tmnH state established "( sport = :$1 )" | sed -n 's/.*skmem:(.*,tb\([0-9]*\),.*/\1/p' | head -n 1; }

# tb_is PORT BYTES: that connection exists and its send buffer is BYTES.
tb_is() { [ "$(tb_of "$1")" = "$2" ]; }

for threads in 1 2; do
	start_broker b$threads --io-threads "$threads" --consumer-sndbuf-bytes "$BYTES"
	eval "prod=\$b${threads}_PROD cons=\$b${threads}_CONS"
	"$WC" produce "$prod" m --versions 3 --elems 65536 2>"$TMP/p$threads.err" || fail "producer exited $?"
	bg c$threads "$WC" consume "$cons" m --until 4 --elems 65536
	wait_for 10 tb_is "${cons##*:}" $((2 * BYTES)) ||
		fail "--io-threads $threads: consumer connection's send buffer $(tb_of "${cons##*:}"), want $((2 * BYTES))"
	kill -9 "$LAST_PID"
	"$WC" consume "$cons" m --until 3 --elems 65536 >"$TMP/c$threads.out" 2>"$TMP/c$threads.err" ||
		fail "consumer exited $?"
	grep -q "applied=3 .*bit-exact" "$TMP/c$threads.out" || fail "consumer: $(cat "$TMP/c$threads.out")"
	stop_broker b$threads
done
echo "test_broker_sndbuf: ok"
