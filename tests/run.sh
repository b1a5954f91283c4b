#!/usr/bin/env bash
# Test runner: runs every tests/test_* (C executables from $BUILD/tests, .sh
# and .py scripts), each under a timeout, one result line each, then the
# closing line "N passed, N failed, N skipped".  Exit 0 pass / 77 skip / other
# fail, as in liburing.  An optional argument keeps only names containing it.
# The tests make their directories under /tmp (dcast-*, dcast_*): those
# that appeared while a test ran are removed once it passed or skipped, and
# kept when it failed (named under its result line).  So run nothing else
# that makes such directories beside `make test`.
# TEST_WRAP="PROGRAM ARGS...": the C executables alone, each run under it
# (`make test-valgrind`); the scripts are left out, and not counted.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
TEST_TIMEOUT=${TEST_TIMEOUT:-180}
filter=${1:-}
read -r -a wrap <<<"${TEST_WRAP:-}"
export DELTACAST_BUILD="$PWD/$BUILD" DELTACAST_LIB="$PWD/$BUILD/libdeltacast.so"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
logdir="$BUILD/test-logs"
mkdir -p "$logdir"

tests=()
for f in "$BUILD"/tests/test_*; do [ -x "$f" ] && tests+=("$f"); done
for f in tests/test_*.sh tests/test_*.py; do [ -f "$f" ] && tests+=("$f"); done

pass=0 fail=0 skip=0 failed_names=""
declare -A had

# tmp_mark: the test directories /tmp holds now, in `had`.
tmp_mark() {
	local d
	had=()
	for d in /tmp/dcast[-_]*; do [ -e "$d" ] && had[$d]=1; done
}

# tmp_made: those that appeared since tmp_mark.
tmp_made() {
	local d
	for d in /tmp/dcast[-_]*; do [ -e "$d" ] && [ -z "${had[$d]:-}" ] && echo "$d"; done
}
for t in "${tests[@]}"; do
	name=$(basename "$t")
	[ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
	case "$t" in
	*.py | *.sh) [ ${#wrap[@]} = 0 ] || continue ;;&
	*.py) cmd=("$PYTHON" "$t") ;;
	*.sh) cmd=(bash "$t") ;;
	*) cmd=(${wrap[@]+"${wrap[@]}"} "$t") ;;
	esac
	tmp_mark
	start=$(date +%s%N)
	timeout -k 5 "$TEST_TIMEOUT" "${cmd[@]}" >"$logdir/$name.log" 2>&1
	rc=$?
	ds=$((($(date +%s%N) - start) / 100000000)); secs="$((ds / 10)).$((ds % 10))"
	case $rc in
	0) pass=$((pass + 1)); printf 'PASS  %-40s %6ss\n' "$name" "$secs" ;;
	77) skip=$((skip + 1)); printf 'SKIP  %-40s %6ss  %s\n' "$name" "$secs" "$(tail -n 1 "$logdir/$name.log")" ;;
	*)
		fail=$((fail + 1)); failed_names="$failed_names $name"
		[ $rc = 124 ] && why="timeout after ${TEST_TIMEOUT}s" || why="exit $rc"
		printf 'FAIL  %-40s %6ss  (%s)\n' "$name" "$secs" "$why"
		sed 's/^/      | /' "$logdir/$name.log" | tail -n 30
		tmp_made | sed 's/^/      kept: /' ;;
	esac
	[ $rc = 0 ] || [ $rc = 77 ] && tmp_made | xargs -r rm -rf
done
[ -n "$failed_names" ] && echo "failed:$failed_names"
echo "$pass passed, $fail failed, $skip skipped"
[ $fail = 0 ] && [ $((pass + skip)) -gt 0 ]
