#!/usr/bin/env bash
# A measurement, not a test (its outcome depends on this
# machine's disk): 16 `deltacast subscribe` join one anchor at once, every
# setting at its default (1 s heartbeat).  Each stages, checks and applies
# the anchor, folds it into its checkpoint and exits (--until 1): 16
# processes writing and syncing the model together.  Prints how many the
# broker dropped as silent and how many re-joined; exits 1 only when a
# subscriber fails or misses the anchor.  CROWD_ELEMS sizes the model (bf16
# elements; default 100M = 201 MB), CROWD_N the consumers (16), CROWD_HB
# the broker's --heartbeat-ms (its default, 1000).  CROWD_STRICT=1 exits 1
# on any drop, re-join or refusal too (tests/test_consumer_crowd.sh).
# Run: tests/tools/crowd_join.sh
. "$(dirname "$0")/broker_lib.sh"

N=${CROWD_N:-16}
ELEMS=${CROWD_ELEMS:-100000000}
start_broker_metrics s --heartbeat-ms "${CROWD_HB:-1000}"
"$WC" produce "$s_PROD" crowd --tensors 8 --elems $((ELEMS / 8)) --versions 1 \
	>"$TMP/prod.log" 2>&1 || fail "producer exited $?"
SUBS=()
for i in $(seq 1 $N); do
	timeout 120 "$BUILD/deltacast" subscribe --broker "$s_CONS" --model crowd --dir "$TMP/w$i" --until 1 \
		>"$TMP/w$i.out" 2>"$TMP/w$i.err" &
	SUBS+=($!)
done
for i in $(seq 1 $N); do
	wait "${SUBS[$((i - 1))]}" || fail "subscriber $i exited $?"
	grep -q "^version 1 anchor " "$TMP/w$i.out" || fail "subscriber $i did not apply the anchor"
done
dropped=$(metric_of "$s_METRICS" deltacast_peers_timed_out_total)
rejoins=$(cat "$TMP"/w*.err | grep -c "re-joining\|reconnecting")
refused=$(cat "$TMP"/w*.err | grep -c "refused")
byes=$(grep -c 'said BYE' "$TMP/s.log")
stop_broker s
echo "crowd_join: $N consumers, $((ELEMS * 2 / 1000000)) MB anchor, heartbeat ${CROWD_HB:-1000} ms:" \
	"dropped as silent $dropped, re-joins $rejoins, refusals $refused, BYE $byes"
if [ -n "${CROWD_STRICT:-}" ] && [ "$dropped" != 0 -o "$rejoins" != 0 -o "$refused" != 0 ]; then
	fail "a consumer busy with the anchor was taken for silent, or refused it"
fi
