/* File I/O engine: io_uring with a plain pread/pwrite/fsync twin (dcast_io.h).
 * Each operation takes one slot of a fixed table (allocated at open); the
 * slot index and buffer index ride in the SQE's user_data, as in liburing's
 * io_uring-cp example.  Finished slots wait in a FIFO until reaped.
 *
 * The plain twin hands each slot to threads of its own (started at the
 * first submit), which do one syscall of it, as the kernel does one CQE's
 * worth, and give it back with its result; the owner's thread accounts it
 * (slot_progress) and requeues a short transfer, as for a CQE.  Only the
 * queues `todo` and `fin` are shared, under `mu`; an eventfd says that
 * `fin` has something.  A write through O_DIRECT waits for the disk inside
 * its syscall, and on ext4 holds the file's lock meanwhile, so that the
 * file's other writes wait for it too: the operations on a file with an
 * O_DIRECT fd (an anchor's own file) queue apart and take all threads but
 * one, and those on the others (the records of a version behind that
 * anchor) never wait behind them for a thread. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include "dcast_common.h"
#include "dcast_io.h"

#define IO_MAX_BUFS 64u
#define IO_MAX_RETRIES 1000u          /* -EAGAIN / -EINTR / no-progress requeues */
#define IO_DEFAULT_XFER (1ul << 30)   /* bytes one SQE or syscall is given */
#define IO_NAME_MAX 96
#define IO_PLAIN_THREADS 4u           /* the plain twin's threads, at most */

enum io_op { IO_READ = 1, IO_WRITE, IO_FSYNC, IO_FDATASYNC };

struct io_slot {
	uint8_t op;
	int file, buf_index;
	char *buf;
	size_t len, done;
	uint64_t off, tag;
	int sys_err;      /* positive errno of a failure, 0 if none */
	unsigned retries;
	uint8_t direct;   /* a write through the file's O_DIRECT fd */
	int fd;           /* plain twin: the fd of its next syscall, and its */
	size_t want;      /* bytes (both set by the owner when it queues it) */
	long res;         /* and the result: bytes or -errno (set by the thread) */
};

struct io_file {
	int fd, fixed, used;
	unsigned ops;     /* submitted, their completions not yet handed back */
	int dfd;          /* the same file opened O_DIRECT (ours), or -1 */
	int dfd_gone;     /* one refused since: closed once no operation of the file is out */
	char name[IO_NAME_MAX];
};

/* A FIFO of slots to run, of the engine's depth. */
struct plain_fifo {
	unsigned *s, head, n;
};

/* The plain twin's threads and the queues they share with the owner. */
struct io_plain {
	pthread_t threads[IO_PLAIN_THREADS];
	unsigned n_threads;
	pthread_mutex_t mu;
	pthread_cond_t todo_cv;      /* a slot to run, or stopping */
	pthread_cond_t fin_cv;       /* a slot run */
	struct plain_fifo todo[2];   /* to run: [1] on files with an O_DIRECT fd, [0] the others */
	unsigned direct_running;     /* [1]'s inside their syscall, at most direct_max */
	unsigned direct_max;         /* the threads but one (one, when there is one) */
	unsigned *fin, fin_n;        /* slots run, their `res` set */
	unsigned *taken;             /* the owner's copy of fin, to account without `mu` */
	int efd;                     /* eventfd: written after each slot put in fin */
	int stopping;
	int tried;                   /* plain_start ran (once per engine) */
};

struct dcast_io {
	struct io_uring ring;
	int uring, files_table, bufs_fixed;
	unsigned depth, n_inflight, n_bufs;
	size_t max_xfer;
	struct io_slot *slots;
	unsigned *free_stack, n_free;
	unsigned *done_fifo, done_head, done_n;
	struct iovec bufs[IO_MAX_BUFS];
	struct io_file files[DCAST_IO_MAX_FILES];
	struct io_plain plain;       /* no io_uring: threads once one started (n_threads) */
};

static void plain_stop(dcast_io *io);
static void direct_close(struct io_file *f);

static const char *op_name(int op)
{
	static const char *names[] = {"?", "read", "write", "fsync", "fdatasync"};

	return op >= IO_READ && op <= IO_FDATASYNC ? names[op] : "?";
}

/* ---- setup ---------------------------------------------------------- */

static void log_fallback_once(const char *reason)
{
	static atomic_int logged;

	if (atomic_exchange(&logged, 1) == 0)
		DCAST_LOG_W("io_uring unavailable (%s): using pread/pwrite", reason);
}

/* Why io_uring must not be tried, or NULL to try it. */
static const char *uring_refused_by_config(void)
{
	const char *env = getenv("DELTACAST_IO_URING");
	char c = 0;
	int fd;

	if (env && strcmp(env, "0") == 0)
		return "DELTACAST_IO_URING=0";
	fd = open("/proc/sys/kernel/io_uring_disabled", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		if (read(fd, &c, 1) != 1)
			c = 0;
		close(fd);
	}
	return c == '2' ? "kernel.io_uring_disabled=2" : NULL;
}

static int is_refusal(int err)
{
	return err == EPERM || err == ENOSYS || err == EACCES || err == ENOMEM;
}

static void setup_file_table(dcast_io *io)
{
	int fds[DCAST_IO_MAX_FILES];

	if (io_uring_register_files_sparse(&io->ring, DCAST_IO_MAX_FILES) == 0) {
		io->files_table = 1;
		return;
	}
	for (unsigned i = 0; i < DCAST_IO_MAX_FILES; i++)
		fds[i] = -1;
	io->files_table = io_uring_register_files(&io->ring, fds, DCAST_IO_MAX_FILES) == 0;
}

static int setup_ring(dcast_io *io)
{
	char why[96];
	const char *refused = uring_refused_by_config();
	int rc;

	if (refused) {
		log_fallback_once(refused);
		return 0;
	}
	rc = io_uring_queue_init(io->depth, &io->ring, 0);
	if (rc < 0 && is_refusal(-rc)) {
		snprintf(why, sizeof(why), "io_uring_queue_init: %s", strerror(-rc));
		log_fallback_once(why);
		return 0;
	}
	if (rc < 0)
		return dcast_fail(DCAST_EIO, "io: io_uring_queue_init(%u): %s", io->depth,
				  strerror(-rc));
	io->uring = 1;
	setup_file_table(io);
	return 0;
}

int dcast_io_open(dcast_io **out, unsigned queue_depth)
{
	dcast_io *io;
	int rc = DCAST_ENOMEM;

	*out = NULL;
	if (queue_depth < 1 || queue_depth > DCAST_IO_MAX_DEPTH)
		return dcast_fail(DCAST_EINVAL, "io: queue_depth %u outside [1, %u]", queue_depth,
				  DCAST_IO_MAX_DEPTH);
	io = calloc(1, sizeof(*io));
	if (!io)
		return dcast_fail(DCAST_ENOMEM, "io: engine allocation");
	io->depth = queue_depth;
	io->max_xfer = IO_DEFAULT_XFER;
	io->slots = calloc(queue_depth, sizeof(*io->slots));
	io->free_stack = calloc(queue_depth, sizeof(unsigned));
	io->done_fifo = calloc(queue_depth, sizeof(unsigned));
	if (!io->slots || !io->free_stack || !io->done_fifo) {
		dcast_fail(DCAST_ENOMEM, "io: slot tables for depth %u", queue_depth);
		goto fail;
	}
	for (unsigned i = 0; i < queue_depth; i++)
		io->free_stack[i] = queue_depth - 1 - i;
	io->n_free = queue_depth;
	io->plain.efd = -1;
	pthread_mutex_init(&io->plain.mu, NULL);
	pthread_cond_init(&io->plain.todo_cv, NULL);
	pthread_cond_init(&io->plain.fin_cv, NULL);
	rc = setup_ring(io);
	if (rc)
		goto fail;
	*out = io;
	return 0;
fail:
	plain_stop(io); /* no thread yet: its locks go */
	free(io->slots);
	free(io->free_stack);
	free(io->done_fifo);
	free(io);
	return rc;
}

void dcast_io_close(dcast_io **iop)
{
	dcast_io *io = iop ? *iop : NULL;

	if (!io)
		return;
	dcast_io_drain(io);
	plain_stop(io);
	for (unsigned i = 0; i < DCAST_IO_MAX_FILES; i++)
		if (io->files[i].used)
			direct_close(&io->files[i]); /* ours; the buffered fds are the callers' */
	if (io->uring)
		io_uring_queue_exit(&io->ring);
	free(io->slots);
	free(io->free_stack);
	free(io->done_fifo);
	free(io);
	*iop = NULL;
}

int dcast_io_uses_uring(const dcast_io *io)
{
	return io->uring;
}

int dcast_io_event_fd(const dcast_io *io)
{
	return io->uring ? io->ring.ring_fd : io->plain.efd;
}

int dcast_io_has_work(const dcast_io *io)
{
	return io->done_n > 0 || (io->uring && io_uring_sq_ready(&io->ring) > 0);
}

void dcast_io_set_max_xfer(dcast_io *io, size_t bytes)
{
	io->max_xfer = bytes ? bytes : 1;
}

/* ---- files and buffers ---------------------------------------------- */

int dcast_io_file_add(dcast_io *io, int fd, const char *name)
{
	struct io_file *f;
	unsigned i;

	if (fd < 0)
		return -dcast_fail(DCAST_EINVAL, "io: file_add('%s'): fd %d", name ? name : "", fd);
	for (i = 0; i < DCAST_IO_MAX_FILES && io->files[i].used; i++)
		;
	if (i == DCAST_IO_MAX_FILES)
		return -dcast_fail(DCAST_EBUSY, "io: %u files already held", DCAST_IO_MAX_FILES);
	f = &io->files[i];
	memset(f, 0, sizeof(*f));
	f->used = 1;
	f->fd = fd;
	f->dfd = f->dfd_gone = -1;
	snprintf(f->name, sizeof(f->name), "%s", name ? name : "?");
	if (io->uring && io->files_table)
		f->fixed = io_uring_register_files_update(&io->ring, i, &fd, 1) == 1;
	return (int)i;
}

static int file_ok(const dcast_io *io, int file)
{
	return file >= 0 && (unsigned)file < DCAST_IO_MAX_FILES && io->files[file].used;
}

int dcast_io_file_remove(dcast_io *io, int file)
{
	int rc, none = -1;

	if (!file_ok(io, file))
		return dcast_fail(DCAST_EINVAL, "io: file handle %d not held", file);
	rc = io->files[file].ops ? dcast_io_drain(io) : 0; /* others' writes go on */
	if (io->files[file].fixed)
		io_uring_register_files_update(&io->ring, (unsigned)file, &none, 1);
	direct_close(&io->files[file]);
	io->files[file].used = 0;
	return rc;
}

/* ---- O_DIRECT beside a file ------------------------------------------ */

/* The folder of path, for the refusal's line. */
static void dir_of(const char *path, char *out, size_t cap)
{
	const char *slash = strrchr(path, '/');

	if (!slash)
		snprintf(out, cap, ".");
	else
		snprintf(out, cap, "%.*s", (int)(slash == path ? 1 : slash - path), path);
}

/* O_DIRECT refused for f (open or a write: EINVAL): said once, and its
 * writes go through the page cache from now on, nothing lost. */
static void direct_refused(struct io_file *f, const char *why)
{
	char dir[IO_NAME_MAX];

	dir_of(f->name, dir, sizeof(dir));
	DCAST_LOG_I("io: O_DIRECT refused in %s (%s): %s written through the page cache", dir, why,
		    f->name);
	DCAST_ASSERT(f->dfd_gone < 0); /* refused once: no O_DIRECT fd opened since */
	f->dfd_gone = f->dfd; /* an operation out may still name it: closed when none is */
	f->dfd = -1;
	if (!f->ops)
		direct_close(f);
}

/* Close f's O_DIRECT fds, the one in use and one refused. */
static void direct_close(struct io_file *f)
{
	if (f->dfd >= 0)
		close(f->dfd);
	if (f->dfd_gone >= 0)
		close(f->dfd_gone);
	f->dfd = f->dfd_gone = -1;
}

int dcast_io_direct_wanted(void)
{
	const char *env = getenv("DELTACAST_DIRECT_IO");

	return !(env && strcmp(env, "0") == 0);
}

int dcast_io_file_direct(dcast_io *io, int file, const char *path)
{
	struct io_file *f;
	char why[96];

	DCAST_ASSERT(file_ok(io, file) && io->files[file].dfd < 0);
	f = &io->files[file];
	if (!dcast_io_direct_wanted())
		return 0;
	f->dfd = open(path, O_WRONLY | O_DIRECT | O_CLOEXEC);
	if (f->dfd >= 0)
		return 1;
	snprintf(why, sizeof(why), "open: %s", strerror(errno));
	direct_refused(f, why);
	return 0;
}

int dcast_io_file_has_direct(const dcast_io *io, int file)
{
	return file_ok(io, file) && io->files[file].dfd >= 0;
}

int dcast_io_register_buffers(dcast_io *io, const struct iovec *iov, unsigned n)
{
	int rc;

	if (!iov || n == 0 || n > IO_MAX_BUFS || io->n_bufs)
		return dcast_fail(DCAST_EINVAL, "io: register_buffers: n=%u (1..%u), once only", n,
				  IO_MAX_BUFS);
	memcpy(io->bufs, iov, n * sizeof(*iov));
	io->n_bufs = n;
	if (!io->uring)
		return 0;
	rc = io_uring_register_buffers(&io->ring, iov, n);
	io->bufs_fixed = rc == 0;
	if (rc)
		DCAST_LOG_W("io: fixed buffers refused (%s): using them as plain buffers",
			    strerror(-rc));
	return 0;
}

int dcast_io_buffers_fixed(const dcast_io *io)
{
	return io->bufs_fixed;
}

/* ---- completing slots ----------------------------------------------- */

static void slot_finish(dcast_io *io, unsigned s)
{
	io->done_fifo[(io->done_head + io->done_n) % io->depth] = s;
	io->done_n++;
}

/* Record a failure of slot s; the detail is formatted when it is reaped. */
static void slot_fail(dcast_io *io, unsigned s, int sys_err)
{
	io->slots[s].sys_err = sys_err ? sys_err : EIO;
	slot_finish(io, s);
}

static int slot_detail(const dcast_io *io, const struct io_slot *sl)
{
	return dcast_fail(DCAST_EIO, "io: %s '%s' at offset %llu (%zu of %zu bytes done): %s",
			  op_name(sl->op), io->files[sl->file].name,
			  (unsigned long long)(sl->off + sl->done), sl->done, sl->len,
			  strerror(sl->sys_err));
}

/* Account `res` (bytes or -errno) for slot s.  Returns 1 when the slot
 * needs requeueing, 0 when it has finished (well or not). */
static int slot_progress(dcast_io *io, unsigned s, long res)
{
	struct io_slot *sl = &io->slots[s];
	int xfer = sl->op == IO_READ || sl->op == IO_WRITE;
	int stalled = res == 0 && sl->op == IO_WRITE && sl->done < sl->len;

	if (res == -EINVAL && sl->direct) { /* refused: the same write through the page cache */
		if (io->files[sl->file].dfd >= 0)
			direct_refused(&io->files[sl->file], "write: Invalid argument");
		sl->direct = 0;
		return 1;
	}
	if (res == -EAGAIN || res == -EINTR || stalled) {
		if (++sl->retries <= IO_MAX_RETRIES)
			return 1;
		slot_fail(io, s, stalled ? ENOSPC : (int)-res);
		return 0;
	}
	if (res < 0) {
		slot_fail(io, s, (int)-res);
		return 0;
	}
	sl->done += xfer ? (size_t)res : 0;
	if (xfer && res > 0 && sl->done < sl->len)
		return 1;
	slot_finish(io, s); /* whole transfer, end of file, or a sync */
	return 0;
}

/* ---- plain-syscall path --------------------------------------------- */

/* The fd slot sl goes through: the O_DIRECT one while it is held. */
static int slot_fd(dcast_io *io, struct io_slot *sl)
{
	struct io_file *f = &io->files[sl->file];

	if (sl->direct && f->dfd < 0)
		sl->direct = 0; /* refused meanwhile, by another write */
	return sl->direct ? f->dfd : f->fd;
}

/* One syscall of slot sl, as plain_prep set it: bytes, or -errno.  Runs
 * on a thread of the twin's (it reads nothing of the engine's). */
static long plain_once(const struct io_slot *sl)
{
	long r;

	switch (sl->op) {
	case IO_READ:
		r = pread(sl->fd, sl->buf + sl->done, sl->want, (off_t)(sl->off + sl->done));
		break;
	case IO_WRITE:
		r = pwrite(sl->fd, sl->buf + sl->done, sl->want, (off_t)(sl->off + sl->done));
		break;
	case IO_FSYNC:
		r = fsync(sl->fd);
		break;
	default:
		r = fdatasync(sl->fd);
		break;
	}
	return r < 0 ? -errno : r;
}

/* sl's next syscall: its fd and length, picked as uring_prep picks them. */
static void plain_prep(dcast_io *io, struct io_slot *sl)
{
	size_t n = sl->len - sl->done;

	sl->fd = slot_fd(io, sl);
	sl->want = n > io->max_xfer ? io->max_xfer : n;
}

/* Slot s run to its end inside the submit: where no thread could start. */
static void plain_run(dcast_io *io, unsigned s)
{
	do
		plain_prep(io, &io->slots[s]);
	while (slot_progress(io, s, plain_once(&io->slots[s])));
}

/* The queue a thread takes its next slot from, or NULL: the quick ones
 * first, one on a file with an O_DIRECT fd while fewer than direct_max
 * run. */
static struct plain_fifo *plain_next(struct io_plain *p)
{
	if (p->todo[0].n)
		return &p->todo[0];
	return p->todo[1].n && p->direct_running < p->direct_max ? &p->todo[1] : NULL;
}

static void *plain_thread(void *arg)
{
	dcast_io *io = arg;
	struct io_plain *p = &io->plain;
	const uint64_t one = 1;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		struct plain_fifo *f;
		unsigned s;
		int direct;

		while (!(f = plain_next(p)) && !(p->stopping && !p->todo[0].n && !p->todo[1].n))
			pthread_cond_wait(&p->todo_cv, &p->mu);
		if (!f)
			break; /* stopping, nothing left */
		s = f->s[f->head];
		f->head = (f->head + 1) % io->depth;
		f->n--;
		direct = f == &p->todo[1];
		p->direct_running += (unsigned)direct;
		pthread_mutex_unlock(&p->mu);
		io->slots[s].res = plain_once(&io->slots[s]);
		pthread_mutex_lock(&p->mu);
		p->direct_running -= (unsigned)direct;
		if (direct && p->todo[1].n) /* one waiting may take it now */
			pthread_cond_signal(&p->todo_cv);
		DCAST_ASSERT(p->fin_n < io->depth); /* each slot is in one queue at most */
		p->fin[p->fin_n++] = s;
		pthread_cond_signal(&p->fin_cv);
		if (write(p->efd, &one, sizeof(one)) < 0) /* only at 2^64 - 1 unread */
			DCAST_ASSERT(errno == EAGAIN);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

static void plain_free(struct io_plain *p)
{
	free(p->todo[0].s);
	free(p->todo[1].s);
	free(p->fin);
	free(p->taken);
	if (p->efd >= 0)
		close(p->efd);
	p->todo[0].s = p->todo[1].s = p->fin = p->taken = NULL;
	p->efd = -1;
}

/* The twin's threads, at the first submit.  Where none starts (no memory,
 * no eventfd, no thread) each operation runs inside its submit, said once
 * per engine. */
static void plain_start(dcast_io *io)
{
	struct io_plain *p = &io->plain;
	unsigned want = io->depth < IO_PLAIN_THREADS ? io->depth : IO_PLAIN_THREADS;
	sigset_t all, was;

	p->tried = 1;
	p->todo[0].s = calloc(io->depth, sizeof(*p->todo[0].s));
	p->todo[1].s = calloc(io->depth, sizeof(*p->todo[1].s));
	p->direct_max = want > 1 ? want - 1 : 1;
	p->fin = calloc(io->depth, sizeof(*p->fin));
	p->taken = calloc(io->depth, sizeof(*p->taken));
	p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &was); /* the host's signals are not theirs to take */
	while (p->todo[0].s && p->todo[1].s && p->fin && p->taken && p->efd >= 0 && p->n_threads < want &&
	       pthread_create(&p->threads[p->n_threads], NULL, plain_thread, io) == 0)
		pthread_setname_np(p->threads[p->n_threads++], "dcast-io");
	pthread_sigmask(SIG_SETMASK, &was, NULL);
	pthread_mutex_lock(&p->mu);
	p->direct_max = p->n_threads > 1 ? p->n_threads - 1 : 1; /* those that started */
	pthread_mutex_unlock(&p->mu);
	if (p->n_threads)
		return;
	DCAST_LOG_W("io: no thread for the pread/pwrite path (%s): each operation runs inside its submit",
		    p->efd < 0 ? strerror(errno) : "no memory or no thread");
	plain_free(p);
}

/* Slot s to the twin's threads, its next syscall picked here. */
static void plain_push(dcast_io *io, unsigned s)
{
	struct io_plain *p = &io->plain;
	struct plain_fifo *f;

	plain_prep(io, &io->slots[s]);
	pthread_mutex_lock(&p->mu);
	f = &p->todo[io->files[io->slots[s].file].dfd >= 0];
	DCAST_ASSERT(p->todo[0].n + p->todo[1].n < io->depth);
	f->s[(f->head + f->n++) % io->depth] = s;
	pthread_cond_signal(&p->todo_cv);
	pthread_mutex_unlock(&p->mu);
	io->n_inflight++;
}

/* Account the slots the threads ran, as uring_reap_ready accounts CQEs: a
 * short transfer or a retry goes back to them. */
static void plain_reap_ready(dcast_io *io)
{
	struct io_plain *p = &io->plain;
	uint64_t count;
	unsigned n;

	if (read(p->efd, &count, sizeof(count)) < 0) /* nothing written since: fine */
		DCAST_ASSERT(errno == EAGAIN);
	pthread_mutex_lock(&p->mu);
	n = p->fin_n;
	memcpy(p->taken, p->fin, n * sizeof(*p->fin));
	p->fin_n = 0;
	pthread_mutex_unlock(&p->mu);
	for (unsigned i = 0; i < n; i++) {
		unsigned s = p->taken[i];

		io->n_inflight--;
		if (slot_progress(io, s, io->slots[s].res))
			plain_push(io, s);
	}
}

/* Wait until at least want slots are in the done FIFO or nothing is out. */
static void plain_wait_for(dcast_io *io, unsigned want)
{
	struct io_plain *p = &io->plain;

	plain_reap_ready(io);
	while (io->done_n < want && io->n_inflight > 0) {
		pthread_mutex_lock(&p->mu);
		while (!p->fin_n)
			pthread_cond_wait(&p->fin_cv, &p->mu);
		pthread_mutex_unlock(&p->mu);
		plain_reap_ready(io);
	}
}

/* Stop and join the threads (nothing is out: drained first); their locks
 * and queues go. */
static void plain_stop(dcast_io *io)
{
	struct io_plain *p = &io->plain;

	pthread_mutex_lock(&p->mu);
	p->stopping = 1;
	pthread_cond_broadcast(&p->todo_cv);
	pthread_mutex_unlock(&p->mu);
	for (unsigned i = 0; i < p->n_threads; i++)
		pthread_join(p->threads[i], NULL);
	p->n_threads = 0;
	plain_free(p);
	pthread_cond_destroy(&p->fin_cv);
	pthread_cond_destroy(&p->todo_cv);
	pthread_mutex_destroy(&p->mu);
}

/* ---- io_uring path -------------------------------------------------- */

static struct io_uring_sqe *get_sqe(dcast_io *io)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);

	if (!sqe) {
		io_uring_submit(&io->ring);
		sqe = io_uring_get_sqe(&io->ring);
	}
	DCAST_ASSERT(sqe); /* in-flight ops never exceed the SQ size */
	return sqe;
}

static void uring_prep(dcast_io *io, unsigned s)
{
	struct io_slot *sl = &io->slots[s];
	struct io_file *f = &io->files[sl->file];
	struct io_uring_sqe *sqe = get_sqe(io);
	int raw = slot_fd(io, sl), fixed = f->fixed && !sl->direct;
	int fd = fixed ? sl->file : raw;
	size_t n = sl->len - sl->done;
	int fixed_buf = sl->buf_index >= 0 && io->bufs_fixed;

	if (n > io->max_xfer)
		n = io->max_xfer;
	if (sl->op == IO_READ && fixed_buf)
		io_uring_prep_read_fixed(sqe, fd, sl->buf + sl->done, (unsigned)n,
					 sl->off + sl->done, sl->buf_index);
	else if (sl->op == IO_READ)
		io_uring_prep_read(sqe, fd, sl->buf + sl->done, (unsigned)n, sl->off + sl->done);
	else if (sl->op == IO_WRITE && fixed_buf)
		io_uring_prep_write_fixed(sqe, fd, sl->buf + sl->done, (unsigned)n,
					  sl->off + sl->done, sl->buf_index);
	else if (sl->op == IO_WRITE)
		io_uring_prep_write(sqe, fd, sl->buf + sl->done, (unsigned)n, sl->off + sl->done);
	else
		io_uring_prep_fsync(sqe, fd, sl->op == IO_FDATASYNC ? IORING_FSYNC_DATASYNC : 0);
	if (fixed)
		sqe->flags |= IOSQE_FIXED_FILE;
	io_uring_sqe_set_data64(sqe, s | ((uint64_t)(uint32_t)(sl->buf_index + 1) << 32));
}

static void uring_reap_ready(dcast_io *io)
{
	struct io_uring_cqe *cqe;
	unsigned head, seen = 0;

	io_uring_for_each_cqe(&io->ring, head, cqe) {
		unsigned s = (unsigned)(io_uring_cqe_get_data64(cqe) & 0xffffffffu);

		seen++;
		DCAST_ASSERT(s < io->depth);
		io->n_inflight--;
		if (slot_progress(io, s, cqe->res)) {
			uring_prep(io, s);
			io->n_inflight++;
		}
	}
	io_uring_cq_advance(&io->ring, seen);
}

/* Submit and wait until at least want slots are in the done FIFO or
 * nothing is in flight. */
static int uring_wait_for(dcast_io *io, unsigned want)
{
	while (io->done_n < want && io->n_inflight > 0) {
		int rc = io_uring_submit_and_wait(&io->ring, 1);

		if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
			return dcast_fail(DCAST_EIO, "io: io_uring_submit_and_wait: %s",
					  strerror(-rc));
		uring_reap_ready(io);
	}
	return 0;
}

/* ---- submission ----------------------------------------------------- */

/* Slot s under way: to the ring, to the twin's threads, or run here. */
static void slot_start(dcast_io *io, unsigned s)
{
	if (io->uring) {
		uring_prep(io, s);
		io->n_inflight++;
		return;
	}
	if (!io->plain.tried)
		plain_start(io);
	if (io->plain.n_threads)
		plain_push(io, s);
	else
		plain_run(io, s);
}

static int submit(dcast_io *io, int op, int file, void *buf, size_t len, uint64_t off,
		  int buf_index, uint64_t tag, int direct)
{
	struct io_slot *sl;
	unsigned s;

	if (!file_ok(io, file))
		return dcast_fail(DCAST_EINVAL, "io: %s: file handle %d not held", op_name(op), file);
	if (buf_index >= (int)io->n_bufs || buf_index < DCAST_IO_NO_BUF ||
	    (buf_index >= 0 &&
	     ((char *)buf < (char *)io->bufs[buf_index].iov_base ||
	      (char *)buf + len > (char *)io->bufs[buf_index].iov_base + io->bufs[buf_index].iov_len)))
		return dcast_fail(DCAST_EINVAL, "io: %s '%s': buffer index %d does not hold the range",
				  op_name(op), io->files[file].name, buf_index);
	if (io->n_free == 0)
		return dcast_fail(DCAST_EBUSY, "io: %u operations outstanding: reap first", io->depth);
	s = io->free_stack[--io->n_free];
	sl = &io->slots[s];
	io->files[file].ops++;
	*sl = (struct io_slot){.op = (uint8_t)op, .file = file, .buf_index = buf_index,
			       .buf = buf, .len = len, .off = off, .tag = tag,
			       .direct = (uint8_t)(direct && io->files[file].dfd >= 0)};
	slot_start(io, s);
	return 0;
}

int dcast_io_write(dcast_io *io, int file, const void *buf, size_t len, uint64_t off,
		   int buf_index, uint64_t tag)
{
	return submit(io, IO_WRITE, file, (void *)buf, len, off, buf_index, tag, 0);
}

int dcast_io_write_direct(dcast_io *io, int file, const void *buf, size_t len, uint64_t off,
			  uint64_t tag)
{
	DCAST_ASSERT((uintptr_t)buf % DCAST_IO_DIRECT_ALIGN == 0 && len % DCAST_IO_DIRECT_ALIGN == 0 &&
		     off % DCAST_IO_DIRECT_ALIGN == 0);
	return submit(io, IO_WRITE, file, (void *)buf, len, off, DCAST_IO_NO_BUF, tag, 1);
}

int dcast_io_read(dcast_io *io, int file, void *buf, size_t len, uint64_t off, int buf_index,
		  uint64_t tag)
{
	return submit(io, IO_READ, file, buf, len, off, buf_index, tag, 0);
}

int dcast_io_fsync(dcast_io *io, int file, int datasync, uint64_t tag)
{
	return submit(io, datasync ? IO_FDATASYNC : IO_FSYNC, file, NULL, 0, 0, DCAST_IO_NO_BUF,
		      tag, 0);
}

/* ---- reaping -------------------------------------------------------- */

static unsigned outstanding(const dcast_io *io)
{
	return io->depth - io->n_free;
}

/* Pop the oldest finished slot into *d; returns its dcast_err. */
static int pop_done(dcast_io *io, dcast_io_done *d)
{
	unsigned s = io->done_fifo[io->done_head];
	struct io_slot *sl = &io->slots[s];

	io->done_head = (io->done_head + 1) % io->depth;
	io->done_n--;
	io->free_stack[io->n_free++] = s;
	DCAST_ASSERT(io->files[sl->file].ops > 0);
	if (!--io->files[sl->file].ops && io->files[sl->file].dfd_gone >= 0)
		direct_close(&io->files[sl->file]); /* only the refused one: none is opened again */
	d->tag = sl->tag;
	d->buf_index = sl->buf_index;
	d->bytes = sl->done;
	d->err = sl->sys_err ? DCAST_EIO : 0;
	d->direct = sl->direct;
	return d->err;
}

int dcast_io_wait(dcast_io *io, unsigned min_done, dcast_io_done *done, unsigned max)
{
	unsigned n = 0, first_err = 0;
	int rc;

	if (min_done > outstanding(io))
		min_done = outstanding(io);
	if (min_done > max)
		min_done = max;
	if (io->uring) {
		if (io->n_inflight)
			io_uring_submit(&io->ring);
		uring_reap_ready(io);
		rc = uring_wait_for(io, min_done);
		if (rc)
			return -rc;
	} else if (io->plain.n_threads) {
		plain_wait_for(io, min_done);
	}
	while (io->done_n && n < max) {
		unsigned s = io->done_fifo[io->done_head];

		if (pop_done(io, &done[n]) && !first_err++)
			slot_detail(io, &io->slots[s]);
		n++;
	}
	return (int)n;
}

int dcast_io_drain(dcast_io *io)
{
	dcast_io_done d;
	int first = 0, rc;

	while (outstanding(io)) {
		if (io->uring && (rc = uring_wait_for(io, 1)) != 0)
			return rc;
		if (io->plain.n_threads)
			plain_wait_for(io, 1);
		while (io->done_n) {
			unsigned s = io->done_fifo[io->done_head];

			if (!pop_done(io, &d))
				continue;
			if (!first)
				first = slot_detail(io, &io->slots[s]);
			else
				DCAST_LOG_W("io: %s '%s' at offset %llu also failed: %s",
					    op_name(io->slots[s].op),
					    io->files[io->slots[s].file].name,
					    (unsigned long long)io->slots[s].off,
					    strerror(io->slots[s].sys_err));
		}
	}
	return first;
}

/* Drain, then run one operation and wait for it; returns its result. */
static int run_one(dcast_io *io, int op, int file, void *buf, size_t len, uint64_t off,
		   uint64_t *bytes)
{
	dcast_io_done d;
	int rc = dcast_io_drain(io);

	if (rc)
		return rc;
	rc = submit(io, op, file, buf, len, off, DCAST_IO_NO_BUF, 0, 0);
	if (rc)
		return rc;
	rc = dcast_io_wait(io, 1, &d, 1);
	if (rc < 0)
		return -rc;
	DCAST_ASSERT(rc == 1);
	*bytes = d.bytes;
	return d.err;
}

int dcast_io_pwrite_all(dcast_io *io, int file, const void *buf, size_t len, uint64_t off)
{
	uint64_t bytes;

	return run_one(io, IO_WRITE, file, (void *)buf, len, off, &bytes);
}

int dcast_io_pread_all(dcast_io *io, int file, void *buf, size_t len, uint64_t off)
{
	uint64_t bytes = 0;
	int rc = run_one(io, IO_READ, file, buf, len, off, &bytes);

	if (rc == 0 && bytes < len)
		return dcast_fail(DCAST_ETRUNCATED, "io: read '%s': file ends at offset %llu, "
				  "wanted %zu bytes at %llu", io->files[file].name,
				  (unsigned long long)(off + bytes), len, (unsigned long long)off);
	return rc;
}

int dcast_io_sync(dcast_io *io, int file, int datasync)
{
	uint64_t bytes;

	return run_one(io, datasync ? IO_FDATASYNC : IO_FSYNC, file, NULL, 0, 0, &bytes);
}

/* At most 1 GiB a syscall, as the engine asks (Linux moves at most about
 * 2 GiB per call anyway). */
#define FULL_STEP (1u << 30)

int dcast_pread_full(int fd, void *buf, size_t len, uint64_t off, const char *label)
{
	size_t got = 0;

	while (got < len) {
		size_t want = len - got < FULL_STEP ? len - got : FULL_STEP;
		ssize_t n = pread(fd, (char *)buf + got, want, (off_t)(off + got));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return dcast_fail(DCAST_EIO, "%s: read %zu bytes at %llu: %s", label, len,
					  (unsigned long long)off, strerror(errno));
		if (n == 0)
			return dcast_fail(DCAST_EIO, "%s: ends inside %zu bytes at %llu (changed while read)",
					  label, len, (unsigned long long)off);
		got += (size_t)n;
	}
	return 0;
}

int dcast_pwrite_full(int fd, const void *buf, size_t len, uint64_t off, const char *label)
{
	size_t put = 0;

	while (put < len) {
		size_t want = len - put < FULL_STEP ? len - put : FULL_STEP;
		ssize_t n = pwrite(fd, (const char *)buf + put, want, (off_t)(off + put));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return dcast_fail(DCAST_EIO, "%s: write at offset %llu: %s", label,
					  (unsigned long long)(off + put), n < 0 ? strerror(errno) : "no progress");
		put += (size_t)n;
	}
	return 0;
}
