#!/usr/bin/env bash
# Producer: a short run of tests/tools/fuzz_producer with a fixed seed: a
# real producer publishing through a proxy that lies to it about what a
# real broker says (ACKs, CREDIT, WELCOMEs, ERRORs and HEARTBEATs dropped,
# repeated, changed, bit-flipped, or made up: an ACK before the COMMIT, of
# a version never published, a credit of 0 or 2^64 - 1).  Every error must
# name its cause; once the proxy is honest the same producer must have a
# version taken, and a fresh consumer must reach it bit-exact.  Long runs:
# `make fuzz-producer`.
set -u
BUILD=${DELTACAST_BUILD:-$PWD/build}
dir=$(mktemp -d /tmp/dcast-fuzz-producer.XXXXXX)
trap 'rm -rf "$dir"' EXIT
DELTACAST_BUILD=$BUILD nice -n 5 "$BUILD/tools/fuzz_producer" --seed 11 --seconds 15 --dir "$dir"
