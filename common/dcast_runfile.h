/* Private: the file that keeps a run identity (docs/protocol.md,
 * WELCOME.run) on disk, for the broker (DATA_DIR/runs/<model>) and the
 * consumer (DIR/run).  One line, "deltacast-run <16 hex> <8 hex>\n", the
 * second field the XXH32 of the first: a flipped bit or a torn write is
 * found instead of read as another run.  Written to PATH.tmp and renamed
 * over PATH, so a reader sees the old file or the new one; durable at
 * once (dcast_runfile_save), or later, when the caller says
 * (dcast_runfile_write, then dcast_runfile_sync). */
#ifndef DCAST_RUNFILE_H
#define DCAST_RUNFILE_H

#include <stdint.h>

/* Keep `run` (non-zero) in `path`.  Errors: DCAST_EINVAL (run 0),
 * DCAST_EIO (create, write, fsync or rename failed; detail names the file
 * and strerror).  On an error `path` still holds what it held. */
int dcast_runfile_save(const char *path, uint64_t run);

/* As dcast_runfile_save, without the fsync: the file is there for every
 * reader at once, on the disk once dcast_runfile_sync(path) returns 0 (or
 * the system gets to it; its name once its folder is fsynced).  After a
 * power failure in between, `path` may
 * hold the old file, or a torn one (dcast_runfile_load: DCAST_ECORRUPT).
 * Errors: as dcast_runfile_save's. */
int dcast_runfile_write(const char *path, uint64_t run);

/* Make `path`'s bytes durable (fsync); its name is durable once its
 * folder is fsynced too, which the caller does (dcast_fsync_dir).
 * Errors: DCAST_EIO (open or fsync failed; the detail says which). */
int dcast_runfile_sync(const char *path);

/* Read the run kept in `path` into *run (0 on any error).  Errors:
 * DCAST_ENOTFOUND (no such file), DCAST_EIO (unreadable), DCAST_ECORRUPT
 * (not one well-formed line, or its check does not match; the detail
 * names the file and what is wrong). */
int dcast_runfile_load(const char *path, uint64_t *run);

#endif
