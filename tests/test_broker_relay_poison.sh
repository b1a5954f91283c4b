#!/usr/bin/env bash
# A version its upstream's fold poisons is poisoned on a relay too.  The
# origin s (--anchor-every 1: every version checked) poisons v2, whose
# COMMIT carries a wrong digest; relay r (--anchor-fraction 0: its own fold
# checks nothing) logged v2 before the ERROR DCAST_EPOISONED that follows
# it on the same connection.  The relay marks v2 poisoned itself (log
# line, deltacast_versions_poisoned_total), so a consumer that joins it
# later is never sent v2 (wire_client dies on a digest that differs), and
# the next anchor v3 reaches that consumer.  Before, the relay joined
# again and went on serving v2.
. "$(dirname "$0")/tools/broker_lib.sh"

start_broker s --anchor-every 1 --heartbeat-ms 100
start_broker_metrics r --upstream "$s_CONS" --upstream-model poison --anchor-fraction 0 --heartbeat-ms 100
"$WC" produce "$s_PROD" poison --versions 1 >"$TMP/prod1.log" 2>&1 || fail "anchor v1: exit $?"
wait_for 10 grep -q "model poison: version 1 committed" "$TMP/r.log" || fail "the relay did not take v1"
"$WC" produce "$s_PROD" poison --versions 2 --bad-digest-at 2 --wait-error 1 --timeout-ms 10000 \
	>"$TMP/prod2.log" 2>&1
grep -q "ERROR DCAST_EPOISONED version 2:" "$TMP/prod2.log" ||
	fail "the origin did not poison v2: $(tail -2 "$TMP/prod2.log")"
wait_for 10 grep -q "model poison version 2 poisoned (DCAST_EPOISONED: the upstream poisoned it" "$TMP/r.log" ||
	fail "the relay did not poison v2: $(grep -m3 'version 2\|poison' "$TMP/r.log")"
check_metric r deltacast_versions_poisoned_total 1
late_takes_anchor "$r_CONS" "$s_PROD" poison 3
stop_broker r
stop_broker s
echo "test_broker_relay_poison: ok"
