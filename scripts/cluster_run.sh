# Sourced after scripts/cluster_lib.sh: deltacast on a namespace cluster.
# Needs BUILD (programs), RUN (a folder for logs and worker dirs), MODEL.
#
# Topology spec (cl_topology SPEC RATE EDGE):
#   star:N      host "root" (trainer + broker) and workers w1..wN on one switch
#   tree:R:N    root, relay brokers r1..rR (--upstream root), workers w1..wN,
#               worker i behind relay ((i-1) % R) + 1
#   ktree:F:D   a complete tree of fan-out F, D links deep: relays r1..rR on
#               the levels between (R = F + ... + F^(D-1)), F^D workers on
#               the last; hosts numbered level by level, so relay or worker
#               number K in that order (relays first) is fed by K' =
#               (K-1)/F: root for the first F, else relay K'
#   ...+lossy   worker w1 drops 1% of its packets each way (nftables)
# The root's link runs at RATE (the bottleneck: the trainer node's NIC),
# every other link at EDGE (the same RATE twice: every link alike).
# Addresses: root 10.77.0.1, relay K 10.77.1.K, worker I 10.77.2.I (up to
# 250 of each).
set -u
CL_PORT_PROD=5555
CL_PORT_CONS=5556
CL_ROOT_ADDR=10.77.0.1
CL_WORKERS=()
CL_RELAYS=()
declare -A CL_UPSTREAM=()

# cl_ktree F D: sets CL_KT_R and CL_KT_N, the relays and workers of ktree:F:D.
cl_ktree() {
	local f=$1 d=$2 k p=1
	[[ $f =~ ^[0-9]+$ && $d =~ ^[0-9]+$ && $f -ge 1 && $d -ge 1 && $d -le 8 ]] || return 1
	CL_KT_R=0
	for ((k = 1; k < d; k++)); do
		p=$((p * f))
		CL_KT_R=$((CL_KT_R + p))
	done
	CL_KT_N=$((p * f))
}

# cl_feeder K FAN: the host that feeds host number K (relays, then workers)
# of a ktree of fan-out FAN; FAN 0: root.
cl_feeder() {
	local k=0
	[ "$2" -gt 0 ] && k=$((($1 - 1) / $2))
	if [ "$k" = 0 ]; then echo root; else echo "r$k"; fi
}

# cl_topology SPEC RATE EDGE
cl_topology() {
	local spec=$1 rate=$2 edge=$3 kind n r=0 i lossy=0 fan=0
	[[ $spec == *+lossy ]] && { lossy=1; spec=${spec%+lossy}; }
	IFS=: read -r kind r n <<<"$spec"
	[ "$kind" = star ] && { n=$r; r=0; }
	if [ "$kind" = ktree ]; then
		cl_ktree "$r" "$n" || { echo "cluster: bad spec '$1' (ktree:F:D, D <= 8)" >&2; return 1; }
		fan=$r r=$CL_KT_R n=$CL_KT_N
	fi
	[[ $kind =~ ^(star|tree|ktree)$ && $n =~ ^[0-9]+$ && $r =~ ^[0-9]+$ && $n -ge 1 && $n -le 250 && $r -le 250 ]] ||
		{ echo "cluster: bad spec '$1' (star:N, tree:R:N or ktree:F:D; at most 250 workers and 250 relays; optional +lossy)" >&2; return 1; }
	[ "$kind" = tree ] && [ "$r" -lt 1 ] && { echo "cluster: a tree needs R >= 1 relays" >&2; return 1; }
	cl_up || return 1
	CL_WORKERS=() CL_RELAYS=() CL_UPSTREAM=()
	cl_host root "$CL_ROOT_ADDR" "$rate" || return 1
	for ((i = 1; i <= r; i++)); do
		cl_host "r$i" "10.77.1.$i" "$edge" || return 1
		CL_RELAYS+=("r$i")
		CL_UPSTREAM[r$i]=$(cl_feeder "$i" "$fan")
	done
	for ((i = 1; i <= n; i++)); do
		cl_host "w$i" "10.77.2.$i" "$edge" || return 1
		CL_WORKERS+=("w$i")
		if [ "$fan" -gt 0 ]; then
			CL_UPSTREAM[w$i]=$(cl_feeder $((r + i)) "$fan")
		elif [ "$r" -gt 0 ]; then
			CL_UPSTREAM[w$i]=r$(((i - 1) % r + 1))
		else
			CL_UPSTREAM[w$i]=root
		fi
	done
	[ "$lossy" = 0 ] || cl_lossy w1 10
}

# cl_cons_ep HOST: the consumer endpoint of the broker on HOST.
cl_cons_ep() { echo "tcp://${CL_ADDR[$1]}:$CL_PORT_CONS"; }

# cl_listening_or_gone PID LOG: the broker PID has said it listens, or has exited.
cl_listening_or_gone() { grep -qs "consumers on" "$2" || ! kill -0 "$1" 2>/dev/null; }

# cl_start_broker HOST [FLAGS...]: deltacast-broker on HOST (producers on its
# loopback, consumers on every address); waits until it listens.  If it
# exits first, CL_BROKER_EXIT is its exit status and its stderr is in
# RUN/HOST.broker.log.
cl_start_broker() {
	local h=$1 log=$RUN/$1.broker.log pid
	shift
	ip netns exec "$CL_TAG-$h" "$BUILD/deltacast-broker" --producers "tcp://127.0.0.1:$CL_PORT_PROD" \
		--consumers "tcp://0.0.0.0:$CL_PORT_CONS" "$@" 2>>"$log" &
	pid=$!
	CL_PIDS+=("$pid")
	eval "CL_BROKER_PID_$h=$pid"
	cl_wait_for 100 cl_listening_or_gone "$pid" "$log"
	grep -qs "consumers on" "$log" && return 0
	CL_BROKER_EXIT=0
	kill -0 "$pid" 2>/dev/null || { wait "$pid"; CL_BROKER_EXIT=$?; }
	echo "cluster: broker on $h did not start (exit $CL_BROKER_EXIT): $(tail -n 1 "$log")" >&2
	return 1
}

# cl_start_brokers [FLAGS...]: the root broker, then every relay (a relay
# after the one that feeds it).
cl_start_brokers() {
	local r
	cl_start_broker root "$@" || return 1
	for r in "${CL_RELAYS[@]}"; do
		cl_start_broker "$r" --upstream "$(cl_cons_ep "${CL_UPSTREAM[$r]}")" --upstream-model "$MODEL" "$@" ||
			return 1
	done
}

# cl_stamp LOG: stdin lines to LOG as "EPOCH LINE".
cl_stamp() {
	local line
	while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line" >>"$1"; done
	return 0
}

# cl_start_worker HOST UNTIL [ENDPOINT]: `deltacast subscribe` on HOST (to its
# upstream's broker by default), lines time-stamped into RUN/HOST.log.
cl_start_worker() {
	local h=$1 until=$2 ep=${3:-$(cl_cons_ep "${CL_UPSTREAM[$1]}")}
	ip netns exec "$CL_TAG-$h" "$BUILD/deltacast" subscribe --broker "$ep" --model "$MODEL" \
		--dir "$RUN/$h" --until "$until" > >(cl_stamp "$RUN/$h.log") 2>>"$RUN/$h.err" &
	CL_PIDS+=($!)
	eval "CL_WORKER_PID_$h=$!"
}

# cl_joined HOST: consumers that joined the broker on HOST so far.
cl_joined() { grep -c "consumer .* joined" "$RUN/$1.broker.log" 2>/dev/null; }

# cl_all_joined: every relay has joined the root and every worker its broker.
cl_all_joined() {
	local h want
	for h in root "${CL_RELAYS[@]}"; do
		want=0
		for w in "${CL_RELAYS[@]}" "${CL_WORKERS[@]}"; do [ "${CL_UPSTREAM[$w]}" = "$h" ] && ((want++)); done
		[ "$(cl_joined "$h")" -ge "$want" ] || return 1
	done
}

# cl_start_workers UNTIL: every worker, then until all have joined.
cl_start_workers() {
	local w
	for w in "${CL_WORKERS[@]}"; do cl_start_worker "$w" "$1"; done
	cl_wait_for 600 cl_all_joined || { echo "cluster: workers did not all join" >&2; return 1; }
}

# cl_version_of HOST: the newest version HOST's subscriber printed (0: none).
cl_version_of() {
	local v
	v=$(awk '$2 == "version" { v = $3 } END { print v + 0 }' "$RUN/$1.log" 2>/dev/null)
	echo "${v:-0}"
}

# cl_have V: every worker has applied V.
cl_have() {
	local n
	n=$(awk -v v="$1" '$2 == "version" && $3 >= v { print FILENAME }' \
		$(printf "$RUN/%s.log " "${CL_WORKERS[@]}") 2>/dev/null | sort -u | wc -l)
	[ "$n" -ge "${#CL_WORKERS[@]}" ]
}

# cl_time_all V T0: seconds from T0 until the last worker printed version V.
cl_time_all() {
	awk -v v="$1" -v t0="$2" '$2 == "version" && $3 == v { if ($1 > m) m = $1 } END { printf "%.3f", m - t0 }' \
		$(printf "$RUN/%s.log " "${CL_WORKERS[@]}")
}

# cl_start_publisher FILE...: tests/tools/fault_publish on root, one version
# per line written to fd CL_GO (cl_publish_next), the first an anchor.
cl_start_publisher() {
	mkfifo "$RUN/go"
	ip netns exec "$CL_TAG-root" env FAULT_PUBLISH_RANGE_ELEMS="${CL_RANGE_ELEMS:-1048576}" \
		"$BUILD/tools/fault_publish" "tcp://127.0.0.1:$CL_PORT_PROD" "$MODEL" 1 -1 "$@" \
		<"$RUN/go" >"$RUN/publisher.log" 2>&1 &
	CL_PIDS+=($!)
	CL_PUB_PID=$!
	exec {CL_GO}>"$RUN/go"
}

# cl_publish_next: the publisher starts on its next version; sets CL_T0.
cl_publish_next() {
	CL_T0=$EPOCHREALTIME
	echo go >&"$CL_GO"
}

# cl_link_delta BEFORE AFTER: {"PORT": [RX, TX], ...} from two cl_counters
# snapshots (files).
cl_link_delta() {
	awk 'NR == FNR { rx[$1] = $2; tx[$1] = $3; next }
		{ printf "%s\"%s\": [%d, %d]", n++ ? ", " : "{", $1, $2 - rx[$1], $3 - tx[$1] } END { print "}" }' "$1" "$2"
}

# cl_rates_json: {"PORT": BITS_PER_SECOND, ...} for every host.
cl_rates_json() {
	local h n=0
	printf '{'
	for h in "${!CL_RATE[@]}"; do
		printf '%s"%s": %s' "$([ $n = 0 ] || echo ', ')" "$h" "$(cl_rate_bps "${CL_RATE[$h]}")"
		n=1
	done
	printf '}'
}

# cl_cpu_json "BUSY TOTAL SOFTIRQ OWN" (before) "BUSY TOTAL SOFTIRQ OWN"
# (after): {"busy": F, "softirq": F, "own": F}, those jiffies in between
# over all the machine's.
cl_cpu_json() {
	echo "$1 $2" | awk '{ t = $6 - $2; if (t <= 0) t = 1
		printf "{\"busy\": %.4f, \"softirq\": %.4f, \"own\": %.4f}", ($5 - $1) / t, ($7 - $3) / t, ($8 - $4) / t }'
}

# cl_run_versions FILE...: publish each file as the next version, one at a
# time (the first an anchor), each once every worker has the one before;
# per version a JSON line on stdout: version, seconds from publish start to
# the last worker's apply, bytes on every link (RX: sent by that host), and
# the CPU meanwhile as fractions of all the machine's cores: busy, softirq,
# and own (what the cluster's processes, CL_PIDS, spent).
cl_run_versions() {
	local v=0 f t m0 m1 p0 p1
	cl_start_publisher "$@"
	for f in "$@"; do
		((v++))
		cl_counters >"$RUN/c0"
		m0=$(cl_cpu_machine) p0=$(cl_cpu_pids "${CL_PIDS[@]}")
		cl_publish_next
		cl_wait_for "${CL_VERSION_TIMEOUT:-3000}" cl_have "$v" || {
			echo "cluster: version $v did not reach every worker; stuck:" >&2
			for h in "${CL_WORKERS[@]}"; do
				[ "$(cl_version_of "$h")" -ge "$v" ] || echo "  $h at $(cl_version_of "$h")" >&2
			done
			return 1
		}
		m1=$(cl_cpu_machine) p1=$(cl_cpu_pids "${CL_PIDS[@]}")
		cl_counters >"$RUN/c1"
		t=$(cl_time_all "$v" "$CL_T0")
		printf '{"v": %d, "t": %s, "links": %s, "rates": %s, "cpu": %s}\n' "$v" "$t" \
			"$(cl_link_delta "$RUN/c0" "$RUN/c1")" "$(cl_rates_json)" "$(cl_cpu_json "$m0 $p0" "$m1 $p1")"
	done
	exec {CL_GO}>&-
	wait "$CL_PUB_PID" || { echo "cluster: publisher failed: $(tail -n 2 "$RUN/publisher.log")" >&2; return 1; }
}

# cl_check_final FILE: every worker's subscriber exited 0 (at --until, or
# on SIGTERM) and its
# model.safetensors holds FILE's tensors bit for bit (the model digest of
# tests/tools/fault_digest: names, dtypes, shapes and every byte; the
# files' headers may differ).
cl_check_final() {
	local w pid bad=0 want got
	want=$("$BUILD/tools/fault_digest" "$1" | cut -d' ' -f1)
	[ -n "$want" ] || { echo "cluster: no digest of $1" >&2; return 1; }
	for w in "${CL_WORKERS[@]}"; do
		eval "pid=\$CL_WORKER_PID_$w"
		wait "$pid" || { echo "cluster: $w's subscriber exited $?" >&2; bad=1; continue; }
		got=$("$BUILD/tools/fault_digest" "$RUN/$w/model.safetensors" | cut -d' ' -f1)
		[ "$got" = "$want" ] || { echo "cluster: $w's model differs from $1 ($got, want $want)" >&2; bad=1; }
	done
	return $bad
}
