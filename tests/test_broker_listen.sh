#!/usr/bin/env bash
# Broker: a TCP endpoint is bound once per ZeroMQ I/O thread (broker/listen.c:
# SO_REUSEPORT listeners, each handing its connections to its own thread, so
# that consumers joining at once do not all land on one thread).  With
# --io-threads 4 it says so (4 listeners on one port, each flag); a second
# broker asked for the same port is refused, naming the flag and the port,
# and the first keeps serving; 12 consumers joining at once are all served
# bit-exact; once the broker has stopped, one started on that port number
# binds it again.
. "$(dirname "$0")/tools/broker_lib.sh"

start_broker a --io-threads 4 --log-level debug
grep -q "consumers: 4 listeners on one port" "$TMP/a.log" || fail "no 4 consumer listeners"
grep -q "producers: 4 listeners on one port" "$TMP/a.log" || fail "no 4 producer listeners"
port=${a_CONS##*:}

"$BROKER" --producers 'tcp://127.0.0.1:*' --consumers "tcp://127.0.0.1:$port" 2>"$TMP/b.err" &&
	fail "a second broker bound the consumers' port $port"
grep -q -- "--consumers tcp://127.0.0.1:$port: bind: Address already in use" "$TMP/b.err" ||
	fail "the second broker's refusal: $(tail -n 3 "$TMP/b.err")"

"$WC" produce "$a_PROD" m --versions 3 --elems 16384 2>"$TMP/p.err" || fail "producer exited $?"
CONS=()
for i in $(seq 12); do
	bg c$i "$WC" consume "$a_CONS" m --until 3 --elems 16384
	CONS+=("$LAST_PID")
done
for i in $(seq 12); do
	wait "${CONS[$((i - 1))]}" || fail "consumer $i exited $?"
	grep -q "applied=3 .*bit-exact" "$TMP/c$i.out" || fail "consumer $i: $(cat "$TMP/c$i.out")"
done
stop_broker a

"$BROKER" --producers 'tcp://127.0.0.1:*' --consumers "tcp://127.0.0.1:$port" --io-threads 4 2>"$TMP/r.log" &
PIDS+=($!)
wait_for 10 grep -q "consumers on tcp://127.0.0.1:$port" "$TMP/r.log" || fail "port $port not bound again: $(tail -n 3 "$TMP/r.log")"
echo "test_broker_listen: ok"
