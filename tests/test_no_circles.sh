#!/usr/bin/env bash
# No import circles among the library's files (common, schema, kernels,
# producer, consumer), within a folder or across folders.  A imports B when
# A's object file uses a global symbol that B's object defines (nm), or when
# A includes a header that carries code (a function body: a brace at the
# start of a line) and is named after B: B.h, B_impl.h or B_internal.h, the
# way `farm-studio look` reads a header as part of its namesake .c.  A
# header of declarations only draws no arrow: what A calls through it shows
# in nm.  Each circle is named with its files and the names that tie them.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DIRS="common schema kernels producer consumer"
command -v nm >/dev/null || { echo "skip: no nm"; exit 77; }
TMP=$(mktemp -d /tmp/dcast-circles.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# The library's sources that have an object (a stale object of a removed
# source is passed over).
for d in $DIRS; do
	for o in "$BUILD/obj/$d"/*.o; do
		src=${o#"$BUILD/obj/"}
		src=${src%.o}
		case $src in *.cu) ;; *) src=$src.c ;; esac
		[ -f "$src" ] && echo "$src $o"
	done
done >"$TMP/units"
[ -s "$TMP/units" ] || { echo "skip: no objects under $BUILD/obj (run make)"; exit 77; }

# "D file symbol" for each global definition, "U file symbol" for each use.
while read -r src o; do
	nm -P -g "$o" | awk -v f="$src" '
		$2 == "U" { print "U", f, $1 }
		$2 ~ /^[TDBRCGS]$/ { print "D", f, $1 }'
done <"$TMP/units" >"$TMP/syms"

# "H file owner header" for each quoted include of a code-carrying header
# named after another library source.
while read -r src o; do
	for h in $(sed -n 's/^#include "\(.*\)"/\1/p' "$src"); do
		path=""
		for d in "$(dirname "$src")" include $DIRS; do
			[ -f "$d/$h" ] && { path=$d/$h; break; }
		done
		[ -n "$path" ] && grep -q '^{' "$path" || continue
		stem=$(basename "$h" .h)
		stem=${stem%_impl}
		stem=${stem%_internal}
		owner=$(awk -v s="$stem" '{ n = $1; sub(/.*\//, "", n) } n == s ".c" { print $1 }' "$TMP/units")
		for b in $owner; do [ "$b" != "$src" ] && echo "H $src $b $h"; done
	done
done <"$TMP/units" >"$TMP/heads"

# Arrows, then the circles: files that reach each other.
cat "$TMP/syms" "$TMP/heads" | awk '
function arrow(a, b, name) {
	if (a == b)
		return
	if (!((a, b) in tie)) {
		tie[a, b] = name
		out[a] = out[a] " " b
	} else if (index(" " tie[a, b] " ", " " name " ") == 0)
		tie[a, b] = tie[a, b] " " name
}
function node(f) { if (!(f in seen)) { seen[f] = 1; nodes[++n] = f } }
$1 == "D" { node($2); def[$3] = def[$3] " " $2 }
$1 == "U" { node($2); uses[++nu] = $2 " " $3 }
$1 == "H" { node($2); node($3); arrow($2, $3, $4) }
END {
	for (i = 1; i <= nu; i++) {
		split(uses[i], u, " ")
		k = split(def[u[2]], d, " ")
		for (j = 1; j <= k; j++)
			arrow(u[1], d[j], u[2])
	}
	for (i = 1; i <= n; i++) { # reach[s, t]: a path of arrows from s to t
		s = nodes[i]; top = 0; stack[++top] = s
		while (top) {
			a = stack[top--]; m = split(out[a], o, " ")
			for (j = 1; j <= m; j++)
				if (!((s, o[j]) in reach)) { reach[s, o[j]] = 1; stack[++top] = o[j] }
		}
	}
	for (i = 1; i <= n; i++) {
		s = nodes[i]
		if ((s in comp) || !((s, s) in reach))
			continue
		circles++; list = ""
		for (j = 1; j <= n; j++)
			if ((s, nodes[j]) in reach && (nodes[j], s) in reach) {
				comp[nodes[j]] = circles; list = list " " nodes[j]
			}
		print "circle " circles ":" list
		m = split(list, c, " ")
		for (j = 1; j <= m; j++)
			for (k = 1; k <= m; k++)
				if ((c[j], c[k]) in tie)
					print "  " c[j] " -> " c[k] ": " tie[c[j], c[k]]
	}
	exit circles > 0
}' >"$TMP/circles"
rc=$?
if [ $rc != 0 ]; then
	echo "test_no_circles: FAIL: import circles among the library's files:"
	cat "$TMP/circles"
	exit 1
fi
echo "test_no_circles: no import circle among $(wc -l <"$TMP/units") files"
