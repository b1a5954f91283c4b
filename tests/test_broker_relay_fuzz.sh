#!/usr/bin/env bash
# Relays under a lying upstream: a short run of tests/tools/fuzz_consumer
# --relay 2 --bulk 1 with a fixed seed, for 10 s.  The fake broker of
# test_consumer_fuzz.sh is the upstream of a chain of two real relays
# (deltacast-broker --upstream, with --bulk), the second joining the
# first: messages and bulk frames dropped, repeated, reordered, forged and
# sealed again, runs switched.  A library consumer joins the
# second relay.  Each relay must stay up through the damage, exit 0 on
# SIGTERM and log no sanitizer report; in half the rounds the relays keep
# data dirs and one is restarted on its own half-way.  Then 8 s with the
# first relay a CURVE client of the liar (--curve 1).  Every version the
# consumer applies must be that version bit for bit, and each round ends
# at the newest version through a fresh chain served cleanly.  Long runs:
# `make fuzz-consumer FUZZ_CONSUMER_RELAY=N`.
set -u
BUILD=${DELTACAST_BUILD:-$PWD/build}
export DELTACAST_BUILD=$BUILD
dir=$(mktemp -d /tmp/dcast-fuzz-relay.XXXXXX)
trap 'rm -rf "$dir"' EXIT
nice -n 5 "$BUILD/tools/fuzz_consumer" --seed 5 --seconds 10 --dir "$dir" --relay 2 --bulk 1 || exit 1
# The first relay a CURVE client of the lying broker, with a wrong server
# key in a fifth of the rounds: it must pass nothing on and stay up.
nice -n 5 "$BUILD/tools/fuzz_consumer" --seed 50 --seconds 8 --dir "$dir" --relay 2 --curve 1
