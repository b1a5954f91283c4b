#!/usr/bin/env bash
# What an anchor costs a consumer's host until it is durable: one
# `deltacast subscribe --until 1` on a fresh broker holding only the anchor
# SAFETENSORS; prints wall and CPU seconds until it exits (model.safetensors
# written) and the bytes it wrote: its write_bytes (/proc/PID/io), which
# getrusage reports at exit as ru_oublock in 512-byte units (/usr/bin/time's
# %O).  A probe for docs/benchmarks.md ("Consumer": an anchor received in place,
# written once); run it against two builds, alternating.
# Usage: tests/tools/anchor_disk.sh BUILD_DIR SAFETENSORS
set -u
B=$1 F=$2
T=$(mktemp -d "${TMPDIR:-/tmp}/anchor-disk.XXXXXX")
BP=
trap '[ -n "$BP" ] && kill $BP 2>/dev/null; rm -rf "$T"' EXIT
P=$((40000 + RANDOM % 2000))
"$B/deltacast-broker" --producers tcp://127.0.0.1:$P --consumers tcp://127.0.0.1:$((P + 1)) \
	--heartbeat-ms 5000 >"$T/broker.log" 2>&1 &
BP=$!
"$B/deltacast" publish --broker tcp://127.0.0.1:$P --model ab "$F" 2>"$T/pub.log" ||
	{ echo "publish failed: $(tail -1 "$T/pub.log")" >&2; exit 1; }
/usr/bin/time -f "%e %U %S %O" -o "$T/time" "$B/deltacast" subscribe --broker tcp://127.0.0.1:$((P + 1)) \
	--model ab --dir "$T/c" --until 1 >"$T/sub.log" 2>&1 ||
	{ echo "subscribe failed: $(tail -2 "$T/sub.log")" >&2; exit 1; }
read -r wall user sys blocks <"$T/time"
echo "wall_s $wall cpu_s $(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }') written_MB $((blocks * 512 / 1000000))"
