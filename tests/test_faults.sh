#!/usr/bin/env bash
# The short run of the fault-injection suite (scripts/faults.sh, every
# kind, proxy included, 5 drawn seeds; the long run is `SEEDS=N make
# test-faults`, docs/reliability.md).  FAULT_KINDS and SEEDS override.
set -u
exec env SEEDS="${SEEDS:-5}" bash "$(dirname "$0")/../scripts/faults.sh"
