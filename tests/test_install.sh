#!/usr/bin/env bash
# `make install PREFIX=<temp>`: the Python package imports with no
# environment variables (PYTHONPATH aside, since a temporary prefix is not
# on sys.path) and loads the installed library by its recorded path; the
# library carries the SONAME libdeltacast.so.0 with its links; a C program
# built with `pkg-config --cflags --libs deltacast` runs with no
# LD_LIBRARY_PATH; nm -D shows only dcast_ functions.  Skips (77) under SAN=1, whose library needs the
# sanitizer runtime preloaded, and without pkg-config or a C compiler.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
fail() { echo "test_install: FAIL: $*"; exit 1; }
case "$BUILD" in *san*) echo "skip: the sanitizer build's library needs its runtime preloaded"; exit 77 ;; esac
command -v pkg-config >/dev/null || { echo "skip: no pkg-config"; exit 77; }
command -v cc >/dev/null || { echo "skip: no cc"; exit 77; }
TMP=$(mktemp -d /tmp/dcast-install.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
P="$TMP/prefix"

env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s install PREFIX="$P" BUILD="$BUILD" PYTHON="$PYTHON" \
	>"$TMP/install.log" 2>&1 || { cat "$TMP/install.log"; fail "make install exited $?"; }

# The library: versioned file, SONAME link, dev link, SONAME in the file.
VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' python/deltacast/_version.py)
[ -f "$P/lib/libdeltacast.so.$VERSION" ] || fail "no $P/lib/libdeltacast.so.$VERSION"
[ "$(readlink "$P/lib/libdeltacast.so.0")" = "libdeltacast.so.$VERSION" ] || fail "libdeltacast.so.0 link"
[ "$(readlink "$P/lib/libdeltacast.so")" = "libdeltacast.so.0" ] || fail "libdeltacast.so link"
readelf -d "$P/lib/libdeltacast.so.$VERSION" | grep -q 'SONAME.*\[libdeltacast.so.0\]' ||
	fail "SONAME is not libdeltacast.so.0: $(readelf -d "$P/lib/libdeltacast.so.$VERSION" | grep SONAME)"

# The installed library exports what the built one does (test_seal: the public API only).
cmp -s <(nm -D --defined-only "$P/lib/libdeltacast.so.0" | awk '{print $3}' | sort) \
	<(nm -D --defined-only "$BUILD/libdeltacast.so" | awk '{print $3}' | sort) ||
	fail "nm -D of the installed library differs from the build's"
nm -D --defined-only "$P/lib/libdeltacast.so.0" | awk '{print $3}' | grep -v '^dcast_' | head -n 3 |
	grep -q . && fail "the installed library exports non-dcast_ symbols"

# Python: a clean environment, the installed package, the installed library.
SITE=$("$PYTHON" scripts/pysite.py "$P")
[ -f "$SITE/deltacast/py.typed" ] || fail "no py.typed in $SITE/deltacast"
out=$(cd "$TMP" && env -i PATH=/usr/bin:/bin PYTHONPATH="$SITE" "$PYTHON" -c '
import deltacast, os
print(deltacast.__version__)
print(os.path.realpath(deltacast.library_path()))
print(os.path.dirname(deltacast.__file__))
try:
    deltacast.Consumer("tcp://127.0.0.1:1", "m", None)
except deltacast.DeltacastError as e:
    print(e.name)
' 2>&1) || fail "import deltacast from $SITE: $out"
[ "$(sed -n 1p <<<"$out")" = "$VERSION" ] || fail "__version__: $out"
[ "$(sed -n 2p <<<"$out")" = "$(realpath "$P/lib/libdeltacast.so.$VERSION")" ] ||
	fail "library not loaded from the install: $out"
[ "$(sed -n 3p <<<"$out")" = "$SITE/deltacast" ] || fail "package not the installed one: $out"
[ "$(sed -n 4p <<<"$out")" = "DCAST_EINVAL" ] || fail "Consumer(dir=None): $out"

# C: an external program built from pkg-config alone, run with no LD_LIBRARY_PATH.
export PKG_CONFIG_PATH="$P/lib/pkgconfig"
[ "$(pkg-config --modversion deltacast)" = "$VERSION" ] || fail "deltacast.pc version"
cat >"$TMP/ext.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <deltacast/consumer.h>
#include <deltacast/log.h>
#include <deltacast/producer.h>
static int lines;
static void on_log(int level, const char *msg, void *arg) { (void)level; (void)msg; (void)arg; lines++; }
int main(void)
{
	dcast_producer *p = NULL;
	dcast_log_set_handler(on_log, NULL);
	dcast_producer_opts o;
	dcast_producer_opts_init(&o);
	o.connect_timeout_ms = 100;
	int rc = dcast_producer_open("tcp://127.0.0.1:1", "m", 0, 1, &o, &p);
	printf("%s %s\n", dcast_errname(rc), strstr(dcast_last_error(), "127.0.0.1:1") ? "named" : "?");
	return rc == DCAST_ECLOSED && p == NULL ? 0 : 1;
}
C
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror -o "$TMP/ext" "$TMP/ext.c" $(pkg-config --cflags --libs deltacast) \
	>"$TMP/cc.log" 2>&1 || { cat "$TMP/cc.log"; fail "building against the installed library"; }
readelf -d "$TMP/ext" | grep -q 'NEEDED.*\[libdeltacast.so.0\]' || fail "ext does not need libdeltacast.so.0"
out=$(env -i PATH=/usr/bin:/bin "$TMP/ext" 2>&1) || fail "ext: $out"
[ "$out" = "DCAST_ECLOSED named" ] || fail "ext printed: $out"
echo "test_install: ok (prefix $P, python $SITE)"
