# Sourced by scripts/cluster.sh, scripts/bench_cluster.sh and
# tests/test_cluster_relay.sh: a cluster of Linux network namespaces on one
# machine.  Every host is a namespace "dcx<PID>-<host>" (PID: the shell that
# sourced this file) with one interface, eth0, a veth whose other end is a
# port of the bridge br0 in the switch namespace "dcx<PID>-sw".  Each link is
# shaped in both directions: tbf at the link's rate, netem delay under it
# where the kernel has sch_netem (random loss comes from nftables).  Nothing is created in the machine's own namespace,
# so deleting the namespaces removes every interface; the addresses
# (10.77.0.0/16) exist only inside them.
#
#   cl_usable             "" if namespaces work here, else why not
#   cl_sweep              delete namespaces left by a dcx run that is gone
#   cl_up                 the switch; cl_down tears everything down
#   cl_host NAME ADDR RATE [DELAY]   a host on the switch
#   cl_lossy NAME PERMILLE           random loss on that host's traffic
#   cl_exec NAME CMD...   run CMD in host NAME
#   cl_bg NAME OUT CMD... the same in the background (stdout to OUT), tracked
#   cl_counters           "PORT RX TX" per switch port (RX: what the host sent)
#   cl_cpu_machine        "BUSY TOTAL SOFTIRQ" jiffies of the machine so far
#   cl_cpu_pids PID...    jiffies those processes have spent so far
set -u
CL_TAG=${CL_TAG:-dcx$$}
CL_SW=$CL_TAG-sw
CL_PIDS=()
CL_NS=()
declare -A CL_RATE=() CL_ADDR=()

# cl_usable: why namespaces cannot be used here ("" when they can).
cl_usable() {
	[ "$(id -u)" = 0 ] || { echo "not root (network namespaces need CAP_NET_ADMIN)"; return; }
	command -v ip >/dev/null || { echo "no ip command (iproute2)"; return; }
	command -v tc >/dev/null || { echo "no tc command (iproute2)"; return; }
	if ! ip netns add "$CL_TAG-probe" 2>/dev/null; then
		echo "ip netns add refused (no namespace support, or unshare not permitted here)"
		return
	fi
	if ! ip -n "$CL_TAG-probe" link add v0 type veth peer name v1 2>/dev/null; then
		ip netns del "$CL_TAG-probe"
		echo "veth pairs cannot be created"
		return
	fi
	ip netns del "$CL_TAG-probe"
	echo ""
}

# cl_del_ns NS: kill what runs inside, then delete it (its interfaces go too).
cl_del_ns() {
	local p
	for p in $(ip netns pids "$1" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
	ip netns del "$1" 2>/dev/null
}

# cl_sweep: namespaces of an earlier dcx run whose shell is gone (killed
# before its trap ran).  Only names "dcx<digits>-..." are touched.
cl_sweep() {
	local ns pid
	for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^dcx[0-9]+-'); do
		pid=${ns#dcx}
		pid=${pid%%-*}
		[ "$pid" != $$ ] && kill -0 "$pid" 2>/dev/null && continue
		[ "$pid" = $$ ] && [ "${CL_UP:-0}" = 1 ] && continue
		echo "cluster: removing leftover namespace $ns" >&2
		cl_del_ns "$ns"
	done
}

cl_up() {
	cl_sweep
	ip netns add "$CL_SW" || return 1
	CL_NS+=("$CL_SW")
	CL_UP=1
	ip -n "$CL_SW" link add br0 type bridge &&
		ip -n "$CL_SW" link set br0 up && ip -n "$CL_SW" link set lo up
}

# cl_down: stop tracked processes, then anything still inside our
# namespaces, then delete them.  Safe to call twice.
cl_down() {
	local p ns
	for p in "${CL_PIDS[@]}"; do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
	for p in "${CL_PIDS[@]}"; do wait "$p" 2>/dev/null; done
	CL_PIDS=()
	for ns in "${CL_NS[@]}"; do cl_del_ns "$ns"; done
	CL_NS=()
	CL_RATE=()
	CL_ADDR=()
	CL_UP=0
}

# cl_burst RATE: a tbf bucket of 2 ms at RATE, at least 64 KiB (a GSO packet).
cl_burst() {
	local r=$1 bps
	case $r in
	*gbit) bps=$((${r%gbit} * 1000000000)) ;;
	*mbit) bps=$((${r%mbit} * 1000000)) ;;
	*kbit) bps=$((${r%kbit} * 1000)) ;;
	*) bps=${r%bit} ;;
	esac
	local b=$((bps / 8 / 500))
	echo $((b < 65536 ? 65536 : b))
}

# cl_rate_bps RATE: bits per second.
cl_rate_bps() {
	local r=$1
	case $r in
	*gbit) echo $((${r%gbit} * 1000000000)) ;;
	*mbit) echo $((${r%mbit} * 1000000)) ;;
	*kbit) echo $((${r%kbit} * 1000)) ;;
	*) echo "${r%bit}" ;;
	esac
}

# cl_shape NS DEV RATE DELAY: egress of DEV at RATE (tbf; its queue holds
# CL_TBF_LATENCY, default 100 ms, at RATE before it drops), then netem DELAY under it where the kernel
# has sch_netem.  Without it (CONFIG_NET_SCH_NETEM unset, as on the dev VM)
# links have no added delay, and the first cl_shape says so once.
cl_shape() {
	local ns=$1 dev=$2 rate=$3 delay=$4
	tc -n "$ns" qdisc add dev "$dev" root handle 1: tbf rate "$rate" burst "$(cl_burst "$rate")" \
		latency "${CL_TBF_LATENCY:-100ms}" || return 1
	[ "${CL_NO_NETEM:-0}" = 1 ] && return 0
	if ! tc -n "$ns" qdisc add dev "$dev" parent 1:1 handle 10: netem delay "$delay" limit 100000 \
		2>/dev/null; then
		CL_NO_NETEM=1
		echo "cluster: no sch_netem in this kernel: links get their rate (tbf) but no added delay" >&2
	fi
	return 0
}

# cl_lossy NAME PERMILLE: host NAME drops PERMILLE/1000 of the packets it
# receives and of those it sends, at random (nftables numgen, since netem's
# loss and reordering need sch_netem).  Needs the nft command (nftables).
cl_lossy() {
	cl_exec "$1" nft -f - <<EOF
table inet dcx_loss {
	chain in { type filter hook input priority 0; numgen random mod 1000 < $2 drop; }
	chain out { type filter hook output priority 0; numgen random mod 1000 < $2 drop; }
}
EOF
}

# cl_host NAME ADDR RATE [DELAY]: a namespace with eth0 at ADDR/16 on the
# switch, shaped at RATE (and DELAY, default 50us) both ways.
cl_host() {
	local name=$1 addr=$2 rate=$3 delay=${4:-50us} ns=$CL_TAG-$1
	ip netns add "$ns" || return 1
	CL_NS+=("$ns")
	ip -n "$CL_SW" link add "$name" type veth peer name eth0 netns "$ns" &&
		ip -n "$CL_SW" link set "$name" master br0 up &&
		ip -n "$ns" addr add "$addr/16" dev eth0 &&
		ip -n "$ns" link set eth0 up && ip -n "$ns" link set lo up &&
		cl_shape "$CL_SW" "$name" "$rate" "$delay" &&
		cl_shape "$ns" eth0 "$rate" "$delay" || return 1
	CL_RATE[$name]=$rate
	CL_ADDR[$name]=$addr
}

cl_exec() {
	local ns=$CL_TAG-$1
	shift
	ip netns exec "$ns" "$@"
}

# cl_bg NAME OUT CMD...: CMD in host NAME in the background, stdout to OUT,
# stderr to OUT.err; sets CL_LAST.
cl_bg() {
	local ns=$CL_TAG-$1 out=$2
	shift 2
	ip netns exec "$ns" "$@" >"$out" 2>"$out.err" &
	CL_LAST=$!
	CL_PIDS+=("$CL_LAST")
}

# cl_counters: one line per switch port, "PORT RX_BYTES TX_BYTES" as the
# switch sees them: RX is what the host sent, TX what it received.
cl_counters() {
	ip netns exec "$CL_SW" sh -c 'for d in /sys/class/net/*; do n=${d##*/};
		case $n in lo|br0) continue;; esac;
		echo "$n $(cat "$d/statistics/rx_bytes") $(cat "$d/statistics/tx_bytes")"; done'
}

# cl_cpu_machine: "BUSY TOTAL SOFTIRQ", the jiffies all CPUs have spent busy
# (user, nice, system, irq, softirq), in all (idle and iowait too), and in
# softirq alone (where the kernel moves packets), /proc/stat.
cl_cpu_machine() {
	awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9, $8 }' /proc/stat
}

# cl_cpu_pids PID...: the jiffies those processes (every thread) have spent
# so far, utime + stime (fields 14 and 15 of /proc/PID/stat); one that has
# exited counts 0.
cl_cpu_pids() {
	local p s=0 f
	for p in "$@"; do
		read -ra f 2>/dev/null <"/proc/$p/stat" || continue
		s=$((s + f[13] + f[14]))
	done
	echo "$s"
}

# cl_wait_for TENTHS COMMAND...: poll every 0.1 s until COMMAND succeeds.
cl_wait_for() {
	local n=$1 i
	shift
	for ((i = 0; i < n; i++)); do "$@" && return 0; sleep 0.1; done
	return 1
}
