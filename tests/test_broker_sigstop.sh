#!/usr/bin/env bash
# Broker: one consumer stopped with SIGSTOP holds only its own cursor.  The
# others receive every version while it is stopped (compared by versions and
# bytes delivered, not time); after SIGCONT it is dropped-and-rejoins and
# also ends bit-exact.
. "$(dirname "$0")/tools/broker_lib.sh"

start_broker_metrics b --heartbeat-ms 200
bg slow "$WC" consume "$b_CONS" m6 --until 30 --window 65536 --stats "$TMP/slow.stats"
SLOW=$LAST_PID
for i in 1 2 3; do
	bg "c$i" "$WC" consume "$b_CONS" m6 --until 30 --stats "$TMP/c$i.stats"
	CP[$i]=$LAST_PID
done
wait_consumers b 4
"$WC" produce "$b_PROD" m6 --versions 1 2>"$TMP/p1.err" || fail "producer (v1) exited $?"
wait_for 20 grep -qs "applied=1 " "$TMP/slow.stats" || fail "slow consumer never applied version 1"
kill -STOP "$SLOW"
"$WC" produce "$b_PROD" m6 --versions 30 2>"$TMP/p2.err" || fail "producer exited $? while a consumer was stopped"
for i in 1 2 3; do
	wait "${CP[$i]}" || fail "consumer $i exited $?"
	grep -q "applied=30 versions=30 .*bit-exact" "$TMP/c$i.out" || fail "consumer $i: $(cat "$TMP/c$i.out")"
done
fast_bytes=$(stat_of "$TMP/c1.stats" bytes)
slow_bytes=$(stat_of "$TMP/slow.stats" bytes)
slow_applied=$(stat_of "$TMP/slow.stats" applied)
echo "delivered while stopped: others $fast_bytes bytes (30 versions), stopped one $slow_bytes bytes ($slow_applied versions)"
[ "$slow_applied" -lt 30 ] && [ "$slow_bytes" -lt "$fast_bytes" ] || fail "the stopped consumer was not behind"
kill -CONT "$SLOW"
wait "$SLOW" || fail "stopped consumer did not catch up after SIGCONT ($?)"
grep -q "applied=30 .*bit-exact" "$TMP/slow.out" || fail "slow: $(cat "$TMP/slow.out")"
stop_broker b

# The broker itself stopped for longer than 3 heartbeats (as a long fsync
# stalls its loop): it notices, and drops no peer as silent, since they kept
# sending.  (Stopped in zmq_poll, even the old broker read the queue before
# its timers; a stall inside a commit, with the consumers' poll results
# stale, is the case the one-turn wait is for.)
start_broker_metrics s
bg w "$WC" consume "$s_CONS" m7 --until 1
W=$LAST_PID
wait_consumers s 1
kill -STOP "$s_PID"
sleep 3.5 # the scenario: stopped for 3.5 heartbeats (1 s by default), not a wait
kill -CONT "$s_PID"
wait_for 5 grep -q "event loop busy" "$TMP/s.log" || fail "broker s did not notice its own stall"
"$WC" produce "$s_PROD" m7 --versions 1 2>"$TMP/p3.err" || fail "producer to broker s exited $?"
wait "$W" || fail "consumer of broker s exited $?"
check_metric s deltacast_peers_timed_out_total 0 # no peer dropped for the broker's own stall
grep -q "applied=1 .*bit-exact" "$TMP/w.out" || fail "consumer of broker s: $(cat "$TMP/w.out")"
stop_broker s
echo "test_broker_sigstop: ok"
