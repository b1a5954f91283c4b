#!/usr/bin/env bash
# The house's structure as its docs and comments state it, checked against
# the code.  A file imports another (an arrow A -> B) when
#  - A's object uses a global symbol that B's object defines (nm; a name
#    that A's own folder defines is taken from there, as the linker takes
#    a program's own objects before the library's);
#  - A includes (quoted) a header of the tree (A -> the header), and, when
#    that header carries code (a brace at the start of a line) and is named
#    after B: B.h, B_impl.h or B_internal.h, A -> B as well: such a header
#    is part of its namesake .c.
# Public headers (include/) draw no arrow: what a file calls through them
# shows in nm.  The rules, each failure named with its files and names:
#  1. no circle of files;
#  2. the layers of docs/architecture.md (its ```layers block, top first,
#     one layer a line; an entry is a folder, or a file that stands apart
#     from its folder): no arrow up to a higher layer, nor between two
#     entries of one layer;
#  3. the floors of a folder, top first, as its private header's comment
#     lists them after "One way down ... from the top:" (a floor ending at
#     each ";"), or as the doc's table under "## Inside the FOLDER: one way
#     down" does (a row a floor): every file of the folder is on a floor,
#     and none calls a file on a floor above its own.
set -u
shopt -s nullglob
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build}
DOC=docs/architecture.md
DIRS="common schema kernels producer consumer consumer/store broker cli"
command -v nm >/dev/null || { echo "skip: no nm"; exit 77; }
TMP=$(mktemp -d /tmp/dcast-layers.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# The sources that have an object (a stale object of a removed source is
# passed over).
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
nm -A -P -g $(awk '{ print $2 }' "$TMP/units") | awk '
	FILENAME != "-" { src[$2 ":"] = $1; next }
	$3 == "U" { print "U", src[$1], $2 }
	$3 ~ /^[TDBRCGS]$/ { print "D", src[$1], $2 }' "$TMP/units" - >"$TMP/syms"

# "A file header header" for each quoted include of a header of the tree
# (searched as the compiler does: beside the file, then include/ and the
# folders), "A file owner header" for a code-carrying one named after a
# source.
for d in $DIRS include/deltacast; do
	for h in "$d"/*.h; do echo "H $h"; done
	grep -l '^{' /dev/null "$d"/*.h | sed 's/^/C /'
done >"$TMP/hdrs"
for d in $DIRS; do echo "$d"/*.[ch] "$d"/*.cu; done | tr ' ' '\n' | grep . >"$TMP/files"
awk -v dirs="include $DIRS" '
FILENAME == ARGV[1] { if ($1 == "H") hdr[$2] = 1; else code[$2] = 1; next }
FILENAME == ARGV[2] { n = $1; sub(/.*\//, "", n); unit[n] = unit[n] " " $1; next }
FNR == 1 { here = FILENAME; sub(/\/[^\/]*$/, "", here); nd = split(here " " dirs, d, " ") }
/^#include "/ {
	split($0, q, "\""); h = q[2]; path = ""
	for (i = 1; i <= nd && path == ""; i++)
		if ((d[i] "/" h) in hdr)
			path = d[i] "/" h
	if (path == "" || path ~ /^include\//)
		next
	print "A", FILENAME, path, h
	if (FILENAME ~ /\.h$/ || !(path in code))
		next
	stem = h; sub(/.*\//, "", stem); sub(/\.h$/, "", stem); sub(/_(impl|internal)$/, "", stem)
	m = split(unit[stem ".c"], o, " ")
	for (i = 1; i <= m; i++)
		if (o[i] != FILENAME)
			print "A", FILENAME, o[i], h
}' "$TMP/hdrs" "$TMP/units" $(cat "$TMP/files") >"$TMP/heads"

# "L index entry" from the doc's layers block, top first.
awk '/^```layers/ { on = 1; next } on && /^```/ { exit }
	on && NF && $1 !~ /^#/ { n++; for (i = 1; i <= NF; i++) print "L", n, $i }' "$DOC" >"$TMP/layers"
[ -s "$TMP/layers" ] || { echo "test_layers: FAIL: no \`\`\`layers block in $DOC"; exit 1; }

# "F index file" (floors top first) from each "One way down ... from the top:" claim.
for h in $(for d in $DIRS; do grep -l 'One way down' "$d"/*.h; done); do
	awk '/\*\// { exit } on { printf "%s ", $0 } /from the top:/ { on = 1 }' "$h" |
		sed 's/([^)]*)//g; s/\*//g' | tr ';' '\n' |
		awk -v d="$(dirname "$h")" '{
			n++
			for (i = 1; i <= NF; i++)
				if ($i ~ /^[a-z0-9_\/]+\.c[,.]?$/) { sub(/[,.]$/, "", $i); print "F", n, d "/" $i }
		}'
done >"$TMP/floors"
# ... and from each table under a "## Inside the FOLDER: one way down"
# heading of the doc: a row a floor, its files in backquotes, top first.
awk '/^## / { d = "" } /^## Inside the [a-z]+: one way down/ { d = $4; sub(/:$/, "", d); n = 0 }
	d != "" && /^\| / && split($0, c, "|") > 3 && c[3] ~ /`[a-z0-9_]+\.c`/ {
		n++; s = c[3]
		while (match(s, /`[a-z0-9_]+\.c`/)) {
			print "F", n, d "/" substr(s, RSTART + 1, RLENGTH - 2)
			s = substr(s, RSTART + RLENGTH)
		}
	}' "$DOC" >>"$TMP/floors"

cat "$TMP/layers" "$TMP/floors" "$TMP/syms" "$TMP/heads" | awk '
function dir(f) { sub(/\/.*/, "", f); return f }
function arrow(a, b, name) {
	if (a == b)
		return
	if (!((a, b) in tie)) {
		tie[a, b] = name
		out[a] = out[a] " " b
		arrows[++na] = a SUBSEP b
	} else if (index(" " tie[a, b] " ", " " name " ") == 0)
		tie[a, b] = tie[a, b] " " name
}
function node(f) { if (!(f in seen)) { seen[f] = 1; nodes[++n] = f; dirs[dir(f)] = 1 } }
function entry(f) { return (f in layer) ? f : dir(f) }
# The shortest loop of arrows from s back to s within circle k: its length
# L, the files along it in path[0] = s, path[1], ... path[L] = s.
function loop(s, k,    h, t, x, y, m, j, o) {
	delete dist; delete par; delete q
	h = 1; t = 1; q[1] = s; dist[s] = 0
	while (h <= t) {
		x = q[h++]; m = split(out[x], o, " ")
		for (j = 1; j <= m; j++) {
			y = o[j]
			if (comp[y] != k)
				continue
			if (y == s) {
				m = dist[x] + 1; path[m] = s
				for (j = m - 1; j >= 0; j--) { path[j] = x; x = par[x] }
				return m
			}
			if (!(y in dist)) { dist[y] = dist[x] + 1; par[y] = x; q[++t] = y }
		}
	}
	return 0
}
$1 == "L" { layer[$3] = $2 }
$1 == "F" { floor[$3] = $2; floored[dir($3)] = 1 }
$1 == "D" { node($2); def[$3] = def[$3] " " $2; defdir[$3, dir($2)] = 1 }
$1 == "U" { node($2); uses[++nu] = $2 " " $3 }
$1 == "A" { node($2); node($3); arrow($2, $3, $4) }
END {
	for (i = 1; i <= nu; i++) {
		split(uses[i], u, " ")
		k = split(def[u[2]], d, " ")
		for (j = 1; j <= k; j++)
			if (!((u[2], dir(u[1])) in defdir) || dir(d[j]) == dir(u[1]))
				arrow(u[1], d[j], u[2])
	}
	for (e in layer)
		if (!(e in seen) && !(e in dirs)) { print "layers: " e " names no file"; bad++ }
	for (f in floor)
		if (!(f in seen)) { print "floors: " f " names no file"; bad++ }
	for (i = 1; i <= n; i++) {
		f = nodes[i]
		if (!(entry(f) in layer)) {
			if (!((entry(f), "layer") in said)) print "layers: " entry(f) " is in no layer"
			said[entry(f), "layer"] = 1; bad++
		}
		if ((dir(f) in floored) && f ~ /\.c$/ && !(f in floor)) {
			print "floors: " f " is missing from the floors of " dir(f); bad++
		}
	}
	for (i = 1; i <= na; i++) {
		split(arrows[i], ab, SUBSEP); a = ab[1]; b = ab[2]
		ea = entry(a); eb = entry(b)
		if ((ea in layer) && (eb in layer) && ea != eb && layer[ea] >= layer[eb]) {
			why = layer[ea] > layer[eb] ? "up a layer" : "within a layer"
			print "layers: " a " -> " b " (" why ", " ea " -> " eb "): " tie[a, b]
			bad++
		}
		if ((a in floor) && (b in floor) && floor[a] > floor[b]) {
			print "floors: " a " -> " b " (floor " floor[a] " calls floor " floor[b] \
			    " from the top): " tie[a, b]
			bad++
		}
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
		circles++; bad++; list = ""
		for (j = 1; j <= n; j++)
			if ((s, nodes[j]) in reach && (nodes[j], s) in reach) {
				comp[nodes[j]] = circles; list = list " " nodes[j]
			}
		m = split(list, c, " ")
		print "circle " circles " of " m " files:" list "; its shortest loop:"
		best = ""
		for (j = 1; j <= m; j++)
			if ((len = loop(c[j], circles)) && (best == "" || len < blen)) {
				best = c[j]; blen = len
			}
		loop(best, circles)
		for (j = 1; j <= blen; j++)
			print "  " path[j - 1] " -> " path[j] ": " tie[path[j - 1], path[j]]
	}
	print n, na >"/dev/stderr"
	exit bad > 0
}' >"$TMP/bad" 2>"$TMP/count"
rc=$?
if [ $rc != 0 ]; then
	echo "test_layers: FAIL: against the layers of $DOC, the floors of the private headers, or a circle:"
	cat "$TMP/bad"
	exit 1
fi
read -r files arrows <"$TMP/count"
echo "test_layers: $files files, $arrows arrows: no circle, layers ($DOC) and floors hold"
