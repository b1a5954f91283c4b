#!/usr/bin/env bash
# Broker with --bulk and --metrics: a short run of tests/tools/fuzz_broker
# --bulk 1 --metrics 1 with a fixed seed: the mutated conversations of
# test_broker_fuzz.sh, half the fuzzed consumers asking for bulk anchors,
# and raw connections to the bulk port, the broker's unix socket and the
# metrics port that stay silent, send junk, cut the opening or request
# short, or open a transfer (a token offered or not) and read part of it,
# all of it or none, for 15 s; after every batch the broker is alive, its
# VmRSS is under 512 MiB, a normal consumer is bit-exact, a fresh receiver
# takes the anchor over bulk, whole, and GET /metrics is answered.  Long
# runs: `make fuzz-broker FUZZ_BROKER_BULK=1 FUZZ_BROKER_METRICS=1`.
set -u
BUILD=${DELTACAST_BUILD:-$PWD/build}
rss_max=512
case "$BUILD" in *-san*) rss_max=2048 ;; esac # ASan's shadow and quarantine
exec nice -n 5 "$BUILD/tools/fuzz_broker" --seed 30112 --seconds 15 --rss-max-mib "$rss_max" --bulk 1 --metrics 1
