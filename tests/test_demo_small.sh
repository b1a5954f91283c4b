#!/usr/bin/env bash
# scripts/demo.sh with a 2M-parameter model: every consumer (one joining
# late, one SIGKILLed and restarted) ends with the producer's last version,
# and no process the demo started is left running.
set -u
out=$(mktemp /tmp/dcast-test-demo-XXXXXX)
trap 'rm -f "$out"' EXIT
DEMO_PARAMS=2M DEMO_TIMEOUT_S=50 bash "$(dirname "$0")/../scripts/demo.sh" >"$out" 2>&1
rc=$?
cat "$out"
[ $rc = 0 ] || { echo "FAIL: demo exited $rc"; exit 1; }
grep -q "^demo: OK: all 4 consumers' weights equal the producer's version 10" "$out" ||
	{ echo "FAIL: no equality line"; exit 1; }
grep -q "c3 .*killed and restarted" "$out" || { echo "FAIL: c3 was not restarted"; exit 1; }
grep -q "c4 .*joined late" "$out" || { echo "FAIL: c4 did not join late"; exit 1; }
[ "$(grep -c '^  c[1-4]: version 10 digest' "$out")" = 4 ] || { echo "FAIL: not 4 digests"; exit 1; }
tmp=$(sed -n 's/.*files in \(\/[^ ]*\)$/\1/p' "$out" | head -n 1)
[ -n "$tmp" ] && [ ! -e "$tmp" ] || { echo "FAIL: demo left $tmp behind"; exit 1; }
if pgrep -f -- "--dir $tmp/" >/dev/null; then echo "FAIL: a consumer outlived the demo"; exit 1; fi
echo "test_demo_small: ok"
