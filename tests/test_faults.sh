#!/usr/bin/env bash
# The short run of the fault-injection suite (scripts/faults.sh, every
# kind, proxy included, its swaps of messages too, 5 drawn seeds; the long
# run is `SEEDS=N make test-faults`, docs/reliability.md).  FAULT_KINDS,
# SEEDS and FAULT_REORDER override.
set -u
exec env SEEDS="${SEEDS:-5}" FAULT_REORDER="${FAULT_REORDER:-1}" bash "$(dirname "$0")/../scripts/faults.sh"
