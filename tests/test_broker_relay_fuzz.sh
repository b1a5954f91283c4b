#!/usr/bin/env bash
# Relay under a lying upstream: a short run of tests/tools/fuzz_consumer
# --relay 1 --bulk 1 with a fixed seed.  The fake broker of
# test_consumer_fuzz.sh is a real relay's upstream (deltacast-broker
# --upstream, with --bulk): messages and bulk frames dropped, repeated,
# reordered, forged and sealed again, runs switched, for 15 s.  A library
# consumer joins the relay.  Each relay must stay up through the damage,
# exit 0 on SIGTERM and log no sanitizer report; in half the rounds it keeps
# a data dir and is restarted on it half-way.  Every version the consumer
# applies must be that version bit for bit, and each round ends at the
# newest version through a fresh relay served cleanly.  Long runs:
# `make fuzz-consumer FUZZ_CONSUMER_RELAY=1`.
set -u
BUILD=${DELTACAST_BUILD:-$PWD/build}
export DELTACAST_BUILD=$BUILD
dir=$(mktemp -d /tmp/dcast-fuzz-relay.XXXXXX)
trap 'rm -rf "$dir"' EXIT
nice -n 5 "$BUILD/tools/fuzz_consumer" --seed 5 --seconds 15 --dir "$dir" --relay 1 --bulk 1
