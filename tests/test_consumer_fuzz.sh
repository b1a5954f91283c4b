#!/usr/bin/env bash
# Consumer: a short run of tests/tools/fuzz_consumer with a fixed seed: a
# real consumer served for 20 s by a broker that lies (damaged, dropped,
# repeated, reordered messages, forged CHUNK and COMMIT fields, flipped
# payload and header bits, stray WELCOMEs, MANIFESTs and ERRORs).  Every
# version the consumer applies must be that version bit for bit, and after
# each round, opened again on its directory and served cleanly, it must
# reach the newest version.  Long runs: `make fuzz-consumer`.
set -u
BUILD=${DELTACAST_BUILD:-$PWD/build}
dir=$(mktemp -d /tmp/dcast-fuzz-consumer.XXXXXX)
trap 'rm -rf "$dir"' EXIT
nice -n 5 "$BUILD/tools/fuzz_consumer" --seed 27 --seconds 20 --dir "$dir"
