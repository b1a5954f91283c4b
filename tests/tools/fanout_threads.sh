#!/usr/bin/env bash
# N receive-only consumers (wire_client receive) join one committed anchor at
# once, as a restarted fleet does; the time until all have it, and how the
# broker's ZeroMQ I/O threads shared the sending: each thread's CPU time
# over the joins (/proc/PID/task/*/schedstat) and the busiest one's share
# against an even split, and the broker's CPU (every thread) per GB of
# payload the consumers received.  The probe behind docs/benchmarks.md's
# note on one listener per I/O thread (broker/listen.c) and its note on
# what bounds the broker's send; on 2 cores the time is CPU-bound, the
# split and the CPU per GB are what it shows.
# Usage: [FANOUT_THREADS_BROKER_ARGS="--io-threads 8"] [FANOUT_THREADS_RECV_ARGS="--bulk 1"]
#        tests/tools/fanout_threads.sh [N] [SAFETENSORS]
# (bulk anchors: FANOUT_THREADS_BROKER_ARGS="--bulk 127.0.0.1:0 --data-dir DIR"
# and FANOUT_THREADS_RECV_ARGS="--bulk 1"; the receivers then check every
# chunk's checksum, which costs them, not the broker)
# (run from the repo root after `make`; SAFETENSORS defaults to the 100M
# model bench-fanout generates, build/bench-fanout-100M/v0000.safetensors).
. "$(dirname "$0")/broker_lib.sh"

N=${1:-4}
anchor_broker s "${2:-$BUILD/bench-fanout-100M/v0000.safetensors}" ${FANOUT_THREADS_BROKER_ARGS:-}
# Each I/O thread's CPU time so far, ms (schedstat: nanoseconds on a CPU).
cpu_ms() {
	for t in /proc/"$s_PID"/task/*; do
		awk '{ printf "%d\n", $1 / 1e6 }' "$t/schedstat" | paste -d' ' "$t/comm" -
	done | sed -n 's|^ZMQbg/IO/||p' | sort -n
}
cpu_ms >"$TMP/before"
c0=$(cpu_ns "$s_PID")
t0=$(date +%s%N)
CONS=()
for i in $(seq "$N"); do
	"$WC" receive "$s_CONS" bench --until 1 --window $((16 << 20)) --timeout-ms 120000 \
		${FANOUT_THREADS_RECV_ARGS:-} >"$TMP/c$i.log" 2>&1 &
	CONS+=($!)
	PIDS+=($!)
done
for p in "${CONS[@]}"; do wait "$p" || fail "a consumer exited $?"; done
t1=$(date +%s%N)
cpu_ms >"$TMP/after"
c1=$(cpu_ns "$s_PID")
sent=$(awk '$1 == "received" { s += $6 } END { printf "%d\n", s }' "$TMP"/c*.log)
join "$TMP/before" "$TMP/after" | awk -v n="$N" -v ms=$(((t1 - t0) / 1000000)) -v cpu=$((c1 - c0)) -v sent="$sent" '
	{ d[$1] = $3 - $2; sum += d[$1]; if (d[$1] > max) max = d[$1]; k++; line = line sprintf(" %d", d[$1]) }
	END { printf "N=%d: all received in %d ms; I/O threads, CPU ms:%s; busiest %.0f%% of it (even: %.0f%%); " \
		"broker CPU %.3f s per GB sent\n", n, ms, line, sum ? 100 * max / sum : 0, 100 / k,
		sent ? cpu / sent : 0 }'
stop_broker s
