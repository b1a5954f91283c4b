#!/usr/bin/env bash
# scripts/cluster.sh SPEC [options]: a deltacast cluster of network
# namespaces on this machine (root only).  Builds the topology, starts the
# root broker (and relays), one `deltacast subscribe` per worker, publishes
# a gen-trace model one version at a time (an anchor, then ~1% deltas),
# prints per version the seconds until every worker applied it and the
# bytes on each link, checks every worker's file equals the last version,
# and tears everything down on any exit.
#   SPEC     star:N | tree:R:N | ktree:F:D, optionally +lossy (scripts/cluster_run.sh)
#   --rate R        the root's link (default 100mbit)
#   --edge R        every other link (default 1gbit)
#   --params P      gen-trace model size (default 10M)
#   --versions V    versions published, the first an anchor (default 4)
#   --range-elems N elements per chunk (default 131072)
#   --heartbeat-ms MS  the brokers' heartbeat (default: the broker's, 1000)
#   --cut-through   every broker and relay forwards open versions' chunks
#   --consumer-sndbuf-bytes N  every broker's consumer connections' SO_SNDBUF
#   --keep          keep the run's folder
# Example: scripts/cluster.sh tree:2:6 --params 1M --versions 5
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/cluster_lib.sh"
. "$HERE/cluster_run.sh"
BUILD=${DELTACAST_BUILD:-$HERE/../build}
MODEL=m
SPEC=${1:?usage: scripts/cluster.sh star:N|tree:R:N|ktree:F:D[+lossy] [--rate R] [--edge R] [--params P] [--versions V] [--range-elems N] [--keep]}
shift
RATE=100mbit EDGE=1gbit PARAMS=10M NVER=4 KEEP=0 CL_RANGE_ELEMS=131072 BROKER_FLAGS=()
while [ $# -gt 0 ]; do
	case $1 in
	--rate) RATE=$2; shift ;;
	--edge) EDGE=$2; shift ;;
	--params) PARAMS=$2; shift ;;
	--versions) NVER=$2; shift ;;
	--range-elems) CL_RANGE_ELEMS=$2; shift ;;
	--heartbeat-ms) BROKER_FLAGS+=(--heartbeat-ms "$2"); shift ;;
	--cut-through) BROKER_FLAGS+=(--cut-through) ;;
	--consumer-sndbuf-bytes) BROKER_FLAGS+=(--consumer-sndbuf-bytes "$2"); shift ;;
	--keep) KEEP=1 ;;
	*) echo "cluster: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done
why=$(cl_usable)
[ -z "$why" ] || { echo "cluster: cannot build namespaces here: $why" >&2; exit 77; }
RUN=$(mktemp -d "${TMPDIR:-/tmp}/dcx-cluster.XXXXXX")
trap 'cl_down; [ "$KEEP" = 1 ] && echo "cluster: kept $RUN" >&2 || rm -rf "$RUN"' EXIT
trap 'exit 130' INT TERM

"$BUILD/deltacast" gen-trace --params "$PARAMS" --steps $((NVER - 1)) --density 0.01 -o "$RUN/trace" \
	2>"$RUN/gentrace.log" || { echo "cluster: gen-trace failed" >&2; exit 1; }
FILES=("$RUN"/trace/v*.safetensors)
cl_topology "$SPEC" "$RATE" "$EDGE" || exit 1
cl_start_brokers "${BROKER_FLAGS[@]}" || exit 1
cl_start_workers "$NVER" || exit 1
echo "cluster: $SPEC, root link $RATE, others $EDGE, $PARAMS params ($(stat -c %s "${FILES[0]}") bytes), ${#CL_WORKERS[@]} workers joined" >&2
cl_run_versions "${FILES[@]}" >"$RUN/versions.jsonl" || exit 1
/usr/bin/python3 - "$RUN/versions.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    L = r["links"]
    relays = [k for k in L if k[0] == "r" and k[1:].isdigit()]
    extra = "  max relay sent %d" % max(L[k][0] for k in relays) if relays else ""
    print("version %d: %.3f s to every worker; root sent %d bytes%s" % (r["v"], r["t"], L["root"][0], extra))
PY
cl_check_final "${FILES[-1]}" || exit 1
echo "cluster: every worker's model equals version $NVER, byte for byte"
