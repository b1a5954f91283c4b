#!/usr/bin/env bash
# A relay tree in network namespaces (scripts/cluster_lib.sh): a root broker,
# relays r1 and r2 (--upstream root), six `deltacast subscribe` workers (w1,
# w3, w5 behind r1; w2, w4, w6 behind r2), a 2 MB gen-trace model published
# as 12 versions (an anchor, then ~1% deltas, every 150 ms).  Relay r1 is
# SIGKILLed mid-stream, once its workers have version 4.
#
# Recovery, as designed today (a consumer has one endpoint): the
# orchestrator stops the subscribers that were behind the dead relay
# (SIGTERM: each writes its model file and exits 0) and starts them again
# with the same --dir, pointed at the surviving relay r2.  Each resumes
# from its local checkpoint and asks r2 for the deltas after its version.
# Checks: every worker ends at version 12 with the producer's tensors bit
# for bit; the moved workers were behind (below 12) when r1 died and
# resumed with deltas only (no anchor again); nothing is left behind.
# Every broker has --bulk: the relays take the anchor from the root over a
# bulk connection, sent with sendfile (another host to the root), the
# workers from their relays; r1, started again from nothing once the
# stream is over, takes the anchor so too, then the deltas, to version 12.
# Exit 77 where network namespaces cannot be made (not root, no ip, ...).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../scripts/cluster_lib.sh"
. "$HERE/../scripts/cluster_run.sh"
BUILD=${DELTACAST_BUILD:-${BUILD:-$HERE/../build}}
[[ $BUILD = /* ]] || BUILD=$HERE/../$BUILD
MODEL=m
NVER=12
why=$(cl_usable)
[ -z "$why" ] || { echo "skip: cannot build network namespaces here: $why"; exit 77; }
RUN=$(mktemp -d /tmp/dcx-test-relay.XXXXXX)
trap 'cl_down; rm -rf "$RUN"' EXIT

fail() {
	echo "FAIL: $*" >&2
	for f in "$RUN"/*.log "$RUN"/*.err; do [ -s "$f" ] && { echo "--- $f"; tail -n 8 "$f"; }; done >&2
	exit 1
}

# behind_r1: the workers relay r1 serves.
BEHIND_R1=(w1 w3 w5)
at_least() { # V HOST...: each HOST has applied V
	local v=$1 h
	shift
	for h in "$@"; do [ "$(cl_version_of "$h")" -ge "$v" ] || return 1; done
}

"$BUILD/deltacast" gen-trace --params 1M --steps $((NVER - 1)) --density 0.01 -o "$RUN/trace" \
	2>"$RUN/gentrace.err" || fail "gen-trace"
FILES=("$RUN"/trace/v*.safetensors)
cl_topology tree:2:6 100mbit 1gbit 2>"$RUN/topology.err" || fail "topology: $(cat "$RUN/topology.err")"
cl_start_brokers --anchor-fraction 0 --bulk 0.0.0.0:0 || fail "brokers"
cl_start_workers "$NVER" || fail "workers did not join"

# The publisher runs on its own clock (fault_publish, 150 ms between versions).
ip netns exec "$CL_TAG-root" "$BUILD/tools/fault_publish" "tcp://127.0.0.1:$CL_PORT_PROD" "$MODEL" 1 150 \
	"${FILES[@]}" >"$RUN/publisher.log" 2>&1 &
PUB=$!
CL_PIDS+=("$PUB")

cl_wait_for 300 at_least 4 "${BEHIND_R1[@]}" || fail "r1's workers never reached version 4"
kill -9 "$CL_BROKER_PID_r1"
wait "$CL_BROKER_PID_r1" 2>/dev/null
for w in "${BEHIND_R1[@]}"; do
	v=$(cl_version_of "$w")
	[ "$v" -lt "$NVER" ] || fail "$w already had version $v when r1 died: not mid-stream"
	echo "r1 killed with $w at version $v"
done

# Move r1's workers to r2: stop each (it writes its file), start it again.
for w in "${BEHIND_R1[@]}"; do
	eval "pid=\$CL_WORKER_PID_$w"
	kill -TERM "$pid"
	wait "$pid" || fail "$w's subscriber exited $? on SIGTERM"
	echo "--- restarted against r2" >>"$RUN/$w.log"
	cl_start_worker "$w" "$NVER" "$(cl_cons_ep r2)"
done

wait "$PUB" || fail "publisher: $(tail -n 2 "$RUN/publisher.log")"
cl_wait_for 600 cl_have "$NVER" || fail "not every worker reached version $NVER"
cl_check_final "${FILES[-1]}" || fail "a worker's model is not version $NVER"
for w in "${BEHIND_R1[@]}"; do
	first=$(sed -n '/restarted against r2/,$p' "$RUN/$w.log" | awk '$2 == "version" { print $4; exit }')
	[ "$first" = delta ] || fail "$w resumed through r2 with '$first', expected deltas after its checkpoint"
done
grep -q "consumer .* joined" "$RUN/r2.broker.log" || fail "r2 saw no consumers"
# r1 again, from nothing: the anchor over bulk from the root, across its link.
echo "--- started again" >>"$RUN/r1.broker.log"
cl_start_broker r1 --upstream "$(cl_cons_ep root)" --upstream-model "$MODEL" --anchor-fraction 0 ||
	fail "r1 did not start again"
r1_at() { sed -n '/--- started again/,$p' "$RUN/r1.broker.log" | grep -q "$1"; }
cl_wait_for 300 r1_at "model $MODEL: version $NVER committed" || fail "r1 started again never reached $NVER"
r1_at "relay $MODEL: version 1 came over the bulk connection" ||
	fail "r1 started again took the anchor over ZeroMQ: $(grep "relay $MODEL" "$RUN/r1.broker.log" | tail -n 4)"
n=$(grep -c "bulk: consumer relay of $MODEL takes version 1 (.*, sendfile)" "$RUN/root.broker.log")
[ "$n" = 3 ] || fail "root sent $n anchors to relays over bulk with sendfile, expected 3 (r1, r2, r1 again)"
cl_down
! ip netns list | grep -q "^$CL_TAG-" || fail "namespaces left behind: $(ip netns list | grep "^$CL_TAG-")"
echo "test_cluster_relay: ok (6 workers bit-exact at version $NVER; r1's 3 moved to r2 mid-stream)"
