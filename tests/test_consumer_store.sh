#!/usr/bin/env bash
# The consumer's rooms keep their walls (docs/architecture.md, "Inside the
# consumer"), read from the built objects (nm) and the sources:
#   - only consumer/intake.c changes a staged version's state (CS_V_*,
#     write_failed) or the staged list (n_staged, its slots made or freed),
#     and the store moves the applied version only through its sink;
#   - the store, consumer/store/, calls nothing of the consumer above it:
#     what it replays goes through the sink it is given, and the recovery
#     policy, the session, the intake and apply are the consumer's;
#   - the store writes none of the session's fields (c->ss), and no file
#     outside it reaches the store's (c->store->..., store/store_impl.h);
#   - a CHUNK, from the wire or a record, is checked whole by one call of
#     the schema (dcast_chunk_sound), not by its two halves;
#   - the store waits on and wakes its own conditions (its fold thread's),
#     never the consumer's (c->ev_cv, c->cv), and takes or lets go of the
#     consumer's locks only as handed to it (it names no c->lock, c->mu);
#   - the store's fields are touched only under its own mutex: a function
#     of consumer/store/ that reaches one takes it, asserts it is held, or
#     is static and called only by functions that do.
# Each breach is named with its file and the name or line that makes it.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
command -v nm >/dev/null || { echo "skip: no nm"; exit 77; }
[ -d consumer/store ] || { echo "test_consumer_store: FAIL: no consumer/store/"; exit 1; }
ls "$BUILD"/obj/consumer/store/*.o >/dev/null 2>&1 || { echo "skip: no objects under $BUILD/obj/consumer/store (run make)"; exit 77; }
fail=0

bad() {
	echo "test_consumer_store: FAIL: $*"
	fail=1
}

# A version's state is set in intake.c alone.
while IFS= read -r hit; do
	bad "a version's state set outside consumer/intake.c: $hit"
done < <(grep -rn 'state *= *CS_V_' consumer --include='*.c' | grep -v '^consumer/intake\.c:')
while IFS= read -r hit; do
	bad "the staged list or a version's write_failed changed outside consumer/intake.c: $hit"
done < <(grep -rnE 'n_staged *([-+]?=[^=]|\+\+|--)|write_failed *=[^=]|cs_version_(init|free)\(&c->staged' consumer \
	--include='*.c' | grep -v '^consumer/intake\.c:')

# The store's files use no global of these consumer files (the layers above it).
ABOVE="open api session intake apply outbox recover run staged"
TMP=$(mktemp -d /tmp/dcast-store.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
for f in $ABOVE; do
	[ -f "$BUILD/obj/consumer/$f.o" ] &&
		nm -P -g "$BUILD/obj/consumer/$f.o" | awk -v f="$f" '$2 ~ /^[TDBR]$/ { print $1, f }'
done | sort >"$TMP/above"
# Each store object's undefined globals, "SOURCE SYMBOL" a line.
store_uses() {
	for o in "$BUILD"/obj/consumer/store/*.o; do
		src=consumer/store/$(basename "$o" .o).c
		[ -f "$src" ] || continue
		nm -P -g "$o" | awk -v src="$src" '$2 == "U" { print src, $1 }'
	done
}
# Every line of file $2 is a failure, after the words $1.
bad_lines() {
	while IFS= read -r hit; do
		bad "$1$hit"
	done <"$2"
}
store_uses | sort -k2 | join -1 2 -2 1 - "$TMP/above" | while read -r u src f; do
	echo "$src uses $u of consumer/$f.c, above the store"
done >"$TMP/up"
bad_lines "" "$TMP/up"

# The session's fields are the session's; the store's are the store's.
while IFS= read -r hit; do
	bad "the store writes or reads the session's fields: $hit"
done < <(grep -n 'c->ss\.' consumer/store/*.c)
while IFS= read -r hit; do
	bad "the store's fields reached from outside it: $hit"
done < <(grep -n -e '->store->' -e 'store_impl\.h' consumer/*.c consumer/*.h)

# The applied version moves through the sink (intake.c), not by the store.
store_uses | awk '$2 == "cs_set_applied" { print $1 }' >"$TMP/applied"
bad_lines "sets the applied version itself (cs_set_applied), not through its sink: " "$TMP/applied"

# The store's conditions are its own.
while IFS= read -r hit; do
	bad "the store names a condition or a lock of the consumer: $hit"
done < <(grep -nE 'c->(ev_cv|cv|lock|mu)\b' consumer/store/*.c)

# The store's fields are guarded by its own mutex (store/store_impl.h): a
# function that reads or writes one (all but the paths, the sink and the
# atomics' reads) takes the mutex (cs_store_lock), asserts that its caller
# holds it (cs_store_held), or is static and called in its file only by
# functions that do either (followed to a fixed point).
python3 - consumer/store/*.c >"$TMP/unguarded" <<'PY'
import re, sys
fields = ("anchor_file_version|log_since_fold|deltas_since_fold|folds|folds_live|wb|log_write_bytes|"
          "log_write_ns|direct_write_bytes|new_offs|new_version|new_landed|fold_thread|fold_running|fold_joinable|fold_lock")
touch = re.compile(r"(store|[^a-z_]s)->((%s)([^a-z_]|$)|gen\+\+)" % fields)
for path in sys.argv[1:]:
    funcs, cur = {}, None
    for line in open(path):
        if cur is None and re.match(r"[a-z].*\(", line) and not line.rstrip().endswith(";"):
            name = re.search(r"([A-Za-z_]\w*)\(", line).group(1)
            cur = funcs[name] = {"static": line.startswith("static"), "body": ""}
        if cur is not None:
            cur["body"] += line
            if line.startswith("}"):
                cur = None
    ok = {n for n, f in funcs.items() if re.search(r"cs_store_(lock|held)\(", f["body"])}
    while True:
        more = set()
        for n, f in funcs.items():
            callers = [m for m, g in funcs.items() if m != n and re.search(r"\b%s\(" % n, g["body"])]
            if n not in ok and f["static"] and callers and all(m in ok for m in callers):
                more.add(n)
        if not more:
            break
        ok |= more
    for n, f in funcs.items():
        if n not in ok and touch.search(f["body"]):
            print("%s: %s touches the store's fields without its mutex" % (path, n))
PY
bad_lines "" "$TMP/unguarded"

# One schema call checks a chunk: sound (its checksum) and fitting.
for o in "$BUILD"/obj/consumer/*.o "$BUILD"/obj/consumer/store/*.o; do
	src=${o#"$BUILD/obj/"}
	[ -f "${src%.o}.c" ] || continue # a stale object of a removed source
	nm -P -g "$o" | awk -v o="$o" '$2 == "U" && ($1 == "dcast_chunk_fits" || $1 == "dcast_chunk_verify_sum") {
		print o " checks a chunk by halves (" $1 "), not with dcast_chunk_sound" }'
done >"$TMP/halves"
while IFS= read -r hit; do
	bad "$hit"
done <"$TMP/halves"

[ $fail = 0 ] || exit 1
echo "test_consumer_store: intake.c alone sets a version's state; the store keeps to its own room"
