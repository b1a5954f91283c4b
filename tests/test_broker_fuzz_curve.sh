#!/usr/bin/env bash
# Broker with CURVE: a short run of tests/tools/fuzz_broker --curve 1
# --metrics 1 with a fixed seed.  The broker has --curve-secret and key
# lists (a producer key for any model, one for fz0 only, a consumer key);
# the mutated conversations of test_broker_fuzz.sh each draw a key (mostly
# a listed one; the fz0-only key, the other role's, an unlisted one, or the
# wrong server key), and raw connections to both ZeroMQ ports stay silent,
# send junk, a greeting cut short, one with another mechanism, or a CURVE
# greeting and a HELLO command of any size and bytes, for 15 s.  After
# every batch the broker is alive, its VmRSS is under 512 MiB, a normal
# producer and consumer with the listed keys are bit-exact, and GET
# /metrics is answered.  Long runs: `make fuzz-broker FUZZ_BROKER_CURVE=1`.
set -u
BUILD=${DELTACAST_BUILD:-$PWD/build}
rss_max=512
case "$BUILD" in *-san*) rss_max=2048 ;; esac # ASan's shadow and quarantine
exec nice -n 5 "$BUILD/tools/fuzz_broker" --seed 30113 --seconds 15 --rss-max-mib "$rss_max" --curve 1 --metrics 1
