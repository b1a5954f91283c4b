#!/usr/bin/env bash
# Progress of long transfers: deltacast publish and subscribe print bytes,
# rate and ETA at most once a second, on a terminal by themselves (run on a
# pseudo-terminal with script(1)) and with --progress into a log.  The link
# is slowed by tests/tools/faultproxy (every read delayed 1..50 ms), so a
# 6 MB anchor takes seconds.
. "$(dirname "$0")/tools/broker_lib.sh"
B=$BUILD tmp=$TMP
command -v script >/dev/null || { echo "skip: no script(1) for a pseudo-terminal"; exit 77; }

"$B/deltacast" gen-trace --params 3M --steps 1 --density 0.01 -o "$tmp/trace" 2>/dev/null || fail "gen-trace"
f=$tmp/trace/v0000.safetensors
start_broker b

# slow NAME ENDPOINT: a faultproxy delaying every read to ENDPOINT's port,
# on the first free port from a random one; sets NAME_EP.
slow() {
	local name=$1 target=${2##*:} port=$((20000 + RANDOM % 20000)) pid
	for _ in $(seq 20); do
		"$B/tools/faultproxy" "$port" "$target" 7 0 1000 0 0 2>"$tmp/$name.log" &
		pid=$!
		PIDS+=("$pid")
		wait_for 5 grep -q 'listening on\|cannot listen' "$tmp/$name.log"
		if grep -q 'listening on' "$tmp/$name.log"; then
			eval "${name}_EP=tcp://127.0.0.1:$port"
			return 0
		fi
		wait "$pid"
		port=$((port + 1))
	done
	fail "no free port for proxy $name"
}
slow pp "$b_PROD"
slow cp "$b_CONS"

# lines FILE PATTERN: progress lines matching PATTERN (a carriage return or
# a newline ends one; the erase-line code that opens one is dropped)
lines() { tr '\r' '\n' <"$1" | sed 's/^\x1b\[K//' | grep -c "$2"; }

# publish on a pseudo-terminal: progress by itself, updated in place
script -qfec "'$B/deltacast' publish --broker '$pp_EP' --model tty '$f'" "$tmp/tty.out" \
	>/dev/null || fail "publish on a terminal: $(cat "$tmp/tty.out")"
n=$(lines "$tmp/tty.out" '^publish version 1 anchor: .* MiB of 6.0 MiB .* MiB/s')
[ "$n" -ge 2 ] || fail "publish on a terminal: $n progress lines, want 2 or more"
grep -q $'\r' "$tmp/tty.out" || fail "publish on a terminal: the line is not updated in place"
[ "$(lines "$tmp/tty.out" ' ETA [0-9]* s$')" -ge 1 ] || fail "publish on a terminal: no ETA"

# publish into a log: nothing without --progress, lines with it
"$B/deltacast" publish --broker "$b_PROD" --model quiet "$f" 2>"$tmp/quiet.err" || fail "publish"
! grep -q '^publish version' "$tmp/quiet.err" || fail "progress in a log without --progress"
"$B/deltacast" publish --progress --broker "$pp_EP" --model log "$f" 2>"$tmp/log.err" ||
	fail "publish --progress: $(cat "$tmp/log.err")"
n=$(grep -c '^publish version 1 anchor: .* ETA [0-9]* s$' "$tmp/log.err")
[ "$n" -ge 1 ] && [ "$(grep -c '^publish version 1 anchor: ' "$tmp/log.err")" -ge 2 ] ||
	fail "publish --progress: want 2 or more lines, one with an ETA: $(cat "$tmp/log.err")"
grep -q $'\r' "$tmp/log.err" && fail "publish --progress into a log: carriage returns"

# subscribe: an anchor through the slowed link, on a terminal and into a log
script -qfec "'$B/deltacast' subscribe --broker '$cp_EP' --model log --dir '$tmp/s1' --until 1" \
	"$tmp/stty.out" >/dev/null || fail "subscribe on a terminal: $(cat "$tmp/stty.out")"
n=$(lines "$tmp/stty.out" '^subscribe receiving: .* MiB of 6.0 MiB .* MiB/s')
[ "$n" -ge 1 ] || fail "subscribe on a terminal: no progress line"
"$B/deltacast" subscribe --progress --broker "$cp_EP" --model log --dir "$tmp/s2" --until 1 \
	>/dev/null 2>"$tmp/sub.err" || fail "subscribe --progress: $(cat "$tmp/sub.err")"
grep -q '^subscribe receiving: .* MiB of 6.0 MiB .* ETA [0-9]* s$' "$tmp/sub.err" ||
	fail "subscribe --progress: no progress line with an ETA: $(cat "$tmp/sub.err")"
cat "$tmp/log.err" "$tmp/sub.err"
echo "test_cli_progress: ok"
