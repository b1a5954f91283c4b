#!/usr/bin/env bash
# Consumer over bulk: a short run of tests/tools/fuzz_consumer --bulk 1 with
# a fixed seed: the lying broker of test_consumer_fuzz.sh also sends each
# anchor it serves first to a consumer as BULK (its counts now and then
# wrong) and then over the consumer's bulk connection, frames dropped,
# repeated, forged and sealed again, a byte flipped anywhere in a frame, a
# HEARTBEAT frame dropped in, or the connection cut inside a frame, for
# 12 s.  Every version applied must be that version bit for bit, and every
# round must end at the newest version when served cleanly.  Long runs:
# `make fuzz-consumer FUZZ_CONSUMER_BULK=1`.
set -u
BUILD=${DELTACAST_BUILD:-$PWD/build}
dir=$(mktemp -d /tmp/dcast-fuzz-consumer-bulk.XXXXXX)
trap 'rm -rf "$dir"' EXIT
nice -n 5 "$BUILD/tools/fuzz_consumer" --seed 28 --seconds 12 --dir "$dir" --bulk 1
