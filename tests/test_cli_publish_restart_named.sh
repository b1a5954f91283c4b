#!/usr/bin/env bash
# deltacast publish after a restart, told nothing but the producer
# endpoint: the broker names its consumer endpoint in its WELCOME, bound
# on a wildcard address (tcp://0.0.0.0:PORT), and the new process fetches
# its baseline there, the wildcard host replaced by --broker's
# (127.0.0.1).  A subscriber that held version 3 receives 4 as a delta (its
# bytes a small share of the model) and ends with the file's tensors bit
# for bit; a late joiner still starts from the anchor.  --base and
# --no-fetch-base work without --consumers, and a fetch that fails fails
# the command, naming the endpoint.
. "$(dirname "$0")/tools/broker_lib.sh"
B=$BUILD tmp=$TMP
"$B/deltacast" gen-trace --params 3M --steps 4 --density 0.01 -o "$tmp/trace" 2>/dev/null ||
	fail "gen-trace"
f=("$tmp"/trace/v000*.safetensors)
"$BROKER" --producers 'tcp://127.0.0.1:*' --consumers 'tcp://0.0.0.0:*' 2>"$tmp/b.log" &
PIDS+=("$!")
wait_for 10 grep -q 'consumers on tcp://' "$tmp/b.log" || fail "the broker did not start"
prod=$(sed -n 's/.*producers on \(tcp:[^ ]*\)$/\1/p' "$tmp/b.log")
port=$(sed -n 's/.*consumers on tcp:\/\/0\.0\.0\.0:\([0-9]*\)$/\1/p' "$tmp/b.log")
[ -n "$port" ] || fail "the consumer endpoint is not bound on 0.0.0.0: $(cat "$tmp/b.log")"
cons=tcp://127.0.0.1:$port
bg sub "$B/deltacast" subscribe --broker "$cons" --model m --dir "$tmp/held" --until 4
sub=$LAST_PID

# a broker that holds nothing: nothing to fetch, 1 is an anchor
"$B/deltacast" publish --broker "$prod" --model m "${f[0]}" "${f[1]}" "${f[2]}" \
	2>"$tmp/pub1.err" || fail "publish 1..3: $(cat "$tmp/pub1.err")"
grep -q '^version 1 anchor' "$tmp/pub1.err" || fail "version 1 was not an anchor"
grep -q '^baseline' "$tmp/pub1.err" && fail "a baseline fetched from an empty broker"
wait_for 30 grep -q '^version 3 ' "$tmp/sub.out" || fail "the subscriber did not reach version 3"

"$B/deltacast" publish --broker "$prod" --model m --first-version 4 "${f[3]}" \
	2>"$tmp/pub2.err" || fail "publish 4 after a restart: $(cat "$tmp/pub2.err")"
cat "$tmp/pub2.err"
grep -q "^baseline version 3 fetched from $cons," "$tmp/pub2.err" ||
	fail "no baseline fetched from $cons (the named endpoint, its wildcard host replaced)"
grep -q '^version 4 delta' "$tmp/pub2.err" || fail "version 4 was not published as a delta"
wait "$sub" || fail "subscribe exited $?"
small_delta "$tmp/sub.out" 4 "${f[3]}"
same_tensors "$tmp/held/model.safetensors" "${f[3]}" || fail "the subscriber's version 4 differs"

late_joiner "$cons" "$tmp/late" 4 "${f[3]}"

# --base without --consumers: checked against the named endpoint's digests
"$B/deltacast" publish --broker "$prod" --base "${f[3]}" --model m --first-version 5 "${f[4]}" \
	2>"$tmp/pub3.err" || fail "publish 5 on --base: $(cat "$tmp/pub3.err")"
grep -q '^version 5 delta' "$tmp/pub3.err" || fail "version 5 on --base was not a delta"

"$B/deltacast" publish --broker "$prod" --no-fetch-base --model m --first-version 6 "${f[4]}" \
	2>"$tmp/pub4.err" || fail "publish 6: $(cat "$tmp/pub4.err")"
grep -q '^version 6 anchor' "$tmp/pub4.err" || fail "--no-fetch-base did not send an anchor"
grep -q '^baseline' "$tmp/pub4.err" && fail "--no-fetch-base fetched a baseline"

# --consumers still overrides the named endpoint: a wrong one fails the
# command, naming it, and publishes nothing
if "$B/deltacast" publish --broker "$prod" --consumers tcp://127.0.0.1:1 --timeout-ms 2000 \
	--model m --first-version 7 "${f[4]}" 2>"$tmp/pub5.err"; then
	fail "a fetch from a dead endpoint did not fail the command"
fi
grep -q -- '--consumers tcp://127.0.0.1:1: .*--no-fetch-base' "$tmp/pub5.err" ||
	fail "the failed fetch does not name the endpoint: $(cat "$tmp/pub5.err")"
# a broker that names no consumer endpoint (an ipc:// path with a space
# breaks WELCOME.x-consumers' rule; an older broker names none either): the
# version goes as an anchor, and publish says which flag would make it a delta
mkdir -p "$tmp/a b"
"$BROKER" --producers 'tcp://127.0.0.1:*' --consumers "ipc://$tmp/a b/c" 2>"$tmp/b2.log" &
PIDS+=("$!")
wait_for 10 grep -q 'consumers on ipc://' "$tmp/b2.log" || fail "the second broker did not start"
grep -q 'producers are not told the consumer endpoint' "$tmp/b2.log" ||
	fail "the broker did not say it names no consumer endpoint"
prod2=$(sed -n 's/.*producers on \(tcp:[^ ]*\)$/\1/p' "$tmp/b2.log")
"$B/deltacast" publish --broker "$prod2" --model m "${f[0]}" 2>"$tmp/pub6.err" ||
	fail "publish 1 to the second broker: $(cat "$tmp/pub6.err")"
"$B/deltacast" publish --broker "$prod2" --model m --first-version 2 "${f[1]}" \
	2>"$tmp/pub7.err" || fail "publish 2 to the second broker: $(cat "$tmp/pub7.err")"
grep -q '^the broker holds version 1 of m but names no consumer endpoint: .*--consumers' \
	"$tmp/pub7.err" || fail "no word of --consumers: $(cat "$tmp/pub7.err")"
grep -q '^version 2 anchor' "$tmp/pub7.err" || fail "version 2 was not an anchor"
echo "test_cli_publish_restart_named: ok"
