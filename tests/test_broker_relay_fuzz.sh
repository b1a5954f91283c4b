#!/usr/bin/env bash
# Relays under a lying upstream: a short run of tests/tools/fuzz_consumer
# --relay 2 --bulk 1 with a fixed seed.  The fake broker of
# test_consumer_fuzz.sh is the upstream of a chain of two real relays
# (deltacast-broker --upstream, with --bulk), the second joining the
# first: messages and bulk frames dropped, repeated, reordered, forged and
# sealed again, runs switched, for 15 s.  A library consumer joins the
# second relay.  Each relay must stay up through the damage, exit 0 on
# SIGTERM and log no sanitizer report; in half the rounds the relays keep
# data dirs and one is restarted on its own half-way.  Every version the
# consumer applies must be that version bit for bit, and each round ends
# at the newest version through a fresh chain served cleanly.  Long runs:
# `make fuzz-consumer FUZZ_CONSUMER_RELAY=N`.
set -u
BUILD=${DELTACAST_BUILD:-$PWD/build}
export DELTACAST_BUILD=$BUILD
dir=$(mktemp -d /tmp/dcast-fuzz-relay.XXXXXX)
trap 'rm -rf "$dir"' EXIT
nice -n 5 "$BUILD/tools/fuzz_consumer" --seed 5 --seconds 15 --dir "$dir" --relay 2 --bulk 1
