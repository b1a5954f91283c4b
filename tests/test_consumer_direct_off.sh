#!/usr/bin/env bash
# test_consumer_direct with DELTACAST_DIRECT_IO=0: every range of the
# anchor goes through the page cache, bit-exact, and the direct byte
# counter stays 0.
set -eu
exec env DELTACAST_DIRECT_IO=0 "$DELTACAST_BUILD/tests/test_consumer_direct"
