#!/usr/bin/env bash
# `make test-faults`: the fault-injection suite.  Each trial draws a seed;
# the seed fixes the trial's fault kind, how many faults, the progress
# points and delays at which they strike, the proxy's decisions and whether
# io_uring is refused (DELTACAST_IO_URING=0), so `SEED=N` replays the same
# schedule (process timing itself is not deterministic).  A trial runs a
# broker (--data-dir), `deltacast publish` of a gen-trace model and
# FAULT_CONSUMERS tests/tools/fault_consumer processes, injects the faults,
# then stops injecting, restarts whatever is down and requires:
#   - every consumer reaches the producer's newest committed version and its
#     DIR/model.safetensors has that version's model digest;
#   - every "applied V" / "loaded V" line any consumer printed carries the
#     digest of the producer's file for V (a divergence otherwise);
#   - run_change trials (the broker restarted without its data dir, so the
#     model starts over as a new run publishing another trace, while the
#     consumers hold READY versions FAULT_APPLY_HOLD_MS before applying
#     them): each run a consumer reports carries one trace's weights only,
#     never the other run's.
# Prints per fault kind: trials, faults injected, divergences, failures.
# SEEDS=N trials (default 5) from FAULT_SEED_BASE (default: drawn); SEED=N
# one trial; FAULT_KINDS="k1 k2" restricts the kinds; FAULT_KEEP=1 keeps
# every trial's files, FAULT_KEEP=failed those of failed trials.
# FAULT_CUT_THROUGH=1 starts every trial's broker with --cut-through (open
# versions stream ahead of their COMMIT, and faults strike inside them;
# each trial line says how many chunks went ahead, "-" without the flag),
# FAULT_CUT_THROUGH=alt those of odd seeds; default 0, none.
# FAULT_BULK=1 (or alt: even seeds) starts every trial's broker with --bulk
# (anchors go to the consumers over its unix socket, read from its files,
# or with --bulk-no-local on odd seeds over TCP, and faults strike inside
# those transfers; each trial line says how many went so, "-" without the
# flag); default 0, none.
# FAULT_RELAY=1 puts a relay (no data dir, the trial's --cut-through and
# --bulk flags too) between the broker and the consumers, and adds the
# fault kinds relay_kill and relay_stop (a consumers' proxy then sits in
# front of the relay); each trial line says "relay".  FAULT_RELAY=N puts
# a chain of N relays there (a tree's path: the first joins the broker,
# each next one the one before, the consumers the last), and each relay
# fault strikes one of them, drawn; the trial line says "relays N".
# FAULT_RELAY_FANOUT=F (with FAULT_RELAY) makes the chain's last level F
# sibling relays under the same upstream, the consumers spread over them
# (consumer i joins leaf i mod F; a consumers' proxy stands in front of
# the first leaf only): a tree; the trial line adds "fanout F".
# FAULT_RELAY_DATA=1 gives each relay a data dir of its own, kept across
# its restarts (its consumers on this host then read its files by
# reference over its unix socket with FAULT_BULK); the trial line adds
# "data".
# FAULT_REORDER=1 makes the proxy kinds' proxy also swap two whole messages
# that follow each other (5-20 per mille of reads, drawn), as no TCP
# connection does: a broker or relay that sent them out of order.  Off by
# default, so that earlier seeds replay as they did.
# FAULT_DISK_FULL=1 adds the fault kinds disk_full and data_full (root, and
# tmpfs mounts, needed: without them the script says so and exits 77).  In
# their trials the consumers' directories (disk_full) or the broker's data
# dir (data_full) are tmpfs mounts of their own, and each fault shrinks
# one of them, drawn, to what it holds (every write that needs a new block
# fails with ENOSPC) for 0.1-4 s, then gives the room back.  With relays
# that keep data dirs (FAULT_RELAY, FAULT_RELAY_DATA) it adds relay_full
# too: every relay's data dir a tmpfs of its own, a drawn one shrunk so.
# Exit 0 only when no trial diverged or failed to converge.
set -u
. "$(dirname "$0")/e2e_lib.sh"

RELAY=${FAULT_RELAY:-0}
FANOUT=${FAULT_RELAY_FANOUT:-1}
case $RELAY$FANOUT in *[!0-9]*) echo "faults: FAULT_RELAY=$RELAY FAULT_RELAY_FANOUT=$FANOUT: numbers" >&2; exit 2 ;; esac
[ "$FANOUT" -ge 1 ] || { echo "faults: FAULT_RELAY_FANOUT=$FANOUT: at least 1" >&2; exit 2; }
NREL=0 # relays in all: the chain's RELAY - 1 inner ones and FANOUT leaves
[ "$RELAY" = 0 ] || NREL=$((RELAY - 1 + FANOUT))
RELAY_DATA=()
[ "${FAULT_RELAY_DATA:-0}" = 0 ] || RELAY_DATA=(--data-dir)
ALL_KINDS="broker_kill broker_stop producer_kill producer_stop consumer_kill consumer_stop proxy proxy_producer ckpt_corrupt segment_corrupt run_change"
[ "$RELAY" = 0 ] || ALL_KINDS+=" relay_kill relay_stop"
[ "${FAULT_DISK_FULL:-0}" = 0 ] || ALL_KINDS+=" disk_full data_full"
[ "${FAULT_DISK_FULL:-0}" = 0 ] || [ "$RELAY" = 0 ] || [ ${#RELAY_DATA[@]} = 0 ] || ALL_KINDS+=" relay_full"
KINDS=(${FAULT_KINDS:-$ALL_KINDS})
NCONS=${FAULT_CONSUMERS:-3}
PARAMS=${FAULT_PARAMS:-4M}
NVER=${FAULT_VERSIONS:-8}
CONVERGE_S=${FAULT_CONVERGE_S:-30}
PROXY=$BUILD/tools/faultproxy
FC=$BUILD/tools/fault_consumer
FD=$BUILD/tools/fault_digest
FP=$BUILD/tools/fault_publish
INTERVAL_MS=${FAULT_INTERVAL_MS:-150}
ROOT=$(mktemp -d "${TMPDIR:-/tmp}/deltacast-faults.XXXXXX")
MODEL=faults

# ---- full disks (disk_full, data_full): tmpfs mounts that a fault shrinks ----
MOUNTS=()
ROOM=512m
# tmpfs_mount DIR: DIR a tmpfs of ROOM of its own until tmpfs_unmount.
tmpfs_mount() {
	mkdir -p "$1" && mount -t tmpfs -o size=$ROOM tmpfs "$1" && MOUNTS+=("$1")
}
tmpfs_unmount() {
	local d
	for d in "${MOUNTS[@]}"; do umount -l "$d" 2>/dev/null; done
	MOUNTS=()
}
# disk_full DIR WHAT: the tmpfs at DIR shrunk to what it holds for a pause
# drawn from the seed (WHAT names it in the trial log), then ROOM again.
disk_full() {
	local used
	used=$(df -k --output=used "$1" | tail -n 1 | tr -d ' ')
	[ "$used" -ge 4 ] || used=4
	mount -o remount,size="${used}k" "$1" || return 1
	pause_len; say "$2 full (${used} KiB) for $PAUSE s"
	sleep "$PAUSE"
	mount -o remount,size=$ROOM "$1"
}

finish() {
	e2e_cleanup
	tmpfs_unmount
	[ -n "${FAULT_KEEP:-}" ] && echo "faults: files kept in $ROOT" || rm -rf "$ROOT"
}
trap finish EXIT
trap 'exit 130' INT TERM

for t in "$DC" "$BROKER_BIN" "$PROXY" "$FC" "$FD" "$FP"; do
	[ -x "$t" ] || { echo "faults: missing $t (make all $BUILD/tools/...)"; exit 1; }
done
if [ "${FAULT_DISK_FULL:-0}" != 0 ]; then
	tmpfs_mount "$ROOT/probe" 2>/dev/null || { echo "faults: FAULT_DISK_FULL needs tmpfs mounts (root); skipped"; exit 77; }
	tmpfs_unmount
fi

# ---- the traces and their digests, shared by every trial: A, and B (other
# weights, same shapes) for the new runs of run_change trials ----
declare -a FILES WANT FILES_A WANT_A FILES_B WANT_B
gen_trace() { # gen_trace NAME SEED: FILES_NAME, WANT_NAME
	local dir=$ROOT/trace$1 v f
	"$DC" gen-trace --params "$PARAMS" --steps $((NVER - 1)) --density 0.01 --seed "$2" -o "$dir" \
		2>"$ROOT/gentrace$1.log" || { cat "$ROOT/gentrace$1.log"; exit 1; }
	for ((v = 1; v <= NVER; v++)); do
		f=$(printf '%s/v%04d.safetensors' "$dir" $((v - 1)))
		eval "FILES_$1[v]=\$f"
		eval "WANT_$1[v]=\$(\"\$FD\" \"\$f\" | cut -d' ' -f1)"
	done
}
# use_trace NAME: the trace the producer publishes from now on
use_trace() {
	local v
	CUR=$1
	for ((v = 1; v <= NVER; v++)); do eval "FILES[v]=\${FILES_$1[v]}; WANT[v]=\${WANT_$1[v]}"; done
}
gen_trace A 1
[[ " ${KINDS[*]} " == *" run_change "* ]] && gen_trace B 2
use_trace A

# ---- seeded draws (no subshells: they would not advance RANDOM) ----
rnd() { R=$((RANDOM % $1)); }

# ---- per-trial state ----
T= BPORT= PPORT= RPORTS=() RPIDS=() PROXY_PID= PROXY_SIDE= PUB_PID= TRIAL_ENV=() CUT=() AHEAD= BULK=() BULKN= DELTAS= STUCK=
declare -a CPID CDONE CREST CERRPOS
FAULTS=0

say() { echo "$*" >>"$T/trial.log"; }

# must_end COMMAND...: COMMAND (e2e_kill, e2e_reap, e2e_cleanup), its line
# about a process that did not end going to the trial log: such a process
# fails the trial (STUCK) instead of hanging it.
must_end() {
	"$@" 2>>"$T/trial.log" && return 0
	STUCK=1
	return 1
}

broker_start() {
	if [ -z "$BPORT" ]; then
		local try port
		for try in $(seq 0 29); do
			port=$(e2e_pick_port "$try")
			e2e_start_broker_at "$T/broker.log" "$port" --data-dir "$T/data" --heartbeat-ms 500 \
				--metrics "127.0.0.1:$((port + 2))" "${CUT[@]}" "${BULK[@]}" && { BPORT=$port; return 0; }
		done
		return 1
	else
		local i
		for i in $(seq 20); do
			e2e_start_broker_at "$T/broker.log" "$BPORT" --data-dir "$T/data" --heartbeat-ms 500 \
				--metrics "127.0.0.1:$((BPORT + 2))" "${CUT[@]}" "${BULK[@]}" && return 0
			sleep 0.2
		done
		return 1
	fi
}

broker_alive() { e2e_alive "$BROKER_PID"; }

# relay_name I: relay I's name in logs and files ("relay" when there is
# one, as before chains).
relay_name() { if [ "$NREL" = 1 ]; then echo relay; else echo "relay$1"; fi; }

# relay_parent I: the relay relay I joins (-1: the broker).  The chain's
# relays join the one before; the leaves (from RELAY - 1 on) the last
# inner one.
relay_parent() {
	local i=$1
	[ "$i" -ge "$RELAY" ] && i=$((RELAY - 1))
	echo $((i - 1))
}

# relay_leaf K: the relay consumer K joins.
relay_leaf() { echo $((RELAY - 1 + $1 % FANOUT)); }

# relay_at I PORT: one start of relay I (FAULT_RELAY) on PORT, joining the
# broker or its parent relay; RPIDS[I] its process, BROKER_PID stays the
# broker's.
relay_at() {
	local b=$BROKER_PID rc=0 up=$BPORT name parent
	name=$(relay_name "$1")
	parent=$(relay_parent "$1")
	[ "$parent" -lt 0 ] || up=${RPORTS[parent]}
	e2e_start_broker_at "$T/$name.log" "$2" --upstream "tcp://127.0.0.1:$((up + 1))" \
		--upstream-model "$MODEL" --heartbeat-ms 500 --metrics "127.0.0.1:$(($2 + 2))" \
		"${CUT[@]}" "${BULK[@]}" ${RELAY_DATA[@]:+"${RELAY_DATA[@]}" "$T/${name}data"} || rc=1
	RPIDS[$1]=$BROKER_PID BROKER_PID=$b
	return $rc
}

# relay_start I: relay I, on ports of its own picked at its first start,
# the same ones after.
relay_start() {
	local try port
	if [ -z "${RPORTS[$1]:-}" ]; then
		for try in $(seq 0 29); do
			port=$(e2e_pick_port $((try + 80 + 30 * $1)))
			relay_at "$1" "$port" && { RPORTS[$1]=$port; return 0; }
		done
		return 1
	fi
	for try in $(seq 20); do
		relay_at "$1" "${RPORTS[$1]}" && return 0
		sleep 0.2
	done
	return 1
}

# relays_up: every relay that is not alive started, upstream first.
relays_up() {
	local i
	for ((i = 0; i < NREL; i++)); do
		e2e_alive "${RPIDS[i]:-}" || relay_start "$i" || return 1
	done
}

# relay_pick: RI, the relay a relay fault strikes (drawn when there are
# more than one, so that one relay's seeds replay as before).
relay_pick() {
	RI=0
	[ "$NREL" -gt 1 ] && { rnd "$NREL"; RI=$R; }
	return 0
}

# relays_said: " relay", " relays N" or nothing, and " data" (FAULT_RELAY_DATA).
relays_said() {
	[ "$RELAY" = 0 ] && return
	if [ "$RELAY" = 1 ]; then printf ' relay'; else printf ' relays %s' "$RELAY"; fi
	[ "$FANOUT" = 1 ] || printf ' fanout %s' "$FANOUT"
	[ ${#RELAY_DATA[@]} = 0 ] || printf ' data'
	echo
}

# relay_last_port: the first leaf's producers port (its consumers' relay).
relay_last_port() { echo "${RPORTS[RELAY - 1]}"; }

# e2e_reused PID (e2e_lib.sh's hook): a new process has the number of one
# that exited; a role still naming it would signal, wait on or count alive
# the newcomer (pid_max can be 32768): that role's process is gone, so it
# is forgotten (empty), as if reaped with its status lost.
e2e_reused() {
	local i
	[ "$BROKER_PID" != "$1" ] || BROKER_PID=
	[ "$PUB_PID" != "$1" ] || PUB_PID=
	[ "$PROXY_PID" != "$1" ] || PROXY_PID=
	for i in "${!RPIDS[@]}"; do [ "${RPIDS[i]}" != "$1" ] || RPIDS[i]=; done
	for i in "${!CPID[@]}"; do [ "${CPID[i]}" != "$1" ] || CPID[i]=; done
	say "pid $1 reused: the role that held it had ended"
}

committed() {
	local v
	v=$(sed -n "s/.*model $MODEL: version \([0-9]*\) committed.*/\1/p" "$T/broker.log" | sort -n | tail -n 1)
	echo "${v:-0}"
}

# broker_metric NAME: the model's sample of deltacast_NAME in the broker's
# /metrics, 0 if none.
broker_metric() {
	local v
	v=$("$PY" -c 'import sys, urllib.request as u
try: sys.stdout.write(u.urlopen(sys.argv[1], timeout=2).read().decode())
except Exception: pass' "http://127.0.0.1:$((BPORT + 2))/metrics" |
		sed -n "s/^deltacast_$1{model=\"$MODEL\"} \([0-9]*\).*/\1/p")
	echo "${v:-0}"
}

# broker_newest: the broker's newest committed version, 0 if none.
broker_newest() { broker_metric model_version; }

# publish_from V: versions V..NVER, one every INTERVAL_MS (V an anchor when
# V > 1: a new producer has no baseline).
publish_from() {
	local v=$1 args=()
	for ((k = v; k <= NVER; k++)); do args+=("${FILES[k]}"); done
	publisher "$v" "${args[@]}"
	say "publish from $v (pid $PUB_PID)"
}

# publisher V FILE...: the producer, FILEs as versions V, V+1, ...
publisher() {
	local v=$1
	shift
	env "${TRIAL_ENV[@]}" "$FP" "$(producer_ep)" "$MODEL" "$v" "$INTERVAL_MS" "$@" \
		>>"$T/pub.out" 2>>"$T/pub.log" &
	e2e_track "$!"
	PUB_PID=$!
}

# publish_next: the trace from the first version the broker takes now: above
# its newest, and above the numbers spent on versions it lost from a damaged
# segment (deltacast_model_lost_version).  When those run past the trace's
# end, its last file goes out as that version (an anchor), which then
# stands for the last version (WANT) wherever it is checked.
publish_next() {
	local n l v
	n=$(broker_newest); l=$(broker_metric model_lost_version)
	v=$(((n > l ? n : l) + 1))
	if [ "$v" -le "$NVER" ]; then
		publish_from "$v"
		return
	fi
	WANT[v]=${WANT[NVER]}
	publisher "$v" "${FILES[NVER]}"
	say "publish version $NVER's file as $v: numbers up to $((v - 1)) are spent (pid $PUB_PID)"
}

# Where each side connects: through the proxy when it sits on that side.
producer_ep() {
	if [ -n "$PPORT" ] && [ "$PROXY_SIDE" = producers ]; then echo "tcp://127.0.0.1:$PPORT"; else echo "tcp://127.0.0.1:$BPORT"; fi
}

# consumer_ep K: where consumer K connects: the proxy in front of the
# consumers' port (of the first leaf relay, with relays), else its leaf
# relay's (FAULT_RELAY) or the broker's.
consumer_ep() {
	local leaf=
	[ "$RELAY" = 0 ] || leaf=$(relay_leaf "$1")
	if [ -n "$PPORT" ] && [ "$PROXY_SIDE" = consumers ] && { [ -z "$leaf" ] || [ "$leaf" = $((RELAY - 1)) ]; }; then
		echo "tcp://127.0.0.1:$PPORT"
	elif [ -n "$leaf" ]; then echo "tcp://127.0.0.1:$((RPORTS[leaf] + 1))"
	else echo "tcp://127.0.0.1:$((BPORT + 1))"; fi
}

# last_words I: the last line consumer I's current process wrote to stderr.
last_words() {
	tail -c +$((${CERRPOS[$1]:-0} + 1)) "$T/c$1.err" 2>/dev/null | tail -n 1
}

# refused_ckpt I: consumer I's current process refuses its local checkpoint.
refused_ckpt() {
	last_words "$1" | grep -qE "open: |start with an empty directory"
}

consumer_start() {
	local i=$1
	CDONE[i]=0
	CERRPOS[i]=$(stat -c %s "$T/c$i.err" 2>/dev/null || echo 0)
	env "${TRIAL_ENV[@]}" "$FC" "$(consumer_ep "$i")" "$MODEL" "$T/c$i" "$NVER" \
		>>"$T/c$i.out" 2>>"$T/c$i.err" &
	e2e_track "$!"
	CPID[i]=$!
}

cons_version() { e2e_last_version_fc "$T/c$1.out"; }
e2e_last_version_fc() {
	local v
	v=$(sed -n 's/^\(applied\|loaded\) \([0-9]*\) .*/\2/p' "$1" 2>/dev/null | tail -n 1)
	echo "${v:-0}"
}

# wait_point: wait for a progress point drawn from the seed (the producer's
# committed count or a consumer's version reaching k), then 0-300 ms more.
wait_point() {
	local k i who deadline=$((SECONDS + 15))
	rnd "$NVER"; k=$((R + 1))
	rnd 2; who=$R
	rnd "$NCONS"; i=$R
	rnd 300; local ms=$R
	while [ $SECONDS -lt $deadline ]; do
		if [ $who = 0 ]; then [ "$(committed)" -ge "$k" ] && break
		else [ "$(cons_version "$i")" -ge "$k" ] && break; fi
		sleep 0.05
	done
	sleep "0.$(printf '%03d' "$ms")"
}

# early_fault KIND J: the first fault of a full-disk trial strikes at once
# in half of them (drawn), while the anchor is written, not at a progress
# point (a consumer done with the trace writes little).
early_fault() {
	case $1 in disk_full | data_full | relay_full) ;; *) return 1 ;; esac
	[ "$2" = 0 ] || return 1
	rnd 2
	[ $R = 0 ] && say "the first fault at once, as the anchor goes out"
}

pause_len() { rnd 40; PAUSE="$((R / 10 + 0)).$((R % 10 + 1))"; } # 0.1 .. 4.0 s

flip_or_cut() { # flip_or_cut FILE: truncate, or flip one bit, drawn from the seed
	local f=$1 size off
	size=$(stat -c %s "$f" 2>/dev/null) || return 1
	[ "$size" -gt 0 ] || return 1
	rnd 2
	if [ $R = 0 ]; then
		rnd 1000
		truncate -s $((size * R / 1000)) "$f"
		say "truncated $f from $size to $((size * R / 1000))"
	else
		rnd 1000000; off=$((R % size))
		rnd 8
		"$PY" - "$f" "$off" "$R" <<'PYEOF'
import sys
p, off, bit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(p, "r+b") as f:
    f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ (1 << bit)]))
PYEOF
		say "flipped bit $R at $off of $f ($size bytes)"
	fi
}

pick_file() { # pick_file DIR GLOB...: one file under DIR, drawn from the seed
	local files=() f
	for f in "$@"; do [ -f "$f" ] && files+=("$f"); done
	[ ${#files[@]} -gt 0 ] || { PICK=; return 1; }
	rnd ${#files[@]}; PICK=${files[R]}
}

inject() { # inject KIND: one fault
	local kind=$1 i k
	rnd "$NCONS"; i=$R
	case $kind in
	broker_kill)
		must_end e2e_kill "SIGKILL broker" "$BROKER_PID"
		say "SIGKILL broker"; rnd 10; sleep "0.$R"; broker_start || say "broker restart failed" ;;
	broker_stop)
		pause_len; e2e_signal STOP "$BROKER_PID"; say "SIGSTOP broker for $PAUSE s"
		sleep "$PAUSE"; e2e_signal CONT "$BROKER_PID" ;;
	producer_kill)
		e2e_alive "$PUB_PID" || return 1
		must_end e2e_kill "SIGKILL producer" "$PUB_PID"; say "SIGKILL producer"
		rnd 10; sleep "0.$R"
		[ "$(broker_newest)" -lt "$NVER" ] && publish_next ;;
	producer_stop)
		e2e_alive "$PUB_PID" || return 1
		pause_len; e2e_signal STOP "$PUB_PID"; say "SIGSTOP producer for $PAUSE s"
		sleep "$PAUSE"; e2e_signal CONT "$PUB_PID" ;;
	consumer_kill)
		must_end e2e_kill "SIGKILL c$i" "${CPID[i]}"; say "SIGKILL c$i"
		rnd 10; sleep "0.$R"; consumer_start "$i" ;;
	consumer_stop)
		e2e_alive "${CPID[i]}" || return 1
		pause_len; e2e_signal STOP "${CPID[i]}"; say "SIGSTOP c$i for $PAUSE s"
		sleep "$PAUSE"; e2e_signal CONT "${CPID[i]}" ;;
	ckpt_corrupt)
		must_end e2e_kill "SIGKILL c$i" "${CPID[i]}"; say "SIGKILL c$i"
		pick_file "$T/c$i/model.safetensors" "$T/c$i"/model.safetensors.applied "$T/c$i"/model.safetensors.new \
			"$T/c$i"/model.dlog/*.rec && flip_or_cut "$PICK"
		consumer_start "$i" ;;
	run_change)
		must_end e2e_kill "run_change: SIGKILL producer and broker" "$PUB_PID" "$BROKER_PID"
		rm -rf "$T/data"
		[ "$CUR" = A ] && use_trace B || use_trace A
		say "SIGKILL producer and broker, data dir removed: a new run publishes trace $CUR"
		broker_start || say "broker restart failed"
		publish_from 1
		for ((k = 0; k < NCONS; k++)); do # those done with the old run follow the new one
			e2e_alive "${CPID[k]}" && continue
			must_end e2e_reap "run_change: c$k" "${CPID[k]}"; say "c$k had exited; restarted"; consumer_start "$k"
		done ;;
	segment_corrupt)
		must_end e2e_kill "SIGKILL broker" "$BROKER_PID"; say "SIGKILL broker"
		pick_file $(find "$T/data" -type f 2>/dev/null) && flip_or_cut "$PICK"
		broker_start || say "broker restart failed" ;;
	proxy | proxy_producer) sleep 1 ;; # the proxy injects on its own; count its lines afterwards
	relay_kill)
		relay_pick
		must_end e2e_kill "SIGKILL $(relay_name $RI)" "${RPIDS[RI]}"
		say "SIGKILL $(relay_name $RI)"; rnd 10; sleep "0.$R"; relay_start $RI || say "$(relay_name $RI) restart failed" ;;
	relay_stop)
		relay_pick
		e2e_alive "${RPIDS[RI]}" || return 1
		pause_len; e2e_signal STOP "${RPIDS[RI]}"; say "SIGSTOP $(relay_name $RI) for $PAUSE s"
		sleep "$PAUSE"; e2e_signal CONT "${RPIDS[RI]}" ;;
	disk_full) disk_full "$T/c$i" "c$i's directory" ;;
	data_full) disk_full "$T/data" "the broker's data dir" ;;
	relay_full) relay_pick; disk_full "$T/$(relay_name $RI)data" "$(relay_name $RI)'s data dir" ;;
	esac
	return 0
}

# behind_run I: in run_change trials, consumer I ended at the last version
# of a run before the newest one (its last report is not the current
# trace's): it is started again to follow the new run.
behind_run() {
	local d
	[ "$KIND" = run_change ] || return 1
	d=$(sed -n 's/^\(applied\|loaded\) [0-9]* \(anchor \|delta \)\?\([0-9a-f]*\) run .*/\3/p' "$T/c$1.out" | tail -n 1)
	[ "$d" != "${WANT[NVER]}" ]
}

# recover: stop injecting, bring back whatever is down, wait for convergence.
recover() {
	local deadline=$((SECONDS + CONVERGE_S)) i rc restarts=0
	[ -n "$PROXY_PID" ] && e2e_signal USR1 "$PROXY_PID"
	e2e_signal CONT "$BROKER_PID" "$PUB_PID" "${RPIDS[@]}" "${CPID[@]}"
	broker_alive || broker_start || { say "broker does not restart"; return 1; }
	relays_up || { say "a relay does not restart"; return 1; }
	while [ $SECONDS -lt $deadline ]; do
		if ! e2e_alive "$PUB_PID" && [ $restarts -lt 8 ]; then
			if [ "$(broker_newest)" -lt "$NVER" ]; then
				must_end e2e_reap "recover: producer" "$PUB_PID" || return 1
				restarts=$((restarts + 1))
				publish_next
			fi
		fi
		local done_n=0
		for ((i = 0; i < NCONS; i++)); do
			if [ "${CDONE[i]}" = 1 ]; then done_n=$((done_n + 1)); continue; fi
			if e2e_alive "${CPID[i]}"; then refused_ckpt "$i" || continue; fi
			must_end e2e_kill "recover: c$i" "${CPID[i]}" || return 1
			rc=$E2E_RC
			if [ $rc = 0 ] && ! behind_run "$i"; then CDONE[i]=1; done_n=$((done_n + 1)); continue; fi
			CREST[i]=$((${CREST[i]:-0} + 1))
			[ "${CREST[i]}" -le 10 ] || continue
			if refused_ckpt "$i"; then
				# a checkpoint refused with a clear error: the operator clears it
				say "c$i refused its checkpoint: $(last_words "$i"); cleared"
				rm -rf "$T/c$i"
			fi
			say "c$i exited $rc; restarting"
			consumer_start "$i"
		done
		[ $done_n = "$NCONS" ] && return 0
		sleep 0.1
	done
	say "not converged after ${CONVERGE_S}s: committed $(committed), consumers:$(for ((i = 0; i < NCONS; i++)); do printf ' %s' "$(cons_version "$i")"; done)"
	return 1
}

# proxy_tally: the proxy's faults of this trial, in all and by kind.
declare -A PX
proxy_tally() {
	local k
	FAULTS=$(grep -c '^fault ' "$T/proxy.log")
	for k in drop delay corrupt truncate duplicate swap; do
		PX[$k]=$((${PX[$k]:-0} + $(grep -c "^fault $k " "$T/proxy.log")))
	done
}

# trace_of V DIGEST: the trace (A or B) whose file for V has DIGEST, else
# nothing.  Past NVER (numbers spent on lost versions) the last file stands
# for the version.
trace_of() {
	local v=$1 d=$2 k
	[ "$v" -gt "$NVER" ] && v=$NVER
	for k in A B; do
		eval "[ \"\${WANT_$k[v]:-}\" = \"\$d\" ]" && { echo "$k"; return; }
	done
}

# check: divergences: a reported version whose digest is no producer's for
# V, or a run reported with both traces' weights (one run's state served as
# another's).
check() {
	local i v d r tr bad=0 lines parsed
	declare -A RUN_TRACE=()
	for ((i = 0; i < NCONS; i++)); do
		lines=$(grep -cE '^(applied|loaded) ' "$T/c$i.out" 2>/dev/null) parsed=0
		while read -r v d r; do
			parsed=$((parsed + 1))
			tr=$(trace_of "$v" "$d")
			if [ -z "$tr" ]; then
				bad=$((bad + 1)); say "DIVERGENCE c$i: version $v digest $d run $r (want ${WANT[v]:-none})"
				continue
			fi
			[ "$r" = 0000000000000000 ] && continue
			if [ -n "${RUN_TRACE[$r]:-}" ] && [ "${RUN_TRACE[$r]}" != "$tr" ]; then
				bad=$((bad + 1)); say "DIVERGENCE c$i: version $v of trace $tr reported as run $r, which served trace ${RUN_TRACE[$r]}"
			fi
			RUN_TRACE[$r]=$tr
		done < <(sed -n 's/^\(applied\|loaded\) \([0-9]*\) \(anchor \|delta \)\?\([0-9a-f]*\) run \([0-9a-f]*\)$/\2 \4 \5/p' \
			"$T/c$i.out" 2>/dev/null)
		[ "${lines:-0}" = "$parsed" ] || { bad=$((bad + 1)); say "DIVERGENCE c$i: $((lines - parsed)) report line(s) not understood"; }
	done
	DIVERGED=$bad
}

final_equal() {
	local i got ok=0
	for ((i = 0; i < NCONS; i++)); do
		got=$("$FD" "$T/c$i/model.safetensors" 2>>"$T/trial.log" | cut -d' ' -f1)
		[ "$got" = "${WANT[NVER]}" ] || { ok=1; say "c$i final file digest ${got:-unreadable}, want ${WANT[NVER]}"; }
	done
	return $ok
}

# cut_through SEED: CUT, the broker's --cut-through for this trial (FAULT_CUT_THROUGH).
cut_through() {
	CUT=()
	case "${FAULT_CUT_THROUGH:-0}" in
	1) CUT=(--cut-through) ;;
	alt) [ $(($1 % 2)) = 1 ] && CUT=(--cut-through) ;;
	esac
}

# bulk_flags SEED: BULK, the broker's --bulk for this trial (FAULT_BULK).
bulk_flags() {
	BULK=()
	case "${FAULT_BULK:-0}" in
	1) BULK=(--bulk 127.0.0.1:0)
	   [ $(($1 % 2)) = 0 ] || BULK+=(--bulk-no-local) ;;
	alt) [ $(($1 % 2)) = 0 ] && BULK=(--bulk 127.0.0.1:0) ;;
	esac
}

# bulk_how: " (tcp)" where this trial's --bulk is TCP only, else "".
bulk_how() {
	case " ${BULK[*]:-} " in *" --bulk-no-local "*) echo " (tcp)" ;; esac
}

# broker_counter SAMPLE [PORT]: SAMPLE's value on the broker's (its last
# start) metrics page, or on the one on PORT, "?" when absent
# (broker_metric reads one model's sample).
broker_counter() {
	local v
	v=$("$DC" status --broker "127.0.0.1:${2:-$((BPORT + 2))}" --raw 2>/dev/null | awk -v s="$1" '$1 == s {print $2}')
	echo "${v:-?}"
}

# bulk_count: BULKN, the anchors the broker sent over --bulk; "-" without.
bulk_count() {
	BULKN=-
	[ ${#BULK[@]} = 0 ] && return
	BULKN=$(broker_counter deltacast_bulk_versions_total)
	say "anchors sent over bulk: $BULKN"
	[ ${#RELAY_DATA[@]} = 0 ] || [ "$RELAY" = 0 ] ||
		say "$(relay_name $((RELAY - 1))) (its last start): anchor bytes its consumers read from its files:" \
			"$(broker_counter deltacast_bulk_local_bytes_total $(($(relay_last_port) + 2)))"
}

# ahead_count: AHEAD, the chunks the broker sent before their version's
# COMMIT (--cut-through); "-" without.
ahead_count() {
	AHEAD=-
	[ ${#CUT[@]} = 0 ] && return
	AHEAD=$(broker_counter deltacast_cut_through_chunks_total)
	say "chunks sent ahead of their COMMIT: $AHEAD"
}

# delta_count: DELTAS, the producer anchors the broker (its last start)
# made into deltas for the consumers at the version before.
delta_count() {
	DELTAS=$(broker_counter deltacast_anchor_deltas_total)
	say "producer anchors made into deltas: $DELTAS"
}

# run_trial SEED: sets KIND FAULTS DIVERGED CONV URING AHEAD DELTAS
run_trial() {
	local seed=$1 kind nfaults j
	RANDOM=$seed
	T=$ROOT/t$seed; rm -rf "$T"; mkdir -p "$T"
	BPORT= PPORT= RPORTS=() RPIDS=() PROXY_PID= PROXY_SIDE= FAULTS=0 TRIAL_ENV=(DELTACAST_LOG=info) CREST=() STUCK=
	rnd ${#KINDS[@]}; kind=${KINDS[R]}
	rnd 3; local uring=1; [ $R = 0 ] && { uring=0; TRIAL_ENV+=(DELTACAST_IO_URING=0); }
	rnd 3; nfaults=$((R + 1))
	cut_through "$seed"
	bulk_flags "$seed"
	say "seed $seed kind $kind faults $nfaults io_uring $uring${CUT:+ cut-through}${BULK:+ bulk}$(bulk_how)$(relays_said)"
	export DELTACAST_IO_URING=$uring
	[ $uring = 1 ] && unset DELTACAST_IO_URING
	KIND=$kind URING=$uring CONV=0 DIVERGED=0
	use_trace A
	[ "$kind" = run_change ] && { rnd 1500; TRIAL_ENV+=(FAULT_APPLY_HOLD_MS=$R); say "consumers hold READY versions $R ms"; }
	case $kind in
	disk_full) for ((j = 0; j < NCONS; j++)); do tmpfs_mount "$T/c$j" || say "c$j: no tmpfs"; done ;;
	data_full) tmpfs_mount "$T/data" || say "data dir: no tmpfs" ;;
	relay_full) for ((j = 0; j < NREL; j++)); do
			tmpfs_mount "$T/$(relay_name $j)data" || say "$(relay_name $j)'s data dir: no tmpfs"
		done ;;
	esac
	broker_start || return
	relays_up || { say "a relay does not start"; return; }
	if [ "$kind" = proxy ] || [ "$kind" = proxy_producer ]; then
		local try target=$((BPORT + 1))
		[ "$RELAY" = 0 ] || target=$(($(relay_last_port) + 1))
		PROXY_SIDE=consumers
		[ "$kind" = proxy_producer ] && { PROXY_SIDE=producers; target=$BPORT; }
		for try in $(seq 0 9); do
			PPORT=$(e2e_pick_port $((try + 50)))
			rnd 4; local drop=$((R + 1)); rnd 20; local delay=$((R + 5))
			rnd 4; local trunc=$((R + 1)); rnd 8; local corrupt=$((R + 2))
			rnd 16; local dup=$((R + 5)) swp=0
			[ "${FAULT_REORDER:-0}" = 0 ] || { rnd 16; swp=$((R + 5)); }
			"$PROXY" "$PPORT" "$target" "$seed" $drop $delay $trunc $corrupt $dup $swp 2>>"$T/proxy.log" &
			e2e_track "$!"; PROXY_PID=$!
			e2e_wait_for 20 grep -qs "listening on $PPORT" "$T/proxy.log" && break
			must_end e2e_kill "proxy on $PPORT did not come up" "$PROXY_PID"; PROXY_PID= PPORT=
		done
		say "proxy on $PPORT in front of the $PROXY_SIDE port: drop $drop delay $delay truncate $trunc corrupt $corrupt duplicate $dup swap $swp per mille"
	fi
	for ((j = 0; j < NCONS; j++)); do consumer_start "$j"; done
	publish_from 1
	for ((j = 0; j < nfaults; j++)); do
		early_fault "$kind" "$j" || wait_point
		inject "$kind" && FAULTS=$((FAULTS + 1))
	done
	[ -n "$PROXY_SIDE" ] && sleep 1
	local conv=1
	recover || conv=0
	[ $conv = 1 ] && { final_equal || conv=0; }
	ahead_count
	bulk_count
	delta_count
	[ -n "$PROXY_SIDE" ] && proxy_tally
	check
	must_end e2e_cleanup
	tmpfs_unmount
	[ -z "$STUCK" ] || conv=0
	unset DELTACAST_IO_URING
	CONV=$conv
}

# ---- the trials ----
if [ -n "${SEED:-}" ]; then
	SEEDLIST=("$SEED")
else
	base=${FAULT_SEED_BASE:-$((($$ * 7919 + $(date +%s)) % 1000000))}
	SEEDLIST=()
	for ((s = 0; s < ${SEEDS:-5}; s++)); do SEEDLIST+=($((base + s))); done
fi
declare -A N_TRIALS N_FAULTS N_DIV N_FAIL
failed_seeds=""
for seed in "${SEEDLIST[@]}"; do
	run_trial "$seed"
	kind=$KIND nf=$FAULTS dv=$DIVERGED conv=$CONV uring=$URING ct=$AHEAD bk=$BULKN ad=$DELTAS
	for k in "$kind" $([ "$uring" = 0 ] && echo io_uring_refused); do
		N_TRIALS[$k]=$((${N_TRIALS[$k]:-0} + 1))
		N_FAULTS[$k]=$((${N_FAULTS[$k]:-0} + nf))
		N_DIV[$k]=$((${N_DIV[$k]:-0} + dv))
		[ "$conv" = 1 ] || N_FAIL[$k]=$((${N_FAIL[$k]:-0} + 1))
	done
	status=ok
	if [ "$dv" != 0 ] || [ "$conv" != 1 ]; then
		status=FAIL; failed_seeds="$failed_seeds $seed"
		sed 's/^/    | /' "$ROOT/t$seed/trial.log"
		for f in "$ROOT/t$seed"/*.err; do tail -n 3 "$f" | sed "s#^#    | $(basename "$f"): #"; done
	fi
	printf 'trial SEED=%-8s %-16s faults %3s  io_uring %s  sent ahead %-5s  bulk %-3s  anchor deltas %-2s  divergences %s  converged %s  %s%s\n' \
		"$seed" "$kind" "$nf" "$([ "$uring" = 1 ] && echo on || echo off)" "$ct" "$bk" "$ad" "$dv" "$conv" "$status" \
		"$(relays_said | sed 's/^ /  /')"
	[ "$status" = ok ] && [ "${FAULT_KEEP:-}" != 1 ] && rm -rf "$ROOT/t$seed"
done

echo
printf '%-18s %7s %7s %12s %9s\n' "fault kind" trials faults divergences failures
tt=0 tf=0 td=0 tx=0
for k in $ALL_KINDS io_uring_refused; do
	[ -n "${N_TRIALS[$k]:-}" ] || continue
	printf '%-18s %7s %7s %12s %9s\n' "$k" "${N_TRIALS[$k]}" "${N_FAULTS[$k]}" "${N_DIV[$k]}" "${N_FAIL[$k]:-0}"
	[ "$k" = io_uring_refused ] && continue
	tt=$((tt + N_TRIALS[$k])); tf=$((tf + N_FAULTS[$k])); td=$((td + N_DIV[$k])); tx=$((tx + ${N_FAIL[$k]:-0}))
done
printf '%-18s %7s %7s %12s %9s\n' total "$tt" "$tf" "$td" "$tx"
[ -n "${N_TRIALS[proxy]:-}${N_TRIALS[proxy_producer]:-}" ] && echo "proxy faults by kind: drop ${PX[drop]} delay ${PX[delay]}" \
	"corrupt ${PX[corrupt]} truncate ${PX[truncate]} duplicate ${PX[duplicate]} swap ${PX[swap]}"
if [ -n "$failed_seeds" ]; then
	echo "faults: FAILED seeds:$failed_seeds (replay one with: SEED=N FAULT_KINDS=\"${KINDS[*]}\" make test-faults)"
	exit 1
fi
echo "faults: OK: $tt trials, $tf faults, 0 divergences, all converged"
