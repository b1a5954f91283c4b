#!/usr/bin/env bash
# Only producers create models: consumers naming models
# that do not exist take no model slot, so they cannot lock trainers out
# (--max-models 2 here; 8 such consumers filled the table before), and a
# consumer that joined before its model existed streams it, bit-exact,
# once a producer creates it (with a second WELCOME naming the run).
. "$(dirname "$0")/tools/broker_lib.sh"

start_broker_metrics s --max-models 2
GHOSTS=()
for i in 1 2 3 4 5 6 7 8; do
	"$WC" consume "$s_CONS" "ghost$i" --until 1 --timeout-ms 60000 >"$TMP/ghost$i.log" 2>&1 &
	GHOSTS+=($!)
done
"$WC" consume "$s_CONS" later --until 3 >"$TMP/later.log" 2>&1 &
later=$!
# deltacast subscribe counts only versions of a confirmed run: the WELCOME
# it got while waiting names none, so it must get another naming the run.
timeout 60 "$BUILD/deltacast" subscribe --broker "$s_CONS" --model later --dir "$TMP/sub" --until 3 \
	>"$TMP/sub.out" 2>"$TMP/sub.err" &
sub=$!
# all 10 joined (no model exists yet: each waits for a producer to create it)
wait_consumers s 10
"$WC" produce "$s_PROD" real --versions 2 >"$TMP/real.log" 2>&1 || fail "producer of a new model refused"
"$WC" produce "$s_PROD" later --versions 3 >"$TMP/prod.log" 2>&1 || fail "producer of 'later' refused"
wait "$later" || fail "the waiting consumer did not reach version 3 bit-exact"
wait "$sub" || fail "the waiting subscriber did not end at version 3 of the run: $(tail -2 "$TMP/sub.err")"
grep -q "model later now exists" "$TMP/s.log" || fail "no attach line"
! grep -q "model ghost" "$TMP/s.log" || fail "a consumer created a model: $(grep -m1 'model ghost' "$TMP/s.log")"
kill "${GHOSTS[@]}" 2>/dev/null
stop_broker s
echo "test_broker_waiting: ok"
