#!/usr/bin/env bash
# An anchor taken in place is READY once received and checked, its file's
# writes running behind: on a disk slower than the network (the consumer
# in a blkio cgroup that throttles its writes to 32 MB/s), a library
# consumer joining a 40M gen-trace anchor (77 MB) over bulk is READY with
# less than half of its file written (direct_write_bytes on its ready
# line; the writes take 2.4 s at that rate), applies it, and at close
# waits for them and seals model.safetensors, bit-exact to the anchor.
# One killed (SIGKILL) right at READY, more of its file's writes waiting
# than the 16 under way (32 MiB), leaves no checkpoint the next open
# takes: restarted without the throttle it fetches the anchor again and
# ends at version 1, bit-exact.  One whose file loses a write after READY
# (DELTACAST_CONSUMER_FAULT=filewrite:1: the kernel's result of the first
# write reaped after the COMMIT becomes an I/O error) keeps the version
# (applied), says that the write failed, never seals the file with the
# hole, and at close folds model.safetensors from the tensors instead,
# bit-exact.  One that binds every tensor to memory of its own right after
# the apply (the library's host copy, which the file's writes still read,
# is given back then: BENCH_SYNC_CONSUMER_BIND_HOST=1) seals the file
# bit-exact too.  Where io_uring is refused (DELTACAST_IO_URING=0) the
# I/O engine's own threads write behind the same way.  While the file's
# writes run behind, the session and fold threads sleep until one
# finishes, not on a tick.  A delta right behind
# the anchor is READY only once the
# anchor's file is written, so that its apply does not wait for the disk,
# and its records do not wait for those writes either (the session
# thread held for seconds, no heartbeat, the broker dropping the session;
# where io_uring is refused too),
# nor, spilled to its record file, its read back to be checked ahead, nor,
# dropped (its COMMIT timed out), the drop of what it staged.  An anchor
# dropped before its COMMIT, or by a run change behind it, or READY and
# not applied at close, drops its file without writing the rest of it.
# Exit 77 where the blkio throttle cannot
# be had (not root, no cgroup v1 blkio, no block device under the
# directory).
. "$(dirname "$0")/tools/broker_lib.sh"

CG=/sys/fs/cgroup/blkio/dcast-trailing-$$
BPS=33554432
trap 'cleanup; rmdir "$CG" 2>/dev/null' EXIT # its processes gone first

# The block device (MAJ:MIN) under $TMP: the disk, not a partition of it.
disk_of() {
	local src name
	src=$(df --output=source "$TMP" | tail -n 1)
	name=$(basename "$(readlink -f "$src")")
	[ -e "/sys/class/block/$name/partition" ] && name=$(basename "$(readlink -f "/sys/class/block/$name/..")")
	cat "/sys/class/block/$name/dev" 2>/dev/null
}
dev=$(disk_of)
if [ -z "$dev" ] || ! mkdir "$CG" 2>/dev/null || ! echo "$dev $BPS" >"$CG/blkio.throttle.write_bps_device" 2>/dev/null; then
	echo "SKIP: no blkio write throttle here (cgroup v1 blkio, a block device under $TMP, root)"
	exit 77
fi

"$BUILD/deltacast" gen-trace --params 40M --steps 1 --density 0.3 -o "$TMP/trace" 2>/dev/null || fail "gen-trace"
model=$TMP/trace/v0000.safetensors
bytes=$(($(stat -c %s "$model") - 4096))
start_broker b --heartbeat-ms 200 --bulk 127.0.0.1:0 --data-dir "$TMP/data"
"$BUILD/tools/fault_publish" "$b_PROD" bench 1 0 "$model" >"$TMP/pub.log" 2>&1 || fail "publish: $(cat "$TMP/pub.log")"

# throttled CMD...: CMD in the throttled cgroup, as this process (exec).
throttled() {
	exec sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CG" "$@"
}

# stalled ERR: the consumer's log says its session thread was held for a
# second or more in one turn (the disk's pace: the anchor's 77 MB take
# 2.4 s at this rate; a loaded machine's turn takes a few hundred ms at
# most), or that it re-joined (the broker dropped its silent session).
stalled() {
	grep -q "re-joining" "$1" || busy_long "$1"
}

# busy_long ERR: the consumer's log says its session thread was held for a
# second or more in one turn, or that the broker dropped its session.
busy_long() {
	grep -q "broker lost our session" "$1" || busy_turn "$1"
}

# busy_turn ERR: the consumer's log says its session thread was held for a
# second or more in one turn.
busy_turn() {
	grep -oE "session thread busy [0-9]+ ms" "$1" | awk '$4 >= 1000 { found = 1 } END { exit !found }'
}

# same DIR: DIR/model.safetensors holds the anchor's tensors bit for bit.
same() {
	"$BUILD/deltacast" diff "$model" "$1/model.safetensors" --json >"$1.diff" || fail "diff $1 exited $?"
	grep -q '^{"elements":[0-9]*,"changed":0,' "$1.diff" || fail "$1 differs: $(head -c 200 "$1.diff")"
}

# behind N: consumer N was READY with less than half of its file written
# (the rest written behind), applied the anchor, and sealed it bit-exact.
behind() {
	local written
	written=$(awk '$1 == "ready" && $2 == 1 { for (i = 3; i < NF; i++) if ($i == "direct_write_bytes") print $(i + 1) }' "$TMP/c$1.log")
	[ -n "$written" ] || fail "consumer $1: no ready line: $(cat "$TMP/c$1.log")"
	[ $((2 * written)) -lt "$bytes" ] ||
		fail "consumer $1 was READY with $written of its file's $bytes bytes written: it waited for the disk"
	grep -q "^applied 1 anchor " "$TMP/c$1.log" || fail "consumer $1 did not apply the anchor: $(cat "$TMP/c$1.log")"
	same "$TMP/c$1"
}

(throttled "$BUILD/tools/bench_sync_consumer" "$b_CONS" bench "$TMP/c1" 1) >"$TMP/c1.log" 2>"$TMP/c1.err" ||
	fail "consumer 1 exited $?: $(tail -3 "$TMP/c1.err")"
behind 1

# The same where io_uring is refused (DELTACAST_IO_URING=0, as in a
# container whose seccomp profile forbids it): the plain pread/pwrite twin
# runs the writes on threads of its own, so READY does not wait for the
# disk there either.
(DELTACAST_IO_URING=0 throttled "$BUILD/tools/bench_sync_consumer" "$b_CONS" bench "$TMP/c12" 1) \
	>"$TMP/c12.log" 2>"$TMP/c12.err" || fail "consumer 12 exited $?: $(tail -3 "$TMP/c12.err")"
grep -q "io_uring unavailable (DELTACAST_IO_URING=0)" "$TMP/c12.err" || fail "consumer 12 did not take the plain path"
behind 12

# switches PID NAME: "TID N", N the wake-ups so far (voluntary and
# involuntary context switches) of PID's thread named NAME (dcast-session,
# dcast-fold).
switches() {
	local t
	for t in /proc/"$1"/task/*; do
		[ "$(cat "$t/comm" 2>/dev/null)" = "$2" ] || continue
		awk -v tid="${t##*/}" '/^(non)?voluntary_ctxt_switches/ { n += $2 } END { print tid, n }' "$t/status"
		return 0
	done
	return 1
}

# sealed_watch PID FILE: true once FILE is there.  Meanwhile FOLD_WAKES
# adds up the wake-ups of PID's fold threads (one runs per job: a new one
# is counted from its start) and FOLD_SEEN is when they were last seen.
sealed_watch() {
	local tid n
	if read -r tid n < <(switches "$1" dcast-fold); then
		[ "$tid" = "$FOLD_TID" ] || { FOLD_TID=$tid FOLD_AT=0; }
		FOLD_WAKES=$((FOLD_WAKES + n - FOLD_AT)) FOLD_AT=$n FOLD_SEEN=$(date +%s%N)
	fi
	test -e "$2"
}

# While the anchor's file is written behind, the session thread sleeps
# until a write finishes (the I/O ring's fd is in its poll set) or a
# quarter heartbeat passes (50 ms here): from the apply to the seal (the
# file's last writes, a second or more at this rate), it wakes less than
# 250 times a second, where a 1 ms tick would wake it some 1000 times.
# The fold thread, waiting for those writes before its seal, wakes as
# each 2 MiB write ends (16 a second at 32 MB/s): less than 60 a second,
# where a 10 ms tick would wake it over 100 times.
(BENCH_SYNC_CONSUMER_SETTLE=1 throttled "$BUILD/tools/bench_sync_consumer" "$b_CONS" bench "$TMP/c11" 1) \
	>"$TMP/c11.log" 2>"$TMP/c11.err" &
pid=$! # the subshell's, which becomes the consumer
PIDS+=("$pid")
wait_for 60 grep -q "^applied 1 anchor " "$TMP/c11.log" || fail "consumer 11: no apply: $(tail -3 "$TMP/c11.err")"
read -r _ sw0 < <(switches "$pid" dcast-session) || fail "consumer 11: no thread named dcast-session"
read -r FOLD_TID FOLD_AT < <(switches "$pid" dcast-fold) || fail "consumer 11: no thread named dcast-fold"
FOLD_WAKES=0
t0=$(date +%s%N)
FOLD_SEEN=$t0
[ ! -e "$TMP/c11/model.safetensors" ] || fail "consumer 11: its file was sealed before the apply was seen"
wait_for 60 sealed_watch "$pid" "$TMP/c11/model.safetensors" || fail "consumer 11: the anchor's file never sealed"
read -r _ sw1 < <(switches "$pid" dcast-session) || fail "consumer 11: its session thread is gone before it settled"
t1=$(date +%s%N)
wait "$pid" || fail "consumer 11 exited $?: $(tail -3 "$TMP/c11.err")"
same "$TMP/c11"
rate=$(((sw1 - sw0) * 1000000000 / (t1 - t0)))
echo "session thread while its anchor's file was written behind: $((sw1 - sw0)) wake-ups in $(((t1 - t0) / 1000000)) ms"
[ "$rate" -lt 250 ] || fail "consumer 11's session thread woke $rate times a second while writes ran behind"
[ $((FOLD_SEEN - t0)) -gt 500000000 ] || fail "consumer 11's fold thread was seen for less than 0.5 s of the writes"
rate=$((FOLD_WAKES * 1000000000 / (FOLD_SEEN - t0)))
echo "fold thread waiting for those writes: $FOLD_WAKES wake-ups in $(((FOLD_SEEN - t0) / 1000000)) ms"
[ "$rate" -lt 60 ] || fail "consumer 11's fold thread woke $rate times a second while it waited for the writes"

# Killed at READY, its writes still running: the next open fetches again.
(throttled "$BUILD/tools/bench_sync_consumer" "$b_CONS" bench "$TMP/c2" 1) >"$TMP/c2.log" 2>"$TMP/c2.err" &
pid=$! # the subshell's, which becomes the consumer
PIDS+=("$pid")
wait_for 60 grep -q "^ready 1 " "$TMP/c2.log" || fail "consumer 2: no READY: $(tail -3 "$TMP/c2.err")"
kill -9 "$pid"
wait "$pid" 2>/dev/null
# The kernel finishes the dead process's writes under way before its files
# close: the directory's lock goes with the last of them.
wait_for 60 flock -n "$TMP/c2/lock" true || fail "consumer 2's directory still locked 60 s after its death"
"$BUILD/tools/bench_sync_consumer" "$b_CONS" bench "$TMP/c2" 1 >"$TMP/c2b.log" 2>"$TMP/c2b.err" ||
	fail "consumer 2 restarted exited $?: $(tail -3 "$TMP/c2b.err")"
[ "$(grep -c "^applied 1 anchor " "$TMP/c2b.log")" = 1 ] || fail "consumer 2 restarted: $(cat "$TMP/c2b.log")"
same "$TMP/c2"
# A write lost after READY: the checkpoint comes from the tensors instead.
(DELTACAST_CONSUMER_FAULT=filewrite:1 throttled "$BUILD/tools/bench_sync_consumer" "$b_CONS" bench "$TMP/c3" 1) \
	>"$TMP/c3.log" 2>"$TMP/c3.err" || fail "consumer 3 exited $?: $(tail -3 "$TMP/c3.err")"
grep -q "^applied 1 anchor " "$TMP/c3.log" || fail "consumer 3 did not apply the anchor: $(cat "$TMP/c3.log")"
grep -q "anchor 1: a write of its file failed: .*Input/output error (test fault); folding from the tensors" \
	"$TMP/c3.err" || fail "consumer 3 did not report the lost write: $(grep -v ' I ' "$TMP/c3.err" | tail -5)"
same "$TMP/c3"

# Bound elsewhere at once: the writes read the host copy before it goes.
(BENCH_SYNC_CONSUMER_BIND_HOST=1 throttled "$BUILD/tools/bench_sync_consumer" "$b_CONS" bench "$TMP/c4" 1) \
	>"$TMP/c4.log" 2>"$TMP/c4.err" || fail "consumer 4 exited $?: $(tail -3 "$TMP/c4.err")"
grep -q "tensors bound to host memory" "$TMP/c4.err" || fail "consumer 4 did not bind: $(tail -3 "$TMP/c4.err")"
written=$(awk '$1 == "ready" && $2 == 1 { for (i = 3; i < NF; i++) if ($i == "direct_write_bytes") print $(i + 1) }' "$TMP/c4.log")
[ $((2 * written)) -lt "$bytes" ] || fail "consumer 4 was READY with $written of $bytes bytes written: no write trailed"
same "$TMP/c4"

# Closed at READY, the anchor not applied: the next open drops its .new
# file, so the writes of it still waiting are moot and the close does not
# make them (it had written less than half at READY, and waits only for
# those under way).  Opened again, it fetches the anchor, bit-exact.
(BENCH_SYNC_CONSUMER_CLOSE_AT_READY=1 throttled "$BUILD/tools/bench_sync_consumer" "$b_CONS" bench "$TMP/c10" 1) \
	>"$TMP/c10.log" 2>"$TMP/c10.err" || fail "consumer 10 exited $?: $(tail -3 "$TMP/c10.err")"
wrote=$(awk '$1 == "closed" && $2 == 1 { print $4 }' "$TMP/c10.log")
[ -n "$wrote" ] || fail "consumer 10: no closed line: $(cat "$TMP/c10.log")"
[ "$wrote" -lt "$bytes" ] ||
	fail "consumer 10 had written $wrote bytes when closed, the anchor's file is $bytes: its close wrote what was moot"
echo "closed at READY: $wrote bytes written of the anchor file's $bytes"
"$BUILD/tools/bench_sync_consumer" "$b_CONS" bench "$TMP/c10" 1 >"$TMP/c10b.log" 2>"$TMP/c10b.err" ||
	fail "consumer 10 reopened exited $?: $(tail -3 "$TMP/c10b.err")"
grep -q "^applied 1 anchor " "$TMP/c10b.log" || fail "consumer 10 reopened: $(cat "$TMP/c10b.log")"
same "$TMP/c10"

# A delta right behind the anchor (model bench2: anchor 1, delta 2, of
# 30% density) is
# READY only once the anchor's file is written: its apply would wait for
# those writes, in the caller's pause.  So READY 2 comes seconds after
# READY 1, and apply 2 takes a fraction of that (announced at once, as
# before, READY 2 came right after the anchor's apply and apply 2 waited
# the seconds out).
"$BUILD/tools/fault_publish" "$b_PROD" bench2 1 0 "$model" "$TMP/trace/v0001.safetensors" >"$TMP/pub2.log" 2>&1 ||
	fail "publish bench2: $(cat "$TMP/pub2.log")"
# delta_behind N: consumer N took anchor 1 and delta 2 of bench2 (in the
# caller's environment), its session thread never held by the anchor's
# writes, READY 2 seconds after READY 1 and applied in a fraction of that.
delta_behind() {
	local gap apply2
	(throttled "$BUILD/tools/bench_sync_consumer" "$b_CONS" bench2 "$TMP/c$1" 2) >"$TMP/c$1.log" 2>"$TMP/c$1.err" ||
		fail "consumer $1 exited $?: $(tail -3 "$TMP/c$1.err")"
	read -r gap apply2 < <(awk '$1 == "ready" { t[$2] = $4 }
		$1 == "applied" && $2 == 2 { for (i = 3; i < NF; i++) if ($i == "apply_ns") a = $(i + 1) }
		END { if (t[1] && t[2] && a) printf "%.0f %.0f\n", t[2] - t[1], a }' "$TMP/c$1.log")
	[ -n "${apply2:-}" ] || fail "consumer $1: no READY 1, READY 2 and apply 2: $(cat "$TMP/c$1.log")"
	stalled "$TMP/c$1.err" && fail "consumer $1's session thread waited for the anchor's file (its records behind those writes)"
	[ $((4 * apply2)) -lt "$gap" ] ||
		fail "consumer $1: READY 2 $((gap / 1000000)) ms after READY 1, its apply $((apply2 / 1000000)) ms: the apply waited for the anchor's file"
	echo "consumer $1, delta behind the anchor: READY $((gap / 1000000)) ms after it, applied in $((apply2 / 1000000)) ms"
}
delta_behind 5

# The same where io_uring is refused: the I/O engine's threads run the
# record file's writes beside the anchor file's (those wait for the disk
# in their syscalls, and the file's other writes behind them for its
# lock), not behind them: the session thread, waiting for its records,
# was held 0.6-1.8 s there, and the broker dropped its session.
DELTACAST_IO_URING=0 delta_behind 13
grep -q "io_uring unavailable (DELTACAST_IO_URING=0)" "$TMP/c13.err" || fail "consumer 13 did not take the plain path"

# The same delta (8 MB) through an 8 MiB staging budget (2 MiB of it for
# payloads in memory) spills to its record file, and is read back from
# there to be checked ahead while the anchor's file is still written:
# beside those writes, not after them.
(throttled "$BUILD/deltacast" subscribe --broker "$b_CONS" --model bench2 --dir "$TMP/c6" --until 2 \
	--budget 8388608) >"$TMP/c6.log" 2>"$TMP/c6.err" || fail "consumer 6 exited $?: $(tail -3 "$TMP/c6.err")"
grep -q "^version 2 delta " "$TMP/c6.log" || fail "consumer 6 did not apply the delta: $(cat "$TMP/c6.log")"
stalled "$TMP/c6.err" && fail "consumer 6's session thread waited for the anchor's file (its spilled delta read back)"
stop_broker b

# A delta dropped behind the anchor (its COMMIT never comes: a broker
# with --cut-through streams half of it, its producer holding inside)
# drops what it staged once its record writes are done, not after the
# anchor's file too: the drop is on the session thread.  A 96 MiB anchor
# (3 x 16M BF16) takes 3 s at the throttle's rate, the drop comes 500 ms
# after the delta's last chunk.
# held_drop I MODEL UNTIL ELEMS AT WANT WHY: consumer I of broker ct
# (`deltacast subscribe --until UNTIL`, COMMIT timeout 500 ms, writes
# throttled) while a producer of UNTIL versions of 3 x ELEMS BF16 holds
# inside version AT until the consumer dropped it, then goes on; the
# consumer ends with a line matching WANT, its session thread never held
# (else the failure says it WHY).
held_drop() {
	local i=$1 m=$2 until=$3 elems=$4 at=$5 want=$6 why=$7 pid
	(DELTACAST_COMMIT_TIMEOUT_MS=500 throttled "$BUILD/deltacast" subscribe --broker "$ct_CONS" --model "$m" \
		--dir "$TMP/c$i" --until "$until") >"$TMP/c$i.log" 2>"$TMP/c$i.err" &
	pid=$!
	PIDS+=("$pid")
	wait_consumers ct 1
	bg "p$i" "$WC" produce "$ct_PROD" "$m" --versions "$until" --elems "$elems" --hold-at "$at" \
		--hold-file "$TMP/go$i" --timeout-ms 120000
	wait_for 60 grep -q "version $at: no COMMIT [0-9]* ms after its last chunk" "$TMP/c$i.err" ||
		fail "consumer $i did not time out version $at: $(tail -3 "$TMP/c$i.err")"
	touch "$TMP/go$i"
	wait "$pid" || fail "consumer $i exited $?: $(tail -3 "$TMP/c$i.err")"
	grep -q "$want" "$TMP/c$i.log" || fail "consumer $i did not end with '$want': $(cat "$TMP/c$i.log")"
	if busy_long "$TMP/c$i.err"; then
		fail "consumer $i's session thread $why: $(grep -m2 'busy\|lost our' "$TMP/c$i.err")"
	fi
}

start_broker_metrics ct --heartbeat-ms 200 --cut-through --part-timeout-ms 600000
held_drop 7 ct 3 16777216 2 "^version 3 " "waited for the anchor's file (a delta dropped behind it)"

# The anchor itself dropped before its COMMIT, half of it taken in place
# (its producer holding inside it, a 192 MiB model: 3 x 32M BF16): the
# writes of its file still waiting for a slot are moot, and the drop does
# not wait for them.  It is taken whole once it commits.
held_drop 9 ct9 1 33554432 1 "^version 1 anchor " "waited for its dropped anchor's file"
stop_broker ct

# A run change right behind the anchor (its model deleted and published
# again: a new run) drops the local state, the anchor's file with it: the
# writes of that file still waiting are moot, and the drop waits for those
# under way only, not for the rest of the file at the disk's pace, on the
# session thread.  The new run's anchor and delta then come, bit-exact.
start_broker rc --heartbeat-ms 200 --bulk 127.0.0.1:0 --data-dir "$TMP/rcdata" --admin-socket "$TMP/rc.sock"
"$BUILD/tools/fault_publish" "$rc_PROD" rcm 1 0 "$model" >"$TMP/pub8.log" 2>&1 || fail "publish rcm: $(cat "$TMP/pub8.log")"
(throttled "$BUILD/deltacast" subscribe --broker "$rc_CONS" --model rcm --dir "$TMP/c8" --until 2) \
	>"$TMP/c8.log" 2>"$TMP/c8.err" &
c8=$!
PIDS+=("$c8")
wait_for 60 grep -q "^version 1 anchor " "$TMP/c8.log" || fail "consumer 8: no anchor: $(tail -3 "$TMP/c8.err")"
"$BUILD/deltacast" model delete rcm --admin-socket "$TMP/rc.sock" >"$TMP/del8.log" 2>&1 ||
	fail "delete rcm: $(cat "$TMP/del8.log")"
"$BUILD/tools/fault_publish" "$rc_PROD" rcm 1 0 "$model" "$TMP/trace/v0001.safetensors" >"$TMP/pub8b.log" 2>&1 ||
	fail "publish rcm again: $(cat "$TMP/pub8b.log")"
wait "$c8" || fail "consumer 8 exited $?: $(tail -3 "$TMP/c8.err")"
grep -q "belongs to run .* dropped" "$TMP/c8.err" || fail "consumer 8 saw no run change: $(tail -5 "$TMP/c8.err")"
grep -q "^version 2 delta " "$TMP/c8.log" || fail "consumer 8 did not apply the new run's delta: $(cat "$TMP/c8.log")"
busy_turn "$TMP/c8.err" &&
	fail "consumer 8's session thread waited for the dropped anchor's file: $(grep -m1 'busy' "$TMP/c8.err")"
stop_broker rc
echo "PASS"
