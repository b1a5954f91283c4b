#!/usr/bin/env bash
# Relays under CURVE: a chain A -> B -> C where each link is encrypted and
# each upstream admits only the relay listed in its --consumer-keys (A lists
# B's key, B lists C's); a producer publishes to A, a consumer of C gets
# every version bit-exact.  A relay D whose key A does not list is refused
# at the handshake, says so at E level, serves nothing, and joins once A
# lists it; a relay with a wrong server key says so.  A relay given only one
# of --upstream-server-key / --upstream-curve-secret does not start.
. "$(dirname "$0")/tools/broker_lib.sh"
CLI=$BUILD/deltacast

for k in a b c d prod cons; do
	"$CLI" keygen -o "$TMP/$k" >/dev/null 2>&1 || fail "keygen $k exited $?"
done
key() { cat "$TMP/$1.public"; }

# Start-up refusals: half a CURVE client, or a key that is not one.
# expect_refused WHAT TEXT FLAGS...: the broker exits non-zero, naming TEXT.
expect_refused() {
	local what=$1 text=$2
	shift 2
	"$BROKER" --producers 'tcp://127.0.0.1:*' --consumers 'tcp://127.0.0.1:*' \
		--upstream tcp://127.0.0.1:1 --upstream-model m8 "$@" >"$TMP/r.out" 2>&1 &&
		fail "$what: the broker started"
	grep -q -- "$text" "$TMP/r.out" || fail "$what: no clear error: $(cat "$TMP/r.out")"
}
expect_refused "server key alone" "--upstream-server-key needs --upstream-curve-secret" \
	--upstream-server-key "$(key a)"
expect_refused "secret alone" "--upstream-curve-secret needs --upstream-server-key" \
	--upstream-curve-secret "$TMP/b.secret"
expect_refused "bad server key" "--upstream-server-key \"short\": not a 40-character" \
	--upstream-server-key short --upstream-curve-secret "$TMP/b.secret"
expect_refused "missing key file" "--upstream-curve-secret: key file '$TMP/none'" \
	--upstream-server-key "$(key a)" --upstream-curve-secret "$TMP/none"

key b >"$TMP/a.consumers"
key c >"$TMP/b.consumers"
key cons >"$TMP/c.consumers"
# server_flags NAME: a broker serving under CURVE with its own key pair.
server_flags() {
	echo --curve-secret "$TMP/$1.secret" --producer-keys "$TMP/prod.public" \
		--consumer-keys "$TMP/$1.consumers"
}
# relay_flags NAME UPSTREAM: relay m8 from broker UPSTREAM with NAME's key pair.
relay_flags() {
	local cons
	eval "cons=\$${2}_CONS"
	echo --upstream "$cons" --upstream-model m8 --upstream-server-key "$(key "$2")" \
		--upstream-curve-secret "$TMP/$1.secret"
}
start_broker_metrics a $(server_flags a)
start_broker_metrics b $(server_flags b) $(relay_flags b a)
start_broker_metrics c $(server_flags c) $(relay_flags c b)
for r in b c; do
	wait_for 10 grep -q "relay m8: handshake with upstream .* done (CURVE, our key " "$TMP/$r.log" ||
		fail "relay $r: no CURVE handshake with its upstream"
	grep -q "not CURVE-encrypted" "$TMP/$r.log" && fail "relay $r: a plain upstream link"
done

CURVE_CONS=(--server-key "$(key c)" --secret "$TMP/cons.secret")
bg c1 "$WC" consume "$c_CONS" m8 --until 15 "${CURVE_CONS[@]}"
C1=$LAST_PID
wait_consumers c 1
"$WC" produce "$a_PROD" m8 --versions 15 --server-key "$(key a)" --secret "$TMP/prod.secret" \
	2>"$TMP/p.err" || fail "producer exited $?"
wait "$C1" || fail "consumer of C exited $?"
grep -q "applied=15 versions=15 anchors=1 .*bit-exact" "$TMP/c1.out" || fail "live: $(cat "$TMP/c1.out")"
"$WC" consume "$c_CONS" m8 --until 15 "${CURVE_CONS[@]}" >"$TMP/c2.out" 2>"$TMP/c2.err" ||
	fail "late consumer of C exited $?"
grep -q "applied=15 versions=15 anchors=1 .*bit-exact" "$TMP/c2.out" || fail "late: $(cat "$TMP/c2.out")"
for r in a b c; do
	check_metric "$r" deltacast_auth_refused_total 0
done

# Relay D: its key is not in A's --consumer-keys.  It says so at E level
# (once: the line repeats at most once a minute), tries again with a fresh
# connection every 3 heartbeats, and serves nothing.
start_broker_metrics d $(relay_flags d a) --heartbeat-ms 200
refused_line() { grep " E relay m8: upstream " "$TMP/d.log" | grep -F "upstream refused our key $(key d) "; }
wait_for 10 refused_line >/dev/null || fail "relay d: no E line saying the upstream refused its key"
grep "auth: refused consumers peer" "$TMP/a.log" | grep -qF "CURVE key $(key d) not listed" ||
	fail "A did not log the refusal of D's key"
wait_metric a deltacast_auth_refused_total 2 # D tried again
[ "$(refused_line | wc -l)" = 1 ] || fail "relay d: the refusal logged more than once: $(refused_line)"
grep -q "handshake with upstream .* done" "$TMP/d.log" && fail "relay d completed a handshake"
check_metric d deltacast_versions_committed_total 0
check_metric d 'deltacast_model_version{model="m8"}' ""

# Relay X takes B's public key for A's: A cannot open its HELLO and hangs up.
start_broker x --upstream "$a_CONS" --upstream-model m8 --upstream-server-key "$(key b)" \
	--upstream-curve-secret "$TMP/b.secret"
wait_for 10 grep -qF "E relay m8: upstream $a_CONS: CURVE handshake failed (the upstream closed the connection" "$TMP/x.log" ||
	fail "relay x: no E line about the failed CURVE handshake"
grep -qF "is --upstream-server-key $(key b) the upstream's public key" "$TMP/x.log" ||
	fail "relay x: the E line does not name the server key: $(grep ' E ' "$TMP/x.log")"
stop_broker x

# A restarted with D listed (same endpoints): D's next try is admitted and
# it relays bit-exact, with no restart of its own.
stop_broker a
key d >>"$TMP/a.consumers"
start_broker a2 $(server_flags a) --producers "$a_PROD" --consumers "$a_CONS"
wait_for 15 grep -q "relay m8: handshake with upstream .* done (CURVE, our key" "$TMP/d.log" ||
	fail "relay d was not admitted after A listed its key"
"$WC" produce "$a_PROD" m8 --versions 3 --server-key "$(key a)" --secret "$TMP/prod.secret" \
	2>"$TMP/p2.err" || fail "second producer exited $?"
"$WC" consume "$d_CONS" m8 --until 3 >"$TMP/d1.out" 2>"$TMP/d1.err" || fail "consumer of D exited $?"
grep -q "applied=3 versions=3 anchors=1 .*bit-exact" "$TMP/d1.out" || fail "relay d: $(cat "$TMP/d1.out")"
for r in d c b a2; do
	stop_broker "$r"
done
echo "test_broker_relay_curve: ok"
