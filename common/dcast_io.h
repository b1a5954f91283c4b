/* Private: a small file I/O engine on io_uring (liburing 2.3) with a plain
 * pread/pwrite/fsync path that takes over where io_uring is refused.
 *
 * One dcast_io is one ring of a bounded queue depth, used by one thread.
 * Callers add files (and optionally register buffers) once at setup, then
 * submit reads, writes and fsyncs at offsets and reap their completions.
 * Short transfers and -EAGAIN / -EINTR are requeued inside the engine, so a
 * completion always reports the whole transfer (or a read that met EOF, or
 * an error).  At most `queue_depth` operations are outstanding (submitted
 * and not yet reaped); a submit beyond that returns DCAST_EBUSY.
 *
 * The plain path (io_uring_queue_init fails with EPERM / ENOSYS / EACCES,
 * /proc/sys/kernel/io_uring_disabled is 2, or DELTACAST_IO_URING=0, as in
 * containers whose seccomp profile forbids io_uring) runs the operations
 * on up to 4 threads of the engine's own (named dcast-io, started at its
 * first submit, joined by dcast_io_close), one pread/pwrite/fsync at a
 * time each, so a submit returns at once and callers see the same
 * behaviour as with the ring, completions and the event fd included.
 * Where no thread can start, each operation runs to completion inside its
 * submit instead (logged).  It logs once per process:
 * "io_uring unavailable (<reason>): using pread/pwrite".
 *
 * Errors: a failed syscall or CQE (-errno) becomes DCAST_EIO with a detail
 * naming the file, the operation, the offset and strerror(errno). */
#ifndef DCAST_IO_H
#define DCAST_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

typedef struct dcast_io dcast_io;

#define DCAST_IO_MAX_DEPTH 1024u /* largest queue depth dcast_io_open takes */
#define DCAST_IO_MAX_FILES 256u  /* files one engine holds at once */
#define DCAST_IO_NO_BUF (-1)     /* buf_index for a buffer that is not registered */
#define DCAST_IO_DIRECT_ALIGN 4096u /* O_DIRECT: memory, offset and length a multiple of it
				      * (covers logical blocks up to 4 KiB) */

/* One finished operation, as dcast_io_wait() reports it. */
typedef struct dcast_io_done {
	uint64_t tag;   /* the caller's tag from the submit call */
	int buf_index;  /* the registered buffer it used, or DCAST_IO_NO_BUF */
	int err;        /* 0 or a dcast_err (DCAST_EIO) */
	uint64_t bytes; /* bytes transferred (read: fewer only at end of file) */
	int direct;     /* 1: a write that went through the file's O_DIRECT fd */
} dcast_io_done;

/* Open an engine with room for queue_depth outstanding operations (1 ..
 * DCAST_IO_MAX_DEPTH).  Tries io_uring unless disabled, else the plain path.
 * On success *out is owned by the caller (dcast_io_close).
 * Errors: DCAST_EINVAL (depth), DCAST_ENOMEM, DCAST_EIO (io_uring setup
 * failed for a reason other than being refused). */
int dcast_io_open(dcast_io **out, unsigned queue_depth);

/* Wait for every outstanding operation, release the ring and everything
 * registered (O_DIRECT fds included), set *io to NULL.  Does not close the
 * caller's fds.  NULL-safe. */
void dcast_io_close(dcast_io **io);

/* 1 when operations go through io_uring, 0 on the plain-syscall path. */
int dcast_io_uses_uring(const dcast_io *io);

/* Cap the bytes one syscall or SQE is asked to move (default 1 GiB; at
 * least 1).  A transfer longer than the cap completes through the same
 * requeue path as a short transfer; tests use a small cap to exercise it. */
void dcast_io_set_max_xfer(dcast_io *io, size_t bytes);

/* Add an open fd (owned by the caller, kept open until dcast_io_file_remove)
 * under `name` (for error messages; copied).  With io_uring the fd goes into
 * the ring's registered file table when the kernel allows.  Returns a file
 * handle >= 0, or a negative dcast_err: -DCAST_EBUSY (DCAST_IO_MAX_FILES
 * files held), -DCAST_EINVAL (fd < 0). */
int dcast_io_file_add(dcast_io *io, int fd, const char *name);

/* Forget a file handle, closing its O_DIRECT fd (dcast_io_file_direct) if
 * any.  An operation on it whose completion was not yet handed back
 * (dcast_io_wait) drains the engine first, every file's operations, their
 * completions consumed: so callers reap their own first.  With none, the
 * other files' operations go on untouched.  Returns the first error of a
 * drain, else 0. */
int dcast_io_file_remove(dcast_io *io, int file);

/* 0 when DELTACAST_DIRECT_IO=0 is in the environment, else 1. */
int dcast_io_direct_wanted(void);

/* Open `path` (the file `file` holds, buffered) a second time with
 * O_DIRECT, beside it, for dcast_io_write_direct; the engine owns that fd
 * (closed by dcast_io_file_remove).  Returns 1 when attached; 0 when
 * DELTACAST_DIRECT_IO=0 or the open is refused (EINVAL: tmpfs on older
 * kernels, some FUSE and network filesystems), which logs one info line
 * naming the folder: the file's writes then all go through the page cache.
 * A file handle not held, or one with an O_DIRECT fd already, is a
 * programming error (asserted). */
int dcast_io_file_direct(dcast_io *io, int file, const char *path);

/* 1 while `file` has its O_DIRECT fd (attached and not refused since). */
int dcast_io_file_has_direct(const dcast_io *io, int file);

/* Register n buffers (at most 64) as io_uring fixed buffers; buffer i is
 * iov[i].  The memory stays owned by the caller and must outlive the
 * registration (until dcast_io_close).  Only one registration per engine.
 * When the kernel refuses (e.g. RLIMIT_MEMLOCK), returns 0 and the buffers
 * are used as ordinary ones: the fixed variants then behave as plain.
 * Errors: DCAST_EINVAL (n, NULL iov, already registered). */
int dcast_io_register_buffers(dcast_io *io, const struct iovec *iov, unsigned n);

/* 1 when buffers are registered with the kernel as fixed buffers. */
int dcast_io_buffers_fixed(const dcast_io *io);

/* Submit a write of buf[0..len) at file offset off.  buf_index >= 0 names a
 * registered buffer that must contain [buf, buf+len) (the fixed variant is
 * used); DCAST_IO_NO_BUF otherwise.  `tag` comes back in the completion.
 * The buffer must stay valid and unchanged until the completion is reaped.
 * Errors: DCAST_EBUSY (queue_depth outstanding: reap first), DCAST_EINVAL
 * (bad file handle, buffer outside its registered range, len > 2^31). */
int dcast_io_write(dcast_io *io, int file, const void *buf, size_t len, uint64_t off,
		   int buf_index, uint64_t tag);

/* dcast_io_write through the file's O_DIRECT fd: the kernel moves the
 * bytes from buf without a copy into the page cache.  buf, len and off are
 * multiples of DCAST_IO_DIRECT_ALIGN (asserted).  Without an O_DIRECT fd
 * the write goes through the page cache; one refused with EINVAL is done
 * again there and the fd dropped (logged once, as dcast_io_file_direct),
 * so a completion always reports the whole range.  The completion's
 * `direct` says which way it went.  The caller never writes a page of the
 * file both ways: the page cache would hold a stale copy of a page written
 * direct.  Errors as dcast_io_write. */
int dcast_io_write_direct(dcast_io *io, int file, const void *buf, size_t len, uint64_t off,
			  uint64_t tag);

/* Submit a read of len bytes at off into buf.  As dcast_io_write. */
int dcast_io_read(dcast_io *io, int file, void *buf, size_t len, uint64_t off, int buf_index,
		  uint64_t tag);

/* Submit an fsync (datasync: fdatasync) of a file.  It covers writes whose
 * completions were reaped before it was submitted; to cover everything
 * submitted so far, use dcast_io_sync().  Errors as dcast_io_write. */
int dcast_io_fsync(dcast_io *io, int file, int datasync, uint64_t tag);

/* A descriptor that polls readable (POLLIN) once an operation pushed to
 * the kernel has finished and waits to be reaped by dcast_io_wait: the
 * ring's own, or on the plain path its threads' eventfd (owned by io: not
 * to be closed or read), so that a thread that sleeps in poll() wakes for
 * its completions instead of polling on a timer.  It may poll readable
 * once more with nothing left to reap.  -1 on the plain path before its
 * first submit, or where its threads could not start (an operation then
 * finishes as it is submitted). */
int dcast_io_event_fd(const dcast_io *io);

/* 1 when dcast_io_wait(io, 0, ...) has something to do without a wait:
 * completions reaped and not yet handed back (it hands back at most max
 * at a time), or operations prepared and not yet pushed to the kernel (a
 * short transfer done again).  The event fd says nothing of these: poll
 * it only while this is 0. */
int dcast_io_has_work(const dcast_io *io);

/* Push submitted operations to the kernel and reap at least min_done
 * (clamped to what is outstanding) finished ones, at most max into done[].
 * Returns how many were written to done[] (>= 0), or a negative dcast_err
 * (-DCAST_EIO when waiting on the ring itself failed). */
int dcast_io_wait(dcast_io *io, unsigned min_done, dcast_io_done *done, unsigned max);

/* Wait for every outstanding operation and discard their completions.
 * Returns 0, or the first failure's dcast_err (its detail names the file,
 * operation and offset; later failures are logged). */
int dcast_io_drain(dcast_io *io);

/* Write buf[0..len) at off and wait for it: drain-safe convenience.
 * Returns 0 or the error (outstanding operations are drained first). */
int dcast_io_pwrite_all(dcast_io *io, int file, const void *buf, size_t len, uint64_t off);

/* Read exactly len bytes at off and wait.  Errors: DCAST_EIO, and
 * DCAST_ETRUNCATED when the file ends first (detail names file and offset). */
int dcast_io_pread_all(dcast_io *io, int file, void *buf, size_t len, uint64_t off);

/* Plain syscalls on an fd, for code outside the engine: read or write
 * exactly len bytes at off, retrying short transfers and EINTR.  label
 * names the file in the error.  Errors: DCAST_EIO (the errno's text, or,
 * reading, the file ending inside the range). */
int dcast_pread_full(int fd, void *buf, size_t len, uint64_t off, const char *label);
int dcast_pwrite_full(int fd, const void *buf, size_t len, uint64_t off, const char *label);

/* Drain every outstanding operation, then fsync (or fdatasync) the file and
 * wait: afterwards every write submitted before the call is durable. */
int dcast_io_sync(dcast_io *io, int file, int datasync);

#endif
