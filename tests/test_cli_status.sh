#!/usr/bin/env bash
# deltacast status and keygen against a real broker: keygen writes a key
# pair the broker accepts (--curve-secret / --producer-keys) and refuses to
# overwrite it; status prints the broker's totals, each model's version and
# anchor (a broker-made one here), and each consumer's version and lag, and
# fails clearly when nothing listens at --broker or when it is given one of
# the broker's ZeroMQ endpoints.
. "$(dirname "$0")/tools/broker_lib.sh"
CLI=$BUILD/deltacast

# keygen: a pair, 0600 secret, no overwrite without --force.
"$CLI" keygen -o "$TMP/srv" >"$TMP/kg.out" 2>&1 || fail "keygen exited $?: $(cat "$TMP/kg.out")"
"$CLI" keygen -o "$TMP/prod" >/dev/null 2>&1 || fail "keygen (producer) exited $?"
[ "$(stat -c %a "$TMP/srv.secret")" = 600 ] || fail "secret key file is not mode 0600"
grep -qE '^.{40}$' "$TMP/srv.public" || fail "public key file is not one 40-character key"
grep -qF "public key $(cat "$TMP/srv.public")" "$TMP/kg.out" || fail "keygen did not print the public key"
cp "$TMP/srv.secret" "$TMP/srv.secret.orig"
"$CLI" keygen -o "$TMP/srv" >"$TMP/kg2.out" 2>&1 && fail "keygen overwrote an existing key"
grep -q "srv.secret exists" "$TMP/kg2.out" || fail "keygen refusal unclear: $(cat "$TMP/kg2.out")"
cmp -s "$TMP/srv.secret" "$TMP/srv.secret.orig" || fail "refused keygen changed the secret"
"$CLI" keygen -o "$TMP/srv" --force >/dev/null 2>&1 || fail "keygen --force exited $?"
cmp -s "$TMP/srv.secret" "$TMP/srv.secret.orig" && fail "keygen --force kept the old key"
"$CLI" keygen >/dev/null 2>&1; [ $? = 2 ] || fail "keygen without -o is not a usage error"

# The broker takes the generated files.
start_broker k --curve-secret "$TMP/srv.secret" --producer-keys "$TMP/prod.public"
grep -q "auth: 1 key(s) from" "$TMP/k.log" || fail "broker did not load the generated public key"
stop_broker k

# status: nothing listening is a clear error, exit 1.
"$CLI" status --broker 127.0.0.1:1 >"$TMP/st0.out" 2>&1; rc=$?
[ $rc = 1 ] || fail "status without a broker exited $rc"
grep -q "connect: Connection refused" "$TMP/st0.out" || fail "status error unclear: $(cat "$TMP/st0.out")"
"$CLI" status >/dev/null 2>&1; [ $? = 2 ] || fail "status without --broker is not a usage error"

# A broker with metrics, a model with a made anchor, and a consumer.
start_broker_metrics s --anchor-every 5 --anchor-fraction 0
MADDR=$s_METRICS
"$WC" produce "$s_PROD" stm --versions 7 --density-ppm 50000 2>"$TMP/p.err" || fail "producer exited $?"
bg c "$WC" consume "$s_CONS" stm --until 1000 --density-ppm 50000 --stats "$TMP/c.stats"
wait_for 10 grep -qs "applied=7 " "$TMP/c.stats" || fail "consumer did not reach version 7"
wait_metric s 'deltacast_model_anchor_version{model="stm"}' 6 # made anchor 6
got_acks() { "$CLI" status --broker "$MADDR" >"$TMP/st.out" 2>&1 && grep -qE '^[0-9]+ +wire_client-[0-9]+ +stm +7 +0$' "$TMP/st.out"; }
wait_for 10 got_acks || fail "status has no consumer row at version 7, lag 0: $(cat "$TMP/st.out")"
grep -qE '^stm +7 +6 +2$' "$TMP/st.out" || fail "status model row (version 7, anchor 6, log 2): $(cat "$TMP/st.out")"
grep -q "versions: 7 committed, 0 aborted; anchors made by the broker: 1 " "$TMP/st.out" || fail "totals: $(cat "$TMP/st.out")"
grep -q "1 consumers connected" "$TMP/st.out" || fail "consumers connected: $(cat "$TMP/st.out")"
grep -q "errors: none" "$TMP/st.out" || fail "errors: $(cat "$TMP/st.out")"
"$CLI" status --broker "$MADDR" --raw >"$TMP/raw.out" || fail "status --raw exited $?"
grep -q '^deltacast_model_anchor_version{model="stm"} 6$' "$TMP/raw.out" || fail "raw metrics lack the anchor version"
grep -q '^deltacast_anchors_made_total 1$' "$TMP/raw.out" || fail "raw metrics lack anchors_made_total"
# One of the broker's ZeroMQ endpoints instead of its metrics address: said
# so, with the scheme (tcp://...) and without (HOST:PORT of the endpoint).
for ep in "$s_CONS" "${s_PROD#tcp://}"; do
	"$CLI" status --broker "$ep" >"$TMP/stz.out" 2>&1; rc=$?
	[ $rc = 1 ] || fail "status --broker $ep exited $rc"
	grep -q "is a ZeroMQ endpoint .*not the broker's --metrics address" "$TMP/stz.out" ||
		fail "status --broker $ep does not say it is a ZeroMQ endpoint: $(cat "$TMP/stz.out")"
done
stop_broker s
echo "test_cli_status: ok"
