#!/usr/bin/env bash
# The consumer end-to-end test again on the plain pread/pwrite path:
# DELTACAST_IO_URING=0 makes the I/O engine refuse io_uring, as a seccomp
# profile or io_uring_disabled would.
set -eu
exec env DELTACAST_IO_URING=0 "$DELTACAST_BUILD/tests/test_consumer"
