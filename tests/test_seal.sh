#!/usr/bin/env bash
# The sealed library: libdeltacast.so exports exactly the functions the
# public headers declare DCAST_API (nm -D: no internal dcast_* helper, no
# CUDA runtime or C++ template symbol), every public declaration carries
# DCAST_API, and the CLI includes only public headers and calls only
# exported functions (it links the static library, so this is what keeps
# it buildable against an installed libdeltacast).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
fail() { echo "test_seal: FAIL: $*"; exit 1; }
command -v nm >/dev/null || { echo "skip: no nm"; exit 77; }
TMP=$(mktemp -d /tmp/dcast-seal.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# Declarations of public functions: a line at column 0 naming dcast_x( .
grep -hE '^[A-Za-z_][A-Za-z0-9_ ]*[ *]+\**dcast_[a-z0-9_]+\(' include/deltacast/*.h >"$TMP/decls"
unmarked=$(grep -v '^DCAST_API ' "$TMP/decls")
[ -z "$unmarked" ] || fail "public declarations without DCAST_API:
$unmarked"
grep -oE 'dcast_[a-z0-9_]+\(' "$TMP/decls" | tr -d '(' | sort -u >"$TMP/public"
[ "$(wc -l <"$TMP/public")" -gt 50 ] || fail "found only $(wc -l <"$TMP/public") public functions"

nm -D --defined-only "$BUILD/libdeltacast.so" | awk '{print $3}' | sort -u >"$TMP/exported"
extra=$(comm -13 "$TMP/public" "$TMP/exported")
[ -z "$extra" ] || fail "exported but not public API ($(wc -l <<<"$extra")):
$(head -n 20 <<<"$extra")"
missing=$(comm -23 "$TMP/public" "$TMP/exported")
[ -z "$missing" ] || fail "public API not exported:
$missing"

private=$(grep -lE '#include "(dcast_common|dcast_io|dcast_curve|[a-z_]+_impl)\.h"' cli/*.c cli/*.h)
[ -z "$private" ] || fail "the CLI includes private headers: $private"
nm -u "$BUILD"/obj/cli/*.o | awk '$2 ~ /^dcast_/ {print $2}' | sort -u >"$TMP/cli_uses"
internal=$(comm -23 "$TMP/cli_uses" "$TMP/exported")
[ -z "$internal" ] || fail "the CLI calls internal functions: $internal"
echo "test_seal: ok ($(wc -l <"$TMP/exported") functions exported, all public)"
