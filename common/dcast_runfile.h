/* Private: the file that keeps a run identity (docs/protocol.md,
 * WELCOME.run) on disk, for the broker (DATA_DIR/runs/<model>) and the
 * consumer (DIR/run).  One line, "deltacast-run <16 hex> <8 hex>\n", the
 * second field the XXH32 of the first: a flipped bit or a torn write is
 * found instead of read as another run.  Written to PATH.tmp, fsynced and
 * renamed over PATH, so a reader sees the old file or the new one. */
#ifndef DCAST_RUNFILE_H
#define DCAST_RUNFILE_H

#include <stdint.h>

/* Keep `run` (non-zero) in `path`.  Errors: DCAST_EINVAL (run 0),
 * DCAST_EIO (create, write, fsync or rename failed; detail names the file
 * and strerror).  On an error `path` still holds what it held. */
int dcast_runfile_save(const char *path, uint64_t run);

/* Read the run kept in `path` into *run (0 on any error).  Errors:
 * DCAST_ENOTFOUND (no such file), DCAST_EIO (unreadable), DCAST_ECORRUPT
 * (not one well-formed line, or its check does not match; the detail
 * names the file and what is wrong). */
int dcast_runfile_load(const char *path, uint64_t *run);

#endif
