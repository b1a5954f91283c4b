#!/usr/bin/env bash
# Broker: a short run of tests/tools/fuzz_broker with a
# fixed seed: mutated producer and consumer conversations against a real
# broker for 25 s; after every batch the broker is alive, its VmRSS is
# under 512 MiB, and a normal producer's newest version reaches a fresh
# normal consumer bit-exact.  Long runs: `make fuzz-broker`.
set -u
BUILD=${DELTACAST_BUILD:-$PWD/build}
rss_max=512
case "$BUILD" in *-san*) rss_max=2048 ;; esac # ASan's shadow and quarantine
exec nice -n 5 "$BUILD/tools/fuzz_broker" --seed 18019 --seconds 25 --rss-max-mib "$rss_max"
