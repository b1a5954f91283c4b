#!/usr/bin/env bash
# `make bench`: time for a version to reach BENCH_CONSUMERS consumers on this
# machine, for the same gen-trace versions, as
#   1. deltacast deltas (one `deltacast publish`: an anchor, then deltas);
#   2. deltacast full anchors (one `deltacast publish` per version: each one
#      a full anchor of the model);
#   3. raw TCP loopback (tests/tools/bench_tcp): the model's bytes, and the
#      delta's bytes, to every consumer at once: the ceiling.
# Consumers are `deltacast subscribe` processes (apply, digest check, and a
# checkpoint file written per version).  Writes the table between the
# bench-e2e markers of docs/benchmarks.md (BENCH_DOC=0: print only).
set -u
. "$(dirname "$0")/e2e_lib.sh"

PARAMS=${BENCH_PARAMS:-100M}
NVER=${BENCH_VERSIONS:-6}
NCONS=${BENCH_CONSUMERS:-4}
DOC=${BENCH_DOC:-$E2E_ROOT/docs/benchmarks.md}
ROOT=$(mktemp -d "${TMPDIR:-/tmp}/deltacast-bench.XXXXXX")
trap 'e2e_cleanup; rm -rf "$ROOT"' EXIT
trap 'exit 130' INT TERM
die() { echo "bench: FAILED: $*" >&2; exit 1; }

"$DC" gen-trace --params "$PARAMS" --steps $((NVER - 1)) --density 0.01 -o "$ROOT/trace" \
	2>"$ROOT/gentrace.log" || die "gen-trace"
FILES=()
for ((k = 0; k < NVER; k++)); do FILES+=("$(printf '%s/v%04d.safetensors' "$ROOT/trace" "$k")"); done

# run_mode MODE DIR: broker, NCONS subscribers, publish as MODE (delta|anchor).
run_mode() {
	local mode=$1 d=$2 i k deadline=$((SECONDS + 300))
	mkdir -p "$d"
	e2e_start_broker "$d/broker.log" --heartbeat-ms 5000 || die "no broker"
	for ((i = 1; i <= NCONS; i++)); do
		echo "$EPOCHREALTIME start" >"$d/c$i.events"
		"$DC" subscribe --broker "$CONS_EP" --model bench --dir "$d/c$i" --until "$NVER" \
			> >(e2e_stamp "$d/c$i.log") 2>>"$d/c$i.err" &
		e2e_track $!
	done
	if [ "$mode" = delta ]; then
		"$DC" publish --broker "$PROD_EP" --model bench "${FILES[@]}" 2> >(e2e_stamp "$d/producer.log") ||
			die "publish"
	else
		for ((k = 0; k < NVER; k++)); do
			"$DC" publish --broker "$PROD_EP" --model bench --first-version $((k + 1)) "${FILES[k]}" \
				2> >(e2e_stamp "$d/producer.log") || die "publish $((k + 1))"
		done
	fi
	for ((i = 1; i <= NCONS; i++)); do
		while [ "$(e2e_last_version "$d/c$i.log")" -lt "$NVER" ]; do
			[ $SECONDS -lt $deadline ] || die "$mode: c$i stuck at $(e2e_last_version "$d/c$i.log")"
			sleep 0.1
		done
	done
	sleep 0.2
	e2e_cleanup
	"$PY" "$E2E_ROOT/scripts/e2e_report.py" bench "$d" || die "report $mode"
}

field() { "$PY" -c 'import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

echo "bench: $PARAMS params, $NVER versions, $NCONS consumers" >&2
J_DELTA=$(run_mode delta "$ROOT/delta") || exit 1
J_ANCHOR=$(run_mode anchor "$ROOT/anchor") || exit 1
MODEL_BYTES=$(field "$J_DELTA" model_bytes)
DELTA_BYTES=$(field "$J_DELTA" wire_bytes)
TCP_FULL=$("$BUILD/tools/bench_tcp" "$MODEL_BYTES" "$NCONS" | awk '{print $2}') || die "bench_tcp"
TCP_DELTA=$("$BUILD/tools/bench_tcp" "$DELTA_BYTES" "$NCONS" | awk '{print $2}') || die "bench_tcp"

table=$("$PY" - "$J_DELTA" "$J_ANCHOR" "$TCP_FULL" "$TCP_DELTA" "$NCONS" "$PARAMS" "$NVER" <<'PYEOF'
import json, sys
d, a = json.loads(sys.argv[1]), json.loads(sys.argv[2])
tcp_full, tcp_delta, n = float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
base_t, base_b = d["mean_reach_s"], d["wire_bytes"] * n
rows = [
    ("deltacast deltas", d["mean_reach_s"], d["wire_bytes"] * n, "`make bench`"),
    ("deltacast full anchors", a["mean_reach_s"], a["wire_bytes"] * n, "`make bench`"),
    ("raw TCP loopback, full model (ceiling)", tcp_full, d["model_bytes"] * n,
     "`build/tools/bench_tcp %d %d`" % (d["model_bytes"], n)),
    ("raw TCP loopback, delta bytes (ceiling)", tcp_delta, d["wire_bytes"] * n,
     "`build/tools/bench_tcp %d %d`" % (d["wire_bytes"], n)),
]
print("%s bf16 parameters (%.1f MiB), %d versions at %.2f%% density, %d consumers"
      " (`deltacast subscribe`: apply, digest check, checkpoint file per version), one 2-core"
      " VM, loopback.  Time: mean over versions 2..%d from publish start to the last consumer's"
      " apply, not counting queueing behind the previous version.\n"
      % (sys.argv[6], d["model_bytes"] / 2**20, int(sys.argv[7]), d["density"], n, int(sys.argv[7])))
print("| transport | time to all consumers | x deltacast | bytes moved | x deltacast | command |")
print("| --- | --- | --- | --- | --- | --- |")
for name, t, b, cmd in rows:
    print("| %s | %.3f s | %.2f | %.1f MiB | %.1f | %s |" % (name, t, t / base_t, b / 2**20, b / base_b, cmd))
PYEOF
)
echo "$table"
[ "$DOC" = 0 ] && exit 0
"$PY" - "$DOC" "$table" <<'PYEOF'
import os, sys
path, table = sys.argv[1], sys.argv[2]
b, e = "<!-- bench-e2e:begin -->", "<!-- bench-e2e:end -->"
s = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
note = ("\nThe deltacast time covers the whole path: the producer's diff and encode, the broker,"
        " each consumer's staging, apply with digest check, and its checkpoint write (`deltacast"
        " subscribe` rewrites DIR/model.safetensors after every version); the raw TCP rows move"
        " bytes only.  Not measured yet: HTTP (nginx) fan-out, Redis pub/sub, shared-filesystem"
        " reload.\n")
body = b + "\n" + table + "\n" + note + e
s = s[:s.index(b)] + body + s[s.index(e) + len(e):] if b in s else s + "\n## End to end\n\n" + body + "\n"
open(path, "w").write(s)
PYEOF
echo "bench: wrote $DOC" >&2
