#!/usr/bin/env bash
# Run identity: a worker directory holding version 5 of
# an earlier run, joined to a broker serving a new run of the same model
# name (versions 1..3, other weights), drops its state with a log line and
# ends at the new run's version 3, digests checked; it did not exit at once
# holding the old run's version 5.  A broker restarted on its data dir
# keeps its run, and says so ("restored from DIR, run R", not "created"):
# a worker at its newest version keeps its state.  Damaged
# run files (the broker's and the worker's) are found, not misread.
. "$(dirname "$0")/tools/broker_lib.sh"

sub() { # DIR UNTIL OUT
	timeout 60 "$BUILD/deltacast" subscribe --broker "$s_CONS" --model r --dir "$1" --until "$2" \
		>"$3.out" 2>"$3.err" || fail "subscribe $3 exited $?: $(tail -3 "$3.err")"
}

start_broker s
"$WC" produce "$s_PROD" r --versions 5 --seed 1 >"$TMP/p1.log" 2>&1 || fail "first run's producer"
sub "$TMP/w" 5 "$TMP/a"
stop_broker s
start_broker s
"$WC" produce "$s_PROD" r --versions 3 --seed 2 >"$TMP/p2.log" 2>&1 || fail "second run's producer"
sub "$TMP/w" 3 "$TMP/b"
grep -q "^loaded version 5" "$TMP/b.out" || fail "the old run's state was not there: $(cat "$TMP/b.out")"
grep -q "belongs to run .* dropped" "$TMP/b.err" || fail "no line saying the old run's state was dropped"
! grep -q "could not rebuild" "$TMP/b.err" || fail "a run change logged as a fault: $(grep -m1 'could not' "$TMP/b.err")"
grep -q "^version 1 anchor" "$TMP/b.out" && grep -q "^version 3 delta" "$TMP/b.out" ||
	fail "not the new run's anchor and version 3: $(cat "$TMP/b.out")"
stop_broker s

start_broker d --data-dir "$TMP/data"
s_PROD=$d_PROD s_CONS=$d_CONS
"$WC" produce "$s_PROD" r --versions 3 --seed 3 >"$TMP/p3.log" 2>&1 || fail "third run's producer"
sub "$TMP/w2" 3 "$TMP/c"
run_d=$(sed -n 's/.*model r: created, run \([0-9a-f]*\)$/\1/p' "$TMP/d.log")
kill -9 "$d_PID"; wait "$d_PID" 2>/dev/null
start_broker d --data-dir "$TMP/data"
s_CONS=$d_CONS
restart_log=$(tail -n +"$START_FROM" "$TMP/d.log")
grep -q "model r: restored from $TMP/data, run $run_d$" <<<"$restart_log" ||
	fail "restart does not say it restored run $run_d: $(grep -m2 'model r' <<<"$restart_log")"
! grep -q "model r: created" <<<"$restart_log" || fail "a restored model logged as created"
sub "$TMP/w2" 3 "$TMP/d"
! grep -q "dropped" "$TMP/d.err" || fail "state dropped across a broker restart on its data dir"
[ "$(grep -c '^version' "$TMP/d.out")" = 0 ] || fail "fetched again: $(cat "$TMP/d.out")"

# A damaged run file is found, never read as another run: the broker's
# (one flipped hex digit) gives a new run, logged; the worker's (damaged
# too) makes its state of no known run, dropped for the new run's anchor.
kill -9 "$d_PID"; wait "$d_PID" 2>/dev/null
flip_hex() { sed -i '1s/^\(deltacast-run .\)./\1x/' "$1"; }
flip_hex "$(ls "$TMP"/data/runs/* | head -1)"
flip_hex "$TMP/w2/run"
start_broker d --data-dir "$TMP/data"
s_CONS=$d_CONS
grep -q "run id lost (.*damaged file" "$TMP/d.log" || fail "the broker read a damaged run file"
"$WC" produce "$d_PROD" r --versions 4 --seed 3 >"$TMP/p4.log" 2>&1 || fail "producer after the new run"
sub "$TMP/w2" 4 "$TMP/e"
grep -q "run id lost" "$TMP/e.err" || fail "the worker read a damaged run file: $(cat "$TMP/e.err")"
grep -q "belongs to no known run.* dropped" "$TMP/e.err" || fail "state of no known run kept"
grep -q "^version 4 " "$TMP/e.out" || fail "not at the new run's version 4: $(cat "$TMP/e.out")"
stop_broker d
echo "test_consumer_run: ok"
