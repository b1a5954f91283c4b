#!/usr/bin/env bash
# The shell scripts define each function once: bash keeps the last of two
# definitions of a name, silently, so a second helper of the same name
# changes the first one's callers.  Each script is checked together with
# the files it sources (". DIR/NAME.sh", resolved by name in tests/tools/
# and scripts/); every name defined twice is listed with its files.  A
# library's hook, a default whose comment line above says "override in the
# sourcing script", is not counted.
set -u
shopt -s nullglob
cd "$(dirname "$0")/.." || exit 1

# defs FILE: "NAME FILE" for each function FILE defines, hooks aside.
defs() {
	awk -v f="$1" '/^[A-Za-z_][A-Za-z_0-9]*\(\) *\{/ && prev !~ /override in the sourcing script/ {
		sub(/\(.*/, ""); print $0, f } { prev = $0 }' "$1"
}

# sourced FILE: the tree's files FILE sources.
sourced() {
	local n
	for n in $(sed -n 's/^[[:space:]]*\(\.\|source\) .*\/\([A-Za-z_0-9]*\.sh\)"\?$/\2/p' "$1"); do
		for d in tests/tools scripts; do [ -f "$d/$n" ] && echo "$d/$n"; done
	done
}

fail=0 n=0
for f in scripts/*.sh tests/*.sh tests/tools/*.sh; do
	n=$((n + 1))
	dup=$({ defs "$f"; for s in $(sourced "$f"); do defs "$s"; done; } |
		awk '{ c[$1]++; w[$1] = w[$1] " " $2 } END { for (k in c) if (c[k] > 1) print k ":" w[k] }')
	[ -z "$dup" ] && continue
	echo "FAIL $f: functions defined twice: $dup"
	fail=1
done
[ $fail = 0 ] && echo "ok: $n scripts, each function defined once"
exit $fail
