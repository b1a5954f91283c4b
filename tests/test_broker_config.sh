#!/usr/bin/env bash
# Broker configuration: --help lists the flags, --version names the
# package version; a missing endpoint, a relay
# without a model, a bad number, a read cache over its cap, an unknown
# config key each fail at start
# (exit 2) with a message naming the problem; a --config file alone starts
# the broker, which a flow then uses; SIGTERM exits 0.
. "$(dirname "$0")/tools/broker_lib.sh"

"$BROKER" --help >"$TMP/help.out" || fail "--help exited $?"
for f in producers consumers upstream upstream-model retain-versions part-timeout-ms heartbeat-ms; do
	grep -q -- "--$f" "$TMP/help.out" || fail "--help does not list --$f"
done
V=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$(dirname "$0")/../python/deltacast/_version.py")
[ "$("$BROKER" --version)" = "deltacast-broker $V (wire protocol 2)" ] ||
	fail "--version: $("$BROKER" --version 2>&1 | head -2)"
expect_refusal() { # MESSAGE ARGS...
	local msg=$1 rc
	shift
	"$BROKER" "$@" 2>"$TMP/refusal.err"
	rc=$?
	[ $rc = 2 ] || fail "broker $* exited $rc, expected 2"
	grep -q -- "$msg" "$TMP/refusal.err" || fail "no clear message for $*: $(cat "$TMP/refusal.err")"
}
expect_refusal "--consumers ENDPOINT is required" --producers tcp://127.0.0.1:1
expect_refusal "--upstream needs at least one --upstream-model" --producers tcp://127.0.0.1:1 --consumers tcp://127.0.0.1:2 --upstream tcp://127.0.0.1:3
expect_refusal "--heartbeat-ms: \"abc\" is not an unsigned integer" --producers a --consumers b --heartbeat-ms abc
expect_refusal "unknown argument \"--nope\"" --nope 1
expect_refusal "--read-cache-bytes must be at most 67108864" --producers a --consumers b --read-cache-bytes 67108865
printf 'producers = tcp://127.0.0.1:1\nbogus = 1\n' >"$TMP/bad.conf"
expect_refusal "bad.conf:2: unknown setting \"bogus\"" --config "$TMP/bad.conf"

for try in $(seq 0 9); do
	port=$((10000 + (($$ * 17 + try * 7919 + RANDOM) % 10000) * 2))
	printf '# test config\nproducers = tcp://127.0.0.1:%d\nconsumers = tcp://127.0.0.1:%d\nheartbeat-ms = 250\n' \
		"$port" $((port + 1)) >"$TMP/good.conf"
	"$BROKER" --config "$TMP/good.conf" 2>"$TMP/b.log" &
	pid=$!
	wait_for 5 grep -qs "consumers on" "$TMP/b.log" && kill -0 "$pid" 2>/dev/null && break
	kill -9 "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	pid=
done
[ -n "$pid" ] || fail "broker with --config did not start"
PIDS+=("$pid")
"$WC" produce "tcp://127.0.0.1:$port" m9 --versions 3 --elems 4096 2>"$TMP/p.err" || fail "producer exited $?"
"$WC" consume "tcp://127.0.0.1:$((port + 1))" m9 --until 3 --elems 4096 >"$TMP/c.out" 2>"$TMP/c.err" || fail "consumer exited $?"
grep -q "applied=3 .*bit-exact" "$TMP/c.out" || fail "consumer: $(cat "$TMP/c.out")"
kill -TERM "$pid"
wait "$pid" || fail "SIGTERM exit $?"
echo "test_broker_config: ok"
