#!/usr/bin/env bash
# Cut-through: producer -> broker a (--cut-through) -> relay r
# (--cut-through) -> consumer.  With the producer holding inside version 3
# (half of its chunks sent, no COMMIT), the relay's consumer has received
# chunks of 3 and applied only 2; after the COMMIT it applies 3 bit-exact,
# continuing the stream at the chunk it had reached; with --data-dir the
# chunks sent ahead are read from the spill file; a relay without the flag
# takes the chunks ahead from its upstream and holds them.  The same chain
# without --cut-through sends no chunk of 3 before the COMMIT.
. "$(dirname "$0")/tools/broker_lib.sh"

# chain NAME FLAGS...: broker NAMEa and its relay NAMEr, both with FLAGS.
chain() {
	local n=$1
	shift
	start_broker_metrics "${n}a" --heartbeat-ms 200 "$@"
	eval "UP=\$${n}a_CONS"
	start_broker_metrics "${n}r" --heartbeat-ms 200 --upstream "$UP" --upstream-model ct "$@"
}

# held NAME CONS: consumer NAME of CONS up to version 4, and a producer to
# broker PROD holding inside version 3 (sets CONS_PID, HOLD).
held() {
	bg "$1" "$WC" consume "$2" ct --until 4 --stats "$TMP/$1.stats"
	CONS_PID=$LAST_PID
	HOLD=$TMP/$1.go
	bg "$1p" "$WC" produce "$PROD" ct --versions 4 --hold-at 3 --hold-file "$HOLD"
	wait_for 20 grep -qs "holding inside version 3" "$TMP/$1p.err" || fail "producer never held in v3"
}

# go_on NAME: the producer finishes; consumer NAME applies 4, bit-exact.
go_on() {
	touch "$HOLD"
	wait "$CONS_PID" || fail "consumer $1 exited $?: $(tail -2 "$TMP/$1.err")"
	grep -q "applied=4 versions=4 anchors=1 .*bit-exact" "$TMP/$1.out" || fail "$1: $(cat "$TMP/$1.out")"
}

chain on --cut-through
PROD=$ona_PROD
held c1 "$onr_CONS"
wait_for 10 grep -qs "open=3 open_chunks=[1-9]" "$TMP/c1.stats" ||
	fail "no chunk of the open version 3 reached the relay's consumer: $(cat "$TMP/c1.stats")"
[ "$(stat_of "$TMP/c1.stats" applied)" = 2 ] || fail "consumer applied past 2: $(cat "$TMP/c1.stats")"
wait_metric ona deltacast_cut_through_chunks_total 1
wait_metric onr deltacast_cut_through_chunks_total 1
check_metric ona 'deltacast_model_version{model="ct"}' 2
go_on c1
check_metric onr deltacast_cut_through_aborted_total 0
grep -q "re-join" "$TMP/c1.err" && fail "consumer re-joined: $(grep re-join "$TMP/c1.err")"
stop_broker onr
stop_broker ona

# The upstream decides: a relay without the flag behind one with it gets
# the open version's chunks (its HELLO is the same) and keeps them until
# the COMMIT, as it would anything open.
start_broker_metrics mixa --heartbeat-ms 200 --cut-through
start_broker_metrics mixr --heartbeat-ms 200 --upstream "$mixa_CONS" --upstream-model ct
PROD=$mixa_PROD
held c4 "$mixr_CONS"
wait_for 10 grep -qs "applied=2 " "$TMP/c4.stats" || fail "consumer c4 not at v2"
wait_metric mixr deltacast_chunks_in_total "$(($(stat_of "$TMP/c4.stats" chunks) + 1))"
check_metric mixr deltacast_cut_through_chunks_total 0
grep -q "open=3" "$TMP/c4.stats" && fail "relay without --cut-through sent 3 early: $(cat "$TMP/c4.stats")"
go_on c4
stop_broker mixr
stop_broker mixa

# With --data-dir an open version's payloads go to a spill file as they
# arrive, and the chunks sent ahead are read from there.
start_broker_metrics disk --heartbeat-ms 200 --cut-through --data-dir "$TMP/disk"
PROD=$disk_PROD
held c3 "$disk_CONS"
wait_for 10 grep -qs "open=3 open_chunks=[1-9]" "$TMP/c3.stats" ||
	fail "no chunk of the open version 3 came from the spill file: $(cat "$TMP/c3.stats")"
go_on c3
grep -q "payloads stay in memory" "$TMP/disk.log" && fail "the open version was not spilled"
stop_broker disk

# Without --cut-through nothing of 3 goes before its COMMIT: the relay's
# consumer takes 1 and 2 whole, and the held version stays with broker a.
chain off
PROD=$offa_PROD
held c2 "$offr_CONS"
wait_for 10 grep -qs "applied=2 " "$TMP/c2.stats" || fail "consumer c2 not at v2"
wait_metric offa deltacast_chunks_in_total "$(($(stat_of "$TMP/c2.stats" chunks) + 1))"
grep -q "open=3" "$TMP/c2.stats" && fail "a chunk of open version 3 went out: $(cat "$TMP/c2.stats")"
check_metric offa deltacast_cut_through_chunks_total 0
check_metric offr deltacast_chunks_in_total "$(stat_of "$TMP/c2.stats" chunks)"
go_on c2
stop_broker offr
stop_broker offa
echo "test_broker_cut_through: ok"
