#!/usr/bin/env bash
# test_consumer_direct again on the plain pread/pwrite path
# (DELTACAST_IO_URING=0): the O_DIRECT fd beside the buffered one serves
# pwrite as it serves io_uring.
set -eu
exec env DELTACAST_IO_URING=0 "$DELTACAST_BUILD/tests/test_consumer_direct"
