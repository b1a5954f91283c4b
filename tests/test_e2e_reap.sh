#!/usr/bin/env bash
# scripts/e2e_lib.sh never blocks on bash's `wait`.  Without job control,
# `wait PID` sits in wait4(-1) until some child exits, and a stopped child
# never does: a wait on a stopped process, or on the number of a process
# reaped earlier that a stopped child now holds (pid_max 32768 on a shared
# machine), hangs for ever, as the fault suite's trial end did once while
# its broker was stopped.  Each case runs as its own bash under a timeout
# with real processes; the number reuse is made certain in a new PID
# namespace (unshare, ns_last_pid), else that case is skipped.
set -u
cd "$(dirname "$0")/.." || exit 1
LIMIT_S=10

# ticked_past PID: the clock (in ticks, as /proc/uptime's hundredths) has
# passed the tracked PID's start time, so a new process cannot share it.
ticked_past() {
	local up
	read -r up _ </proc/uptime
	[ "$((10#${up/./}))" -gt "${E2E_START[$1]}" ]
}

# stopped PID: PID's state is T (a SIGSTOP takes effect a moment after kill).
stopped() {
	local st=
	read -r _ _ st _ 2>/dev/null <"/proc/$1/stat"
	[ "$st" = T ]
}

# reuse_number: a tracked child exits and is reaped, and a new child (not
# tracked) takes its number: NEW.  Returns 77 (said) where the number
# cannot be steered (ns_last_pid), 1 on a failure (said).
reuse_number() {
	local a
	sleep 300 &
	a=$!
	KIDS+=("$a")
	e2e_track "$a"
	kill -9 "$a"
	e2e_wait_for 50 eval '[ ! -e /proc/$a ]' || { echo "FAIL: pid $a never reaped"; return 1; }
	e2e_wait_for 50 ticked_past "$a" || { echo "FAIL: the clock did not move"; return 1; }
	echo $((a - 1)) >/proc/sys/kernel/ns_last_pid || { echo "skip: ns_last_pid not writable"; return 77; }
	sleep 300 &
	NEW=$!
	KIDS+=("$NEW")
	[ "$NEW" = "$a" ] || { echo "skip: pid $a not reused (got $NEW)"; return 77; }
}

# reused: a tracked process exits and is reaped; its number goes to a
# stopped child that nobody tracked.  e2e_cleanup must return (it must not
# wait on that number), and must not signal the stranger either.
case_reused() {
	local s
	reuse_number || return
	s=$NEW
	kill -STOP "$s"
	e2e_wait_for 50 stopped "$s" || { echo "FAIL: pid $s did not stop"; return 1; }
	e2e_cleanup 2>&1
	stopped "$s" || { echo "FAIL: e2e_cleanup signalled pid $s, not its own"; return 1; }
	kill -9 "$s"
	echo "ok: e2e_cleanup returned with a stopped stranger on a tracked process's number"
}

# retracked: a tracked process exits and is reaped; its number goes to a
# new process that is tracked too.  e2e_track must call the e2e_reused hook
# with that number (faults.sh forgets the role that held it there), and
# the newcomer is e2e_alive.
case_retracked() {
	local s
	REUSED=
	e2e_reused() { REUSED=$1; }
	reuse_number || return
	s=$NEW
	[ -z "$REUSED" ] || { echo "FAIL: e2e_reused called before the new track"; return 1; }
	e2e_track "$s"
	[ "$REUSED" = "$s" ] || { echo "FAIL: e2e_track of pid $s did not call e2e_reused (got '$REUSED')"; return 1; }
	e2e_alive "$s" || { echo "FAIL: the newcomer on pid $s is not e2e_alive"; return 1; }
	echo "ok: e2e_track says when it tracks a new process on an exited one's number"
}

# stopped: a tracked child stopped and left running after SIGCONT: e2e_reap
# gives up at its deadline with a line naming the step and the process;
# e2e_kill ends it (status 137).  A reaped one's status comes back.
case_stopped() {
	local s r err
	sleep 300 &
	s=$!
	KIDS+=("$s")
	e2e_track "$s"
	kill -STOP "$s"
	e2e_wait_for 50 stopped "$s" || { echo "FAIL: pid $s did not stop"; return 1; }
	err=$(e2e_reap "trial end" "$s" 5 2>&1) && { echo "FAIL: e2e_reap said pid $s ended"; return 1; }
	[[ "$err" == "e2e: trial end: pid $s (sleep) did not end within 0.5 s" ]] ||
		{ echo "FAIL: e2e_reap's line: '$err'"; return 1; }
	e2e_kill "SIGKILL" "$s" || { echo "FAIL: e2e_kill left pid $s"; return 1; }
	[ "$E2E_RC" = 137 ] || { echo "FAIL: pid $s status $E2E_RC, want 137"; return 1; }
	(exit 3) &
	r=$!
	e2e_track "$r"
	e2e_wait_for 50 eval '[ ! -e /proc/$r ]' || { echo "FAIL: pid $r never reaped"; return 1; }
	e2e_reap "exited" "$r" && [ "$E2E_RC" = 3 ] || { echo "FAIL: pid $r status ${E2E_RC:-none}, want 3"; return 1; }
	echo "ok: e2e_reap names a process that does not end; e2e_kill ends a stopped one"
}

if [ $# = 1 ]; then
	. scripts/e2e_lib.sh
	KIDS=() # every child a case starts, killed however the case ends
	trap 'kill -9 "${KIDS[@]}" 2>/dev/null' EXIT
	"case_$1"
	exit
fi

fail=0 skipped=
run_case() { # run_case NAME [PREFIX...]: case NAME in a bash of its own
	local rc
	timeout -k 2 "$LIMIT_S" "${@:2}" bash "$0" "$1"
	rc=$?
	case $rc in
	0) ;;
	77) skipped="$skipped $1" ;;
	124 | 137) echo "FAIL: case $1 still waiting after ${LIMIT_S} s: a wait blocked"; fail=1 ;;
	*) echo "FAIL: case $1 exited $rc"; fail=1 ;;
	esac
}
run_case stopped
if unshare -Urpf --mount-proc true 2>/dev/null; then
	run_case reused unshare -Urpf --mount-proc --kill-child
	run_case retracked unshare -Urpf --mount-proc --kill-child
else
	echo "skip: cases reused, retracked: no user and PID namespace (unshare -Urpf)"
	skipped="$skipped reused retracked"
fi
[ $fail = 0 ] && [ -n "$skipped" ] && { echo "SKIP: case(s)$skipped could not run"; exit 77; }
exit $fail
