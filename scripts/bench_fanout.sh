#!/usr/bin/env bash
# `make bench-fanout`: how fast an anchor, the whole
# model, reaches N receivers over loopback: the broker against raw TCP and
# nginx, side by side in one run.  Per N, RUNS rounds, each one run of
# every column in turn: the references, then the broker (medians in the
# table):
#   tcp    tests/tools/bench_tcp: the model file's bytes to N receivers;
#   keep   the same, each receiver reading into a fresh buffer of the
#          model's size on huge pages (bench_tcp ... keep): raw TCP to
#          receivers that keep the model, first touch of its memory included;
#   keepread the same, the sender reading the model file through a 1 MiB
#          buffer and writing that (bench_tcp ... keep pread FILE): a
#          server that copies from its page cache, as the broker does to
#          a consumer on its host;
#   check  the same, each receiver also doing what the library must with an
#          anchor it takes in place, and nothing else (bench_tcp ... check
#          DIR pread FILE): each 512 KiB piece hashed as it lands (the
#          chunk's XXH3 and its 1 MiB blocks', as the library does), each
#          2 MiB chunk written once whole into a file of its own with
#          O_DIRECT through io_uring; its time and CPU end once the last
#          write is submitted, as the library's READY does not wait for
#          its checkpoint: the floor of the library's own column;
#   nginx  N curl fetches at once of the model file (into /dev/null) from a
#          private nginx (its own conf and prefix in the temp dir, a free
#          port; started for the row, stopped after it);
#   recv   a fresh broker and N `wire_client receive` consumers: HELLO with
#          the library's window, count the anchor's CHUNK payload bytes,
#          give the credit back, stop at its COMMIT;
#   lib    a fresh broker and N tests/tools/bench_sync_consumer (the C
#          library, default options, 64 MiB staging) until each reports the
#          anchor READY; the broker's VmRSS once all have applied it; with
#          bulk, the broker with --bulk-no-local: the anchor over TCP, as
#          to consumers on other hosts (the targets' column);
#   libsf  (with bulk) the same, the broker with --bulk-send sendfile too:
#          over TCP it copies to consumers on its own host by default
#          (docs/operations.md, "Bulk anchors"), and this column shows what
#          sendfile costs;
#   liblocal (with bulk) the broker's default for consumers on its host:
#          they connect to its unix socket and read the payloads from its
#          segment files themselves;
#   disk   N dd writers at once, each the model's bytes into a file of its
#          own in the temp dir with O_DIRECT 2 MiB writes: what the library
#          consumers' checkpoints cost the one disk they share (written
#          behind their READY; time only, no CPU).
# A broker run waits until the broker has logged N consumers joined, then
# tests/tools/fault_publish publishes the model file as version 1 (an
# anchor); the time runs from its dcast_producer_publish() call to the last
# consumer's line (CLOCK_REALTIME in each process).  The model: gen-trace's
# v0000 of a bf16 model (cached in $BUILD/bench-fanout-PARAMS).
# Every cell also takes the CPU seconds (user + system) of its receivers
# and of its sender, read where the measured window adds no work: tcp,
# keep, check: bench_tcp's own per-thread counts; nginx: the curls' from bash's
# `times` in each curl's subshell, the nginx processes' from /proc (see
# proc_cpu) before and after the fetches; recv, lib, live: each consumer's
# own CPU time on its line, the broker's from /proc (every thread) from
# just before the consumers start (live: before the publish) to the end.
# scripts/bench_fanout_report.py turns ROOT/cells.log into the tables, the
# targets and the last line "intake_cpu_over_tcp R broker_cpu_over_nginx S
# fanout_over_raw_tcp_n1 T", and rewrites the bench-fanout section of the
# doc.
# Knobs (environment):
#   BENCH_FANOUT_PARAMS (100M)  BENCH_FANOUT_N ("1 4 16")  BENCH_FANOUT_RUNS (3)
#   BENCH_FANOUT_RUNS_N1 (7)    rounds at N = 1: a few seconds each, and its
#                               target a wall-time ratio that one slow round
#                               of three decides
#   BENCH_FANOUT_QUICK=1        10M and N = "1 4", print only
#   BENCH_FANOUT_BROKER_ARGS    extra broker flags (default none: its defaults)
#   BENCH_FANOUT_DATADIR=1      each broker with a fresh --data-dir (payloads
#                               served from its segment files)
#   BENCH_FANOUT_BULK (1)       1: each broker with --bulk and a fresh
#                               --data-dir, recv consumers with --bulk 1 and
#                               library ones as they are (they ask): anchors
#                               over TCP with sendfile; 0: ZeroMQ only
#                               (DELTACAST_BULK=0 for the library)
#   BENCH_FANOUT_DOC            the doc to rewrite (docs/benchmarks.md; 0: print only)
#   BENCH_FANOUT_KEEP=1         keep the logs
#   BENCH_FANOUT_PIN=1          nginx and the brokers on CPU 0 (every thread),
#                               curl and the consumers on CPU 1, and the
#                               sender's CPU counts CPU 0's softirq thread
#                               (ksoftirqd/0) over the cell: over loopback
#                               the receivers' TCP input then runs on the
#                               sender's CPU every time, where unpinned it
#                               runs in whichever context the softirq finds
#                               (raw TCP's cells, one process, stay unpinned)
#   BENCH_FANOUT_WARM (1)       memory touched and freed just before
#                               receivers that keep the model start (see
#                               warm; 0: not)
# Every process started here is killed, and the temp dir removed, on any exit.
set -euo pipefail
. "$(dirname "$0")/e2e_lib.sh"
. "$(dirname "$0")/bench_baselines.sh"

QUICK=${BENCH_FANOUT_QUICK:-0}
if [ "$QUICK" = 1 ]; then DEF_PARAMS=10M DEF_N="1 4" DEF_DOC=0; else DEF_PARAMS=100M DEF_N="1 4 16" DEF_DOC=$E2E_ROOT/docs/benchmarks.md; fi
PARAMS=${BENCH_FANOUT_PARAMS:-$DEF_PARAMS}
NS=${BENCH_FANOUT_N:-$DEF_N}
RUNS=${BENCH_FANOUT_RUNS:-3}
RUNS_N1=${BENCH_FANOUT_RUNS_N1:-7}
BROKER_ARGS=${BENCH_FANOUT_BROKER_ARGS:-}
DATADIR=${BENCH_FANOUT_DATADIR:-0}
BULK=${BENCH_FANOUT_BULK:-1}
[ "$BULK" = 0 ] && export DELTACAST_BULK=0
DOC=${BENCH_FANOUT_DOC:-$DEF_DOC}
KEEP=${BENCH_FANOUT_KEEP:-0}
WARM=${BENCH_FANOUT_WARM:-1}
PIN=${BENCH_FANOUT_PIN:-0}
RECV_PIN=()
[ "$PIN" = 0 ] || RECV_PIN=(taskset -c 1)
TRACE=$BUILD/bench-fanout-$PARAMS
WINDOW=$((16 << 20)) # the library's window with a 64 MiB staging budget (a quarter)
NEVER=1000000        # bench_sync_consumer's UNTIL: it runs until killed
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
ROOT=$(mktemp -d "${TMPDIR:-/tmp}/deltacast-bench-fanout.XXXXXX")
REPORT=$E2E_ROOT/scripts/bench_fanout_report.py

die() { echo "bench-fanout: FAILED: $*" >&2; exit 1; }
say() { echo "bench-fanout: $*" >&2; }

# Servers first (nginx's master stops its workers), then everything else.
cleanup() {
	bench_stop_servers || true
	e2e_cleanup || true
	[ "$KEEP" = 1 ] || rm -rf "$ROOT"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The command that reproduces this run (non-default settings included).
run_cmd() {
	local env=""
	[ "$QUICK" = 1 ] && env+=" BENCH_FANOUT_QUICK=1"
	[ "$PARAMS" = "$DEF_PARAMS" ] || env+=" BENCH_FANOUT_PARAMS=$PARAMS"
	[ "$NS" = "$DEF_N" ] || env+=" BENCH_FANOUT_N=\"$NS\""
	[ "$RUNS" = 3 ] || env+=" BENCH_FANOUT_RUNS=$RUNS"
	[ "$RUNS_N1" = 7 ] || env+=" BENCH_FANOUT_RUNS_N1=$RUNS_N1"
	[ -z "$BROKER_ARGS" ] || env+=" BENCH_FANOUT_BROKER_ARGS=\"$BROKER_ARGS\""
	[ "$DATADIR" = 0 ] || env+=" BENCH_FANOUT_DATADIR=$DATADIR"
	[ "$BULK" = 1 ] || env+=" BENCH_FANOUT_BULK=$BULK"
	[ "$WARM" = 1 ] || env+=" BENCH_FANOUT_WARM=$WARM"
	[ "$PIN" = 0 ] || env+=" BENCH_FANOUT_PIN=$PIN"
	echo "make bench-fanout$env"
}

# The model: gen-trace's v0000, cached.
make_model() {
	e2e_trace "$TRACE" "$PARAMS" 0 "$ROOT/gentrace.log" || die "gen-trace (see $ROOT/gentrace.log)"
	MODEL=$TRACE/v0000.safetensors
	MODEL_BYTES=$(stat -c %s "$MODEL")
}

# cell COLUMN N RUN SECONDS RECV_CPU SEND_CPU [RSS_KB REJOINS ACK_SECONDS]:
# one measurement (the CPUs in seconds, every receiver's summed).
cell() { echo "$*" >>"$ROOT/cells.log"; }

# us_s US: microseconds as seconds ("S.UUUUUU").
us_s() { printf '%d.%06d' $(($1 / 1000000)) $(($1 % 1000000)); }

# proc_cpu PID...: the processes' CPU time so far, user + system, in
# microseconds, in CPU_US: the first field of each live thread's
# /proc/PID/task/TID/schedstat (nanoseconds on a CPU; /proc/PID/stat's
# utime and stime are the same time in 10 ms ticks, too coarse for a cell
# of tens of ms).  A thread that ended is not counted: the broker's and
# nginx's live as long as they do.  Bash builtins only.
proc_cpu() {
	local p t ns
	CPU_US=0
	for p in "$@"; do
		[ -d "/proc/$p/task" ] || die "process $p is gone"
		for t in /proc/"$p"/task/*/schedstat; do
			read -r ns _ <"$t" || continue # the thread ended just now
			CPU_US=$((CPU_US + ns / 1000))
		done
	done
}

# pin_sender PID: with PIN, every thread of PID on CPU 0.
pin_sender() {
	[ "$PIN" = 0 ] || taskset -a -p -c 0 "$1" >/dev/null || die "taskset $1"
}

# sender_cpu PID...: proc_cpu, and with PIN CPU 0's softirq thread's CPU
# time too (the sender's loopback input, deferred).
sender_cpu() {
	local ns
	proc_cpu "$@"
	[ "$PIN" = 0 ] && return
	read -r ns _ <"/proc/$(pgrep -x ksoftirqd/0)/schedstat"
	CPU_US=$((CPU_US + ns / 1000))
}

# times_us T: bash's `times` value T ("1m2.345s") in microseconds.
times_us() {
	local m=${1%%m*} s=${1#*m}
	s=${s%s}
	echo $((10#$m * 60000000 + 10#${s%.*} * 1000000 + 10#${s#*.} * 1000))
}

# seconds_since T0: seconds from EPOCHREALTIME T0 to now.
seconds_since() {
	local us=$((${EPOCHREALTIME/./} - ${1/./}))
	printf '%d.%06d' $((us / 1000000)) $((us % 1000000))
}

# tcp_run N RUN [CELL ARGS...]: bench_tcp BYTES N ARGS ("seconds S bytes B
# send_cpu_s X recv_cpu_s Y") as cell CELL (default tcp, no ARGS).
tcp_run() {
	local n=$1 k=$2 name=${3:-tcp} out w
	shift $(($# < 3 ? $# : 3))
	out=$("$BIN/tools/bench_tcp" "$MODEL_BYTES" "$n" "$@") || die "bench_tcp $MODEL_BYTES $n $*"
	read -r -a w <<<"$out"
	[ "${w[6]:-}" = recv_cpu_s ] || die "bench_tcp printed '$out'"
	cell "$name" "$n" "$k" "${w[1]}" "${w[7]}" "${w[5]}"
}

# disk_run N RUN: N dd writers of the model's size at once, O_DIRECT.
disk_run() {
	local n=$1 k=$2 i t0 pids=() count=$(((MODEL_BYTES + (2 << 20) - 1) / (2 << 20)))
	t0=$EPOCHREALTIME
	for ((i = 0; i < n; i++)); do
		dd if=/dev/zero of="$ROOT/disk.$i" bs=2M count="$count" oflag=direct 2>"$ROOT/disk.err.$i" &
		pids+=($!)
	done
	for i in "${pids[@]}"; do wait "$i" || die "dd oflag=direct into $ROOT ($(cat "$ROOT"/disk.err.*))"; done
	cell disk "$n" "$k" "$(seconds_since "$t0")" 0.000000 0.000000 # time only
	rm -f "$ROOT"/disk.*
}

# nginx_run DIR N RUN: N curls at once; each must get the whole file.  Each
# curl's subshell writes its children's `times` (the curl's user and
# system) to DIR/timesRUN.I once the curl is done.
nginx_run() {
	local d=$1 n=$2 k=$3 i t0 s c0 u sy recv=0 pids=()
	sender_cpu "${NGINX_PIDS[@]}"
	c0=$CPU_US
	t0=$EPOCHREALTIME
	for ((i = 0; i < n; i++)); do
		{
			"${RECV_PIN[@]}" curl -sSf -o /dev/null -w '%{size_download}\n' "$URL" >>"$d/curl$k.log" 2>>"$d/curl.err"
			times >"$d/times$k.$i"
		} &
		pids+=($!)
	done
	for i in "${pids[@]}"; do wait "$i" || die "curl $URL ($(cat "$d/curl.err"))"; done
	s=$(seconds_since "$t0")
	sender_cpu "${NGINX_PIDS[@]}"
	for ((i = 0; i < n; i++)); do
		{ read -r _ && read -r u sy; } <"$d/times$k.$i" || die "no times of curl $i"
		recv=$((recv + $(times_us "$u") + $(times_us "$sy")))
	done
	cell nginx "$n" "$k" "$s" "$(us_s $recv)" "$(us_s $((CPU_US - c0)))"
	[ "$(grep -cx "$MODEL_BYTES" "$d/curl$k.log")" = "$n" ] || die "curl: short fetch (see $d/curl$k.log)"
}

# nginx_round DIR N RUN: a private nginx for one run of the N curls.
nginx_round() {
	local d=$1 n=$2 k=$3
	mkdir -p "$d/nginx/www" "$d/nginx/tmp"
	[ -e "$d/nginx/www/model.safetensors" ] || ln "$MODEL" "$d/nginx/www/model.safetensors" 2>/dev/null ||
		cp "$MODEL" "$d/nginx/www/model.safetensors"
	bench_start_server "$d/server.log" nginx "curl -s -o /dev/null http://127.0.0.1:PORT/" \
		bench_nginx_run "$d/nginx" PORT || die "nginx"
	URL=http://127.0.0.1:$BENCH_PORT/model.safetensors
	mapfile -t NGINX_PIDS < <(echo "${BENCH_SERVER_PIDS[0]}" && pgrep -P "${BENCH_SERVER_PIDS[0]}")
	[ "${#NGINX_PIDS[@]}" -gt 1 ] || die "no nginx workers under ${BENCH_SERVER_PIDS[0]}"
	for p in "${NGINX_PIDS[@]}"; do pin_sender "$p"; done
	nginx_run "$d" "$n" "$k"
	bench_stop_servers || true
	e2e_cleanup || true
}

# start_consumer FORM DIR I: consumer I, its lines in DIR/cI.log.
start_consumer() {
	local form=$1 d=$2 i=$3
	if [ "$form" = recv ]; then
		"${RECV_PIN[@]}" "$BIN/tools/wire_client" receive "$CONS_EP" bench --until 1 --window "$WINDOW" \
			--timeout-ms 600000 --bulk "$BULK" >"$d/c$i.log" 2>"$d/c$i.err" &
	else
		"${RECV_PIN[@]}" "$BIN/tools/bench_sync_consumer" "$CONS_EP" bench "$d/c$i" $NEVER >"$d/c$i.log" 2>"$d/c$i.err" &
	fi
	CPIDS+=($!)
	e2e_track $!
}

# has_line LOG WORD: LOG has a line "WORD 1 ..." (bash builtins only: the
# polling must not load the 2 cores it measures).
has_line() {
	local w
	[ -f "$1" ] || return 1
	while read -r -a w; do
		[ "${w[0]:-}" = "$2" ] && [ "${w[1]:-}" = 1 ] && return 0
	done <"$1"
	return 1
}

# nap: 20 ms on a FIFO nobody writes (read -t), not a sleep process.
nap() { read -r -t 0.02 -u "$NAP" || true; }

# warm N: just before receivers that keep the model start (keep, lib),
# N + 1 model-sized buffers touched and freed (bench_tcp ... warm), so
# that all of them find memory in the same state.  On a VM whose balloon
# reports free memory to the host (virtio_balloon free page reporting, 2
# MiB blocks, about 2 s after they are freed), memory freed seconds
# before is faulted in again by the host on first touch, and costs the
# receiver that touches it 1.5-3x the CPU (measured: a keeping receiver of
# the 100M model, 60-75 ms of CPU right after another run, 105-221 ms 5 s
# later); which receiver found which memory depended on the order of the
# runs.  Memory used just before is what a host without a balloon hands
# out anyway.
warm() {
	[ "$WARM" = 0 ] || "$BIN/tools/bench_tcp" "$MODEL_BYTES" $(($1 + 1)) warm >/dev/null ||
		die "bench_tcp $MODEL_BYTES $(($1 + 1)) warm"
}

# wait_joined DIR N: until the broker has logged N consumers joined.
wait_joined() {
	local d=$1 n=$2 deadline=$((SECONDS + 120))
	until [ "$(grep -c '^.*consumer .* joined, ' "$d/broker.log")" -ge "$n" ]; do
		kill -0 "$BROKER_PID" 2>/dev/null || die "$d: the broker exited"
		[ $SECONDS -lt $deadline ] || die "$d: $n consumers did not join in 120 s"
		nap
	done
}

# wait_lines DIR WORD: until every consumer has its "WORD 1" line.
wait_lines() {
	local d=$1 word=$2 i deadline=$((SECONDS + 600))
	for ((i = 1; i <= ${#CPIDS[@]}; i++)); do
		until has_line "$d/c$i.log" "$word"; do
			if ! kill -0 "${CPIDS[i - 1]}" 2>/dev/null; then
				has_line "$d/c$i.log" "$word" && break
				die "$d: consumer $i exited ($(tail -n 2 "$d/c$i.err"))"
			fi
			[ $SECONDS -lt $deadline ] || die "$d: consumer $i has no '$word 1' after 600 s"
			nap
		done
	done
}

# anchor_seconds DIR WORD [START]: "S A C O E": S from START (an
# $EPOCHREALTIME; default the producer's publish call) to the last
# consumer's "WORD 1 ... t_ns T ... cpu_ns U" line, A from the publish call
# to the broker's ACK, C the consumers' U summed, O from the first
# consumer's dcast_consumer_open() call (its line's open_ns; bench_tcp's
# clock too starts after its exec) to that last line, E the consumers'
# CPU before that call (open_cpu_ns: their exec and library loading,
# which C includes and bench_tcp's counts leave out), 0 where the lines
# have none, in seconds.
anchor_seconds() {
	local start=${3:-}
	awk -v word="$2" -v start="${start/./}000" '
		$1 == "acked" && $2 == 1 { t0 = $3; ack = $4 }
		$1 == word && $2 == 1 { for (i = 3; i < NF; i++) {
			if ($i == "t_ns" && $(i + 1) > last) last = $(i + 1)
			if ($i == "open_ns" && (!open || $(i + 1) < open)) open = $(i + 1)
			if ($i == "open_cpu_ns") ecpu += $(i + 1)
			if ($i == "cpu_ns") { cpu += $(i + 1); ncpu++ } } }
		END { if (!t0 || !last || !ncpu) exit 1; from = start > 1000 ? start : t0
		      printf "%.6f %.6f %.6f %.6f %.6f\n", (last - from) / 1e9, (ack - t0) / 1e9, cpu / 1e9,
			     open ? (last - open) / 1e9 : 0, ecpu / 1e9 }' \
		"$1/publish.log" "$1"/c*.log
}

# wait_acked DIR: the broker has committed and ACKed the anchor.
wait_acked() {
	local deadline=$((SECONDS + 600))
	until has_line "$1/publish.log" acked; do
		kill -0 "$BROKER_PID" 2>/dev/null || die "$1: the broker exited"
		[ $SECONDS -lt $deadline ] || die "$1: no ACK of the anchor in 600 s"
		nap
	done
}

# broker_run FORM N RUN: a fresh broker and one measurement.  recv, lib:
# the anchor is committed first, then N consumers start at once (late
# joiners, a restarted fleet): start to the last consumer's line.  live: N
# library consumers wait, then the anchor is published (a new run): publish
# start to the last READY, through the broker's store-and-forward (a version
# is served once committed).
broker_run() {
	local form=$1 n=$2 k=$3 d=$ROOT/$1-n$2-$3 i go pub s ack rcpu opened ecpu c0 t0 rss joins word=ready
	[ "$form" = recv ] && word=received
	mkdir -p "$d"
	local dd=()
	[ "$DATADIR" = 0 ] && [ "$BULK" = 0 ] || dd=(--data-dir "$d/broker-data")
	[ "$BULK" = 0 ] || dd+=(--bulk 127.0.0.1:0)
	[ "$BULK" = 0 ] || [ "$form" = liblocal ] || dd+=(--bulk-no-local)
	[ "$form" != libsf ] || dd+=(--bulk-send sendfile)
	e2e_start_broker "$d/broker.log" $BROKER_ARGS "${dd[@]}" || die "no broker (see $d/broker.log)"
	pin_sender "$BROKER_PID"
	mkfifo "$d/go"
	"$BIN/tools/fault_publish" "$PROD_EP" bench 1 -1 "$MODEL" <"$d/go" >"$d/publish.log" 2>"$d/publish.err" &
	pub=$!
	e2e_track $pub
	exec {go}>"$d/go"
	CPIDS=()
	if [ "$form" = live ]; then
		for ((i = 1; i <= n; i++)); do start_consumer "$form" "$d" "$i"; done
		wait_joined "$d" "$n"
		sender_cpu "$BROKER_PID"
		echo go >&"$go"
	else
		echo go >&"$go"
		wait_acked "$d"
		[ "$form" = recv ] || warm "$n"
		sender_cpu "$BROKER_PID"
		t0=$EPOCHREALTIME
		for ((i = 1; i <= n; i++)); do start_consumer "$form" "$d" "$i"; done
	fi
	c0=$CPU_US
	wait_lines "$d" "$word"
	[ "$form" = recv ] || wait_lines "$d" applied
	sender_cpu "$BROKER_PID"
	exec {go}>&-
	wait "$pub" || die "fault_publish ($(cat "$d/publish.err"))"
	read -r s ack rcpu opened ecpu < <(anchor_seconds "$d" "$word" "${t0:-}") && [ -n "$ecpu" ] ||
		die "$d: no times in the logs"
	rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$BROKER_PID/status")
	joins=$(grep -c '^.*consumer .* joined, ' "$d/broker.log")
	[ -s "$ROOT/payload" ] || [ "$form" != recv ] || awk '$1 == "received" { print $6; exit }' "$d/c1.log" >"$ROOT/payload"
	cell "$form" "$n" "$k" "$s" "$rcpu" "$(us_s $((CPU_US - c0)))" "$rss" $((joins - n)) "$ack" "$opened" "$ecpu"
	e2e_cleanup || true
	[ "$KEEP" = 1 ] || rm -rf "$d"
	sync
}

# row N: RUNS rounds (RUNS_N1 at N = 1), each one run of every column in turn (the
# references, then the broker's), so that a ratio of two columns compares
# runs made minutes apart at most, under the same load of this shared
# machine.
row() {
	local n=$1 k form runs=$RUNS
	[ "$n" = 1 ] && runs=$RUNS_N1
	say "N=$n: raw TCP, nginx, broker (late joiners: receive only, library until READY), broker (live publish)"
	mkdir -p "$ROOT/refs-n$n"
	for ((k = 1; k <= runs; k++)); do
		tcp_run "$n" "$k"
		warm "$n"
		tcp_run "$n" "$k" keep keep
		warm "$n"
		tcp_run "$n" "$k" keepread keep pread "$MODEL"
		warm "$n"
		tcp_run "$n" "$k" check check "$ROOT" pread "$MODEL"
		nginx_round "$ROOT/refs-n$n" "$n" "$k"
		disk_run "$n" "$k"
		for form in recv lib $([ "$BULK" = 0 ] || echo libsf liblocal) live; do broker_run "$form" "$n" "$k"; done
	done
}

main() {
	local n
	[ -x "$NGINX" ] || die "no nginx (make bench-fanout installs it: scripts/deps.sh bench)"
	[ "$KEEP" = 1 ] && say "keeping the logs in $ROOT"
	e2e_snapshot "$ROOT" bench_tcp fault_publish bench_sync_consumer wire_client ||
		die "programs missing in $BUILD (run make)"
	mkfifo "$ROOT/nap" && exec {NAP}<>"$ROOT/nap" || die "nap fifo"
	LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
	make_model
	say "model: $PARAMS bf16 parameters, $MODEL_BYTES bytes; N = $NS; $RUNS runs per cell ($RUNS_N1 at N = 1)"
	for n in $NS; do row "$n"; done
	local shown=$BROKER_ARGS
	[ "$DATADIR" = 0 ] && [ "$BULK" = 0 ] || shown+=" --data-dir (fresh)"
	[ "$BULK" = 0 ] || shown+=" --bulk 127.0.0.1:0 (--bulk-no-local but in the local column)"
	shown=${shown# }
	printf 'params %s\nmodel_bytes %s\npayload_bytes %s\nruns %s\nwindow %s\nbroker_args %s\ncpus %s\ncpu %s\nkernel %s\nload_start %s\nload_end %s\nseconds %s\ncommand %s\n' \
		"$PARAMS" "$MODEL_BYTES" "$(cat "$ROOT/payload")" "$RUNS ($RUNS_N1 at N = 1)" "$WINDOW" "${shown:-none}" \
		"$(nproc)" "$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n 1)" "$(uname -sm)" \
		"$LOAD0" "$(cut -d' ' -f1-3 /proc/loadavg)" "$SECONDS" "$(run_cmd)" >"$ROOT/meta"
	"$PY" "$REPORT" "$ROOT" "$DOC" || die "report"
}

main
