#!/usr/bin/env bash
# Runs on a lent GPU machine from .dev/run.sh (scripts/device_bundle.sh
# makes .dev/): the GPU tests, `make bench-gpu`'s program, and an anchor to
# N joining consumers (raw TCP, the broker to receive-only joiners, library
# joiners until READY) on that host's cores.  Output in $OUT (the device
# tool brings it back).  BARGS: flags for the brokers; NS: the N's.
set -u
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.dev/lib DELTACAST_BUILD=$PWD/.dev/build
B=$DELTACAST_BUILD
O=${OUT:-/tmp/devout}
mkdir -p "$O"
export BARGS=${BARGS:-}
PARAMS=${PARAMS:-100M}

gpu() {
	echo "== machine"
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
	echo "cpus $(nproc), kernel $(uname -r)"
	echo "== libraries not found"
	ldd "$B/deltacast-broker" "$B"/tests/* | grep "not found"
	echo "== GPU tests"
	for t in test_gpu_codec test_consumer_gpu test_producer_gpu; do
		echo "-- $t"; timeout 120 "$B/tests/$t"; echo "rc=$?"
	done
	echo "== bench_gpu_codec"; timeout 200 "$B/tools/bench_gpu_codec"; echo "rc=$?"
}

# recv_run N MODEL: the broker to N consumers that only receive.
recv_run() {
	bash -c '. tests/tools/broker_lib.sh
	start_broker s $BARGS
	"$BUILD/tools/fault_publish" "$s_PROD" bench 1 0 "$2" >"$TMP/pub.log" 2>&1 || fail publish
	sync; t0=$(date +%s%N); P=()
	for i in $(seq "$1"); do
		"$WC" receive "$s_CONS" bench --until 1 --window 16777216 --timeout-ms 60000 >"$TMP/r$i.log" 2>&1 &
		P+=($!)
	done
	for p in "${P[@]}"; do wait "$p" || fail "receiver exited $?"; done
	cat "$TMP"/r*.log | awk -v t0="$t0" -v n="$1" '\''$1 == "received" {
		for (k = 1; k < NF; k++) if ($k == "t_ns" && $(k + 1) > m) m = $(k + 1) }
		END { printf "recv n=%d: last at %.0f ms\n", n, (m - t0) / 1e6 }'\''
	stop_broker s' _ "$1" "$2"
}

fanout() {
	echo "== an anchor to N joining consumers, $(nproc) cores, broker flags: ${BARGS:-none}"
	rm -rf /tmp/trace
	timeout 90 "$B/deltacast" gen-trace --params "$PARAMS" --steps 0 --density 0.01 -o /tmp/trace >/dev/null 2>&1
	local m=/tmp/trace/v0000.safetensors n k
	echo "model $(stat -c %s "$m") bytes"
	for n in ${NS:-1 4 16}; do
		for k in 1 2 3; do echo "raw_tcp n=$n: $("$B/tools/bench_tcp" "$(stat -c %s "$m")" "$n")"; done
		for k in 1 2 3; do recv_run "$n" "$m"; done
		for k in 1 2 3; do
			ANCHOR_JOIN_BROKER_ARGS="$BARGS" timeout 60 bash tests/tools/anchor_join.sh "$n" "$m" 2>&1 |
				awk -v n="$n" '/READY at/ { v = $5 + 0; if (v > m) m = v } END { printf "lib n=%d: last READY at %d ms\n", n, m }'
		done
	done
}

[ -n "${SKIP_GPU:-}" ] || gpu 2>&1 | tee "$O/gpu.txt"
fanout 2>&1 | tee "$O/fanout.txt"
