#!/usr/bin/env bash
# test_consumer_direct in a folder on a tmpfs mount made here: where the
# kernel refuses O_DIRECT there (before Linux 6.6) the consumer says so in
# one info line and writes through the page cache, counter 0; where it
# takes it, the direct path runs there.  The test probes which and expects
# that.  Needs root to mount (77 otherwise).
set -u
MNT=$(mktemp -d /tmp/dcast-tmpfs.XXXXXX)
trap 'umount "$MNT" 2>/dev/null; rmdir "$MNT"' EXIT
if ! mount -t tmpfs -o size=64m tmpfs "$MNT" 2>"$MNT.err"; then
	echo "skip: mount -t tmpfs refused: $(cat "$MNT.err")"
	rm -f "$MNT.err"
	exit 77
fi
rm -f "$MNT.err"
DCAST_TEST_ROOT=$MNT "$DELTACAST_BUILD/tests/test_consumer_direct"
