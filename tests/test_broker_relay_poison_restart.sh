#!/usr/bin/env bash
# A relay that was down when its upstream poisoned a version it keeps on
# disk learns of the poison when it joins again.  The origin s folds every
# 2 deltas (--anchor-every 2), so v2, whose COMMIT carries a wrong digest,
# is served and only found bad when v3 commits.  Relay r (--data-dir,
# --anchor-fraction 0: it checks nothing itself) keeps v1 and v2 and is
# stopped; v3 then poisons v2 at the origin.  Started again on its data
# dir, r joins with HELLO(have_version 2), and the origin answers, after
# its WELCOME, ERROR DCAST_EPOISONED naming v2: r cuts v2 off (log line,
# deltacast_versions_poisoned_total), so a consumer joining r is never
# sent v2 (wire_client dies on a digest that differs) and takes the next
# anchor v4.  Before, the restarted relay served v2 from its data dir.
# The relay stays joined after the ERROR (it held no open version), so it
# does not hear it again and again.
. "$(dirname "$0")/tools/broker_lib.sh"

R_ARGS=(--data-dir "$TMP/rdata" --anchor-fraction 0 --heartbeat-ms 100)
start_broker s --anchor-every 2 --anchor-fraction 0 --heartbeat-ms 100
start_broker_metrics r --upstream "$s_CONS" --upstream-model poison "${R_ARGS[@]}"
"$WC" produce "$s_PROD" poison --versions 1 >"$TMP/prod1.log" 2>&1 || fail "anchor v1: exit $?"
"$WC" produce "$s_PROD" poison --versions 2 --bad-digest-at 2 >"$TMP/prod2.log" 2>&1 ||
	fail "v2 (not checked yet): exit $?"
wait_for 10 grep -q "model poison: version 2 durable" "$TMP/r.log" || fail "the relay did not keep v2 on disk"
stop_broker r
"$WC" produce "$s_PROD" poison --versions 3 --wait-error 1 --timeout-ms 10000 >"$TMP/prod3.log" 2>&1
grep -q "ERROR DCAST_EPOISONED version 2:" "$TMP/prod3.log" ||
	fail "the origin did not poison v2 at v3's fold: $(tail -2 "$TMP/prod3.log")"
start_broker_metrics r --upstream "$s_CONS" --upstream-model poison "${R_ARGS[@]}"
wait_for 10 logged_since "$TMP/r.log" "$START_FROM" \
	"model poison version 2 poisoned (DCAST_EPOISONED: the upstream poisoned it" ||
	fail "the restarted relay did not poison v2: $(tail -n +"$START_FROM" "$TMP/r.log" | grep -m3 'version 2\|poison')"
check_metric r deltacast_versions_poisoned_total 1
late_takes_anchor "$r_CONS" "$s_PROD" poison 4
joins=$(tail -n +"$START_FROM" "$TMP/r.log" | grep -c "relay poison: HELLO to")
[ "$joins" -le 2 ] || fail "the restarted relay joined $joins times: $(tail -n +"$START_FROM" "$TMP/r.log" | grep -m5 'HELLO to')"
stop_broker r
stop_broker s
echo "test_broker_relay_poison_restart: ok"
