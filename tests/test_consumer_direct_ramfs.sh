#!/usr/bin/env bash
# test_consumer_direct in a folder on a ramfs mount made here: ramfs
# refuses O_DIRECT at the open (EINVAL), so each anchor says so in one
# info line naming the folder and is written through the page cache,
# bit-exact, with the direct byte counter at 0.  Needs root to mount (77
# otherwise).
set -u
MNT=$(mktemp -d /tmp/dcast-ramfs.XXXXXX)
LOG=$(mktemp /tmp/dcast-ramfs-log.XXXXXX)
trap 'umount "$MNT" 2>/dev/null; rmdir "$MNT"; rm -f "$LOG"' EXIT
if ! mount -t ramfs ramfs "$MNT" 2>"$LOG"; then
	echo "skip: mount -t ramfs refused: $(cat "$LOG")"
	exit 77
fi
DCAST_TEST_ROOT=$MNT DELTACAST_LOG=info "$DELTACAST_BUILD/tests/test_consumer_direct" 2>"$LOG"
rc=$?
cat "$LOG" >&2
[ $rc = 0 ] || exit $rc
grep -q "O_DIRECT not expected" "$LOG" || { echo "test_consumer_direct_ramfs: FAIL: ramfs took O_DIRECT"; exit 1; }
n=$(grep -c "O_DIRECT refused in $MNT/dcast-direct-[A-Za-z0-9]*/m_[a-z]* (open: Invalid argument)" "$LOG")
[ "$n" = 4 ] || { echo "test_consumer_direct_ramfs: FAIL: $n refusal lines, not one per anchor (4)"; exit 1; }
echo "test_consumer_direct_ramfs: O_DIRECT refused at the open, said once per anchor, written buffered"
