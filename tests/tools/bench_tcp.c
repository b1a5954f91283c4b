/* bench_tcp BYTES N [keep | check DIR] [whole | sendfile FILE | map FILE | pread FILE] | warm: the raw
 * TCP loopback ceiling for the benches.  Sends BYTES to each of N receivers
 * at once (one sender and one receiver thread per connection, 1 MiB writes
 * from one shared 1 MiB buffer, reads into a per-receiver 1 MiB buffer) and
 * prints
 *   seconds S bytes B send_cpu_s X recv_cpu_s Y
 * S: the time until every receiver has all of its bytes (with "check",
 * and its last write submitted); X, Y: the CPU
 * seconds (user + system, getrusage RUSAGE_THREAD at each thread's end) of
 * the sender threads and of the receiver threads, summed.  With "keep",
 * each receiver reads into a buffer of BYTES of its own, allocated when it
 * starts (inside the time): what a receiver that keeps the model pays,
 * first touch of fresh memory included.  That buffer is laid out as the
 * consumer's tensor arena is (consumer/state.c, cs_host_alloc): 2 MiB
 * aligned, on transparent huge pages where the kernel grants them, so
 * the receiver pays what the best of keepers does, not the faults of
 * 4 KiB pages.  The next three change the sender only (with or without
 * "keep"), to show what bounds a server's CPU per byte sent: "whole"
 * writes from one shared buffer of BYTES, filled before the clock starts
 * (as the broker sends the model's bytes from its log: send() copies them
 * from memory that is no longer in any cache), "sendfile" sends FILE's
 * first BYTES with sendfile(2) from the page cache (as nginx does, and
 * the broker's --bulk-send sendfile: no copy from user space), "map"
 * writes them from FILE mapped read-only (the page cache's bytes copied
 * into the socket), "pread" reads FILE a MiB at a time into a buffer of
 * each sender's own and writes that (--bulk-send copy: two copies, the
 * second from a buffer in cache, and no user mapping of the page cache,
 * whose first touch of each page some VMs make dear).  "check DIR" is
 * "keep" plus the work the library consumer must do with an anchor it
 * takes in place, and nothing else: each receiver reads at most 512 KiB
 * at a time (consumer/bulk.c's pieces), hashes each piece as it lands as
 * the library does (dcast_landing: per 2 MiB chunk its XXH3 checksum and
 * the XXH3 of each whole 1 MiB block), and writes each 2 MiB chunk, once
 * whole, into a file of its own in DIR (fallocated, unlinked at once)
 * with O_DIRECT through io_uring, 16 writes in flight at most (the
 * checkpoint's write slots); its time and CPU (its io_uring workers'
 * included, as the library counts its own) are read when its last
 * write is submitted, as the library is READY before its writes are
 * done, which are then waited for outside the count.  "warm" sends nothing: it
 * touches N buffers laid out as "keep"'s, frees them and prints "warmed N
 * x BYTES", so that receivers started next find memory the machine has
 * just used (on a VM whose balloon hands free memory back to the host,
 * memory freed seconds ago costs the host's faults on its next touch;
 * scripts/bench_fanout.sh).
 * Exit 1 on a socket error. */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <liburing.h>
#include "dcast_landing.h"
#include "deltacast/codec.h"
#include "../proc.h" /* tp_threads: the tools link tests/support */

#define MAX_CONN 64
#define IO_BYTES (1u << 20)

static uint64_t total_bytes;
static int keep;
static int warm_only; /* "warm" */
static int whole_mode; /* "whole" */
static const char *map_file; /* "map": the file sent with write() from its mapping */
static unsigned char send_buf[IO_BYTES];
static unsigned char *whole_buf; /* "whole": BYTES, every sender's source */
static int send_file = -1;       /* "sendfile" or "pread": the file sent */
static int pread_mode;           /* "pread": read into the sender's buffer, then written */
static const char *check_dir;    /* "check": where the receivers' files go */

#define CHECK_PIECE_BYTES (512u << 10) /* consumer/bulk.c's LAND_PIECE_BYTES */
#define CHECK_CHUNK_BYTES (2u << 20)   /* a producer's chunk of 2^20 bf16 elements */
#define CHECK_WRITES 16                /* consumer/store/ckpt.c's WB_SLOTS */

typedef struct conn {
	int fd;
	int failed;
	double cpu_s; /* this thread's user + system seconds, at its end */
	double done_s; /* a receiver's: when its last byte was in (check: its last write submitted) */
	pthread_t th;
} conn;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The calling thread's CPU seconds so far (user + system). */
static double thread_cpu_s(void)
{
	struct rusage ru;

	if (getrusage(RUSAGE_THREAD, &ru))
		return 0;
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
	       (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

/* The next write of at most IO_BYTES, `left` bytes to go: from the 1 MiB
 * buffer, the whole buffer, or the file (sendfile at an offset of its own:
 * the senders share the fd). */
static ssize_t send_some(int fd, uint64_t left)
{
	size_t n = left < IO_BYTES ? (size_t)left : IO_BYTES;
	off_t off = (off_t)(total_bytes - left);

	if (send_file >= 0 && !pread_mode)
		return sendfile(fd, send_file, &off, n);
	return write(fd, whole_buf ? whole_buf + off : send_buf, n);
}

/* "pread": the next IO_BYTES of the file read into buf, then written
 * whole (the page cache's bytes copied twice, through a buffer that
 * stays in cache). */
static ssize_t send_pread(int fd, unsigned char *buf, uint64_t left)
{
	size_t n = left < IO_BYTES ? (size_t)left : IO_BYTES, done = 0;
	ssize_t r = pread(send_file, buf, n, (off_t)(total_bytes - left));

	if (r <= 0)
		return -1;
	while (done < (size_t)r) {
		ssize_t w = write(fd, buf + done, (size_t)r - done);
		if (w <= 0)
			return -1;
		done += (size_t)w;
	}
	return r;
}

static void *sender(void *arg)
{
	conn *c = arg;
	uint64_t left = total_bytes;
	unsigned char *buf = pread_mode ? malloc(IO_BYTES) : NULL;

	c->failed = pread_mode && !buf;
	while (left && !c->failed) {
		ssize_t w = buf ? send_pread(c->fd, buf, left) : send_some(c->fd, left);
		if (w <= 0) /* a short file: its receiver sees the end early */
			c->failed = 1;
		else
			left -= (uint64_t)w;
	}
	c->cpu_s = thread_cpu_s();
	free(buf);
	shutdown(c->fd, SHUT_WR);
	return NULL;
}

#define HUGE_BYTES ((size_t)2 << 20)

/* The buffer a receiver reads into: IO_BYTES, or with "keep" BYTES on
 * huge pages (a hint: the kernel may give 4 KiB ones). */
static unsigned char *recv_buf(void)
{
	size_t len = ((size_t)total_bytes + HUGE_BYTES - 1) & ~(HUGE_BYTES - 1);
	unsigned char *b;

	if (!keep)
		return malloc(IO_BYTES);
	b = aligned_alloc(HUGE_BYTES, len);
	if (b)
		madvise(b, len, MADV_HUGEPAGE);
	return b;
}

/* "check": one receiver's hasher, its file and the ring that writes it. */
typedef struct checker {
	dcast_landing *land;
	struct io_uring ring;
	int fd, ring_up;
	unsigned inflight;
} checker;

static int check_fail(const char *what, int err)
{
	fprintf(stderr, "bench_tcp: check: %s: %s\n", what, strerror(err));
	return -1;
}

/* A fresh file in check_dir for BYTES (rounded up to 2 MiB), open with
 * O_DIRECT and already unlinked, a ring, a hasher.  -1 (said) on a failure. */
static int check_open(checker *k)
{
	char path[4096];
	int tmp, err;
	uint64_t len = (total_bytes + CHECK_CHUNK_BYTES - 1) & ~(uint64_t)(CHECK_CHUNK_BYTES - 1);

	*k = (checker){.fd = -1};
	snprintf(path, sizeof(path), "%s/bench_tcp.check.XXXXXX", check_dir);
	if ((tmp = mkstemp(path)) < 0)
		return check_fail(check_dir, errno);
	k->fd = open(path, O_WRONLY | O_DIRECT | O_CLOEXEC);
	err = errno;
	unlink(path);
	close(tmp);
	if (k->fd < 0)
		return check_fail("O_DIRECT", err);
	if (fallocate(k->fd, 0, 0, (off_t)len))
		return check_fail("fallocate", errno);
	if ((err = io_uring_queue_init(CHECK_WRITES, &k->ring, 0)))
		return check_fail("io_uring_queue_init", -err);
	k->ring_up = 1;
	return (k->land = dcast_landing_new()) ? 0 : check_fail("dcast_landing_new", ENOMEM);
}

/* Reap the writes done, waiting for at least `min`.  -1 (said) when one
 * failed or wrote short. */
static int check_reap(checker *k, unsigned min)
{
	struct io_uring_cqe *cqe;

	while (k->inflight && (min || !io_uring_peek_cqe(&k->ring, &cqe))) {
		int err = min ? io_uring_wait_cqe(&k->ring, &cqe) : 0;
		int res = err ? err : cqe->res;
		unsigned want = err ? 0 : (unsigned)(uintptr_t)io_uring_cqe_get_data(cqe);

		if (!err)
			io_uring_cqe_seen(&k->ring, cqe);
		k->inflight--;
		min -= min > 0;
		if (res < 0 || (unsigned)res != want)
			return check_fail("write", res < 0 ? -res : EIO);
	}
	return 0;
}

/* One whole chunk's bytes written at its offset, submitted at once (as the
 * library's checkpoint submits each chunk's range), a slot freed first. */
static int check_write(checker *k, const unsigned char *src, uint64_t off, uint64_t len)
{
	struct io_uring_sqe *sqe;

	if (k->inflight == CHECK_WRITES && check_reap(k, 1))
		return -1;
	len = (len + 4095) & ~(uint64_t)4095; /* the buffer is whole 2 MiB: in bounds */
	sqe = io_uring_get_sqe(&k->ring);
	io_uring_prep_write(sqe, k->fd, src, (unsigned)len, off);
	io_uring_sqe_set_data(sqe, (void *)(uintptr_t)len);
	k->inflight++;
	if (io_uring_submit(&k->ring) < 1)
		return check_fail("io_uring_submit", EIO);
	return check_reap(k, 0);
}

static void check_close(checker *k)
{
	if (k->ring_up)
		io_uring_queue_exit(&k->ring);
	if (k->fd >= 0)
		close(k->fd);
	dcast_landing_free(k->land);
}

/* CPU seconds so far of the io_uring workers of the calling thread (the
 * kernel names them "iou-wrk-TID" after the thread that submits): writes
 * the ring hands off run there, and the library's count (its whole
 * process) has its own. */
struct ring_workers {
	char name[32]; /* "iou-wrk-TID" */
	double s;
};

static void ring_worker_add(const char *name, const char *tid, unsigned long long ns, void *arg)
{
	struct ring_workers *w = arg;

	(void)tid;
	if (!strcmp(name, w->name))
		w->s += (double)ns * 1e-9;
}

static double ring_workers_cpu_s(void)
{
	struct ring_workers w = {.s = 0};

	snprintf(w.name, sizeof(w.name), "iou-wrk-%ld", (long)syscall(SYS_gettid));
	tp_threads(ring_worker_add, &w);
	return w.s;
}

/* "check": BYTES read into buf a piece at a time, each piece hashed as it
 * lands, each chunk written once whole.  -1 on a failure. */
static int receive_checked(conn *c, unsigned char *buf, checker *k)
{
	uint64_t got = 0;

	while (got < total_bytes) {
		uint64_t at = got - got % CHECK_CHUNK_BYTES, end = at + CHECK_CHUNK_BYTES;
		size_t want;
		ssize_t r;

		end = end < total_bytes ? end : total_bytes;
		if (got == at && dcast_landing_start(k->land, at, end - at, total_bytes))
			return check_fail("dcast_landing_start", EINVAL);
		want = end - got < CHECK_PIECE_BYTES ? (size_t)(end - got) : CHECK_PIECE_BYTES;
		if ((r = read(c->fd, buf + got, want)) <= 0)
			return -1;
		dcast_landing_add(k->land, buf + got, (size_t)r);
		got += (uint64_t)r;
		if (got == end && (!dcast_landing_done(k->land) || check_write(k, buf + at, at, end - at)))
			return -1;
	}
	return 0;
}

/* A receiver with "check": its CPU, and its ring workers', read once every
 * write is submitted, the writes then waited for outside the count. */
static void receive_check(conn *c, unsigned char *buf)
{
	checker k;

	c->failed = check_open(&k) || receive_checked(c, buf, &k);
	c->cpu_s = thread_cpu_s() + ring_workers_cpu_s();
	c->done_s = now_s();
	c->failed |= check_reap(&k, k.inflight);
	check_close(&k);
}

static void *receiver(void *arg)
{
	conn *c = arg;
	unsigned char *buf = recv_buf();
	uint64_t left = total_bytes;

	if (buf && check_dir) {
		receive_check(c, buf);
		free(buf);
		return NULL;
	}
	while (buf && left && !c->failed) {
		ssize_t r = read(c->fd, buf + (keep ? total_bytes - left : 0), left < IO_BYTES ? left : IO_BYTES);
		if (r <= 0)
			c->failed = 1;
		else
			left -= (uint64_t)r;
	}
	c->failed |= !buf;
	c->cpu_s = thread_cpu_s(); /* before the free: handing the memory back is no part of receiving */
	c->done_s = now_s();
	free(buf);
	return NULL;
}

/* One word of the mode at argv[i] (and its FILE): 1 or 2 words taken,
 * -1 when it is none of them. */
static int mode_word(int argc, char **argv, int i)
{
	if (!strcmp(argv[i], "keep") || !strcmp(argv[i], "warm")) {
		keep = 1;
		warm_only = !strcmp(argv[i], "warm");
		return 1;
	}
	if (!strcmp(argv[i], "check") && i + 1 < argc && !check_dir) {
		keep = 1;
		check_dir = argv[i + 1];
		return 2;
	}
	if (!strcmp(argv[i], "whole")) {
		whole_mode = 1;
		return 1;
	}
	if (!strcmp(argv[i], "map") && i + 1 < argc) {
		map_file = argv[i + 1];
		return 2;
	}
	if ((strcmp(argv[i], "sendfile") && strcmp(argv[i], "pread")) || i + 1 >= argc || send_file >= 0)
		return -1;
	pread_mode = !strcmp(argv[i], "pread");
	if ((send_file = open(argv[i + 1], O_RDONLY | O_CLOEXEC)) < 0)
		perror(argv[i + 1]);
	return send_file < 0 ? -1 : 2;
}

/* The mode in argv[3..]: 0, or -1 when it is not one of the usage's. */
static int mode(int argc, char **argv)
{
	for (int i = 3, w; i < argc; i += w)
		if ((w = mode_word(argc, argv, i)) < 0)
			return -1;
	return (warm_only && argc != 4) || whole_mode + (send_file >= 0) + (map_file != NULL) > 1 ? -1 : 0;
}

/* "warm": n of the keeping receivers' buffers touched, then freed. */
static int warm(int n)
{
	unsigned char *b[MAX_CONN];
	int ok = 1;

	for (int i = 0; i < n; i++)
		if ((b[i] = recv_buf()))
			memset(b[i], 0, (size_t)total_bytes);
		else
			ok = 0;
	for (int i = 0; i < n; i++)
		free(b[i]);
	if (!ok) {
		fprintf(stderr, "bench_tcp: no memory for %d buffers of %" PRIu64 " bytes\n", n, total_bytes);
		return 1;
	}
	printf("warmed %d x %" PRIu64 " bytes\n", n, total_bytes);
	return 0;
}

/* "whole": BYTES filled (its pages exist before the clock starts);
 * "map": FILE's first BYTES mapped and faulted in (as the broker's read
 * cache maps a chunk).  NULL on a failure, errno set. */
static unsigned char *source_buf(void)
{
	unsigned char *b;
	int fd;

	if (!map_file) {
		if ((b = malloc(total_bytes ? total_bytes : 1)))
			memset(b, 0x5a, total_bytes);
		return b;
	}
	if ((fd = open(map_file, O_RDONLY | O_CLOEXEC)) < 0)
		return NULL;
	b = mmap(NULL, total_bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
	close(fd);
	return b == MAP_FAILED ? NULL : b;
}


int main(int argc, char **argv)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t len = sizeof(a);
	conn snd[MAX_CONN], rcv[MAX_CONN];
	int lfd, n, failed = 0;
	double t0, send_cpu = 0, recv_cpu = 0, last = 0;

	if (argc < 3 || (n = atoi(argv[2])) < 1 || n > MAX_CONN || mode(argc, argv)) {
		fprintf(stderr, "usage: bench_tcp BYTES N [keep | check DIR] [whole | sendfile FILE | map FILE | pread FILE] | warm (1 <= N <= %d)\n",
			MAX_CONN);
		return 2;
	}
	total_bytes = strtoull(argv[1], NULL, 10);
	if (warm_only)
		return warm(n);
	if ((whole_mode || map_file) && !(whole_buf = source_buf())) {
		perror(map_file ? map_file : "bench_tcp: whole");
		return 1;
	}
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) || listen(lfd, MAX_CONN) ||
	    getsockname(lfd, (struct sockaddr *)&a, &len)) {
		perror("bench_tcp: listen");
		return 1;
	}
	for (int i = 0; i < n; i++) {
		snd[i] = (conn){.fd = socket(AF_INET, SOCK_STREAM, 0)};
		if (snd[i].fd < 0 || connect(snd[i].fd, (struct sockaddr *)&a, sizeof(a))) {
			perror("bench_tcp: connect");
			return 1;
		}
		rcv[i] = (conn){.fd = accept(lfd, NULL, NULL)};
		if (rcv[i].fd < 0) {
			perror("bench_tcp: accept");
			return 1;
		}
	}
	t0 = now_s();
	for (int i = 0; i < n; i++) {
		pthread_create(&rcv[i].th, NULL, receiver, &rcv[i]);
		pthread_create(&snd[i].th, NULL, sender, &snd[i]);
	}
	for (int i = 0; i < n; i++) {
		pthread_join(snd[i].th, NULL);
		pthread_join(rcv[i].th, NULL);
		failed |= snd[i].failed | rcv[i].failed;
		send_cpu += snd[i].cpu_s;
		recv_cpu += rcv[i].cpu_s;
		last = rcv[i].done_s > last ? rcv[i].done_s : last;
		close(snd[i].fd);
		close(rcv[i].fd);
	}
	printf("seconds %.6f bytes %llu send_cpu_s %.6f recv_cpu_s %.6f\n", last - t0,
	       (unsigned long long)(total_bytes * (uint64_t)n), send_cpu, recv_cpu);
	close(lfd);
	if (!map_file)
		free(whole_buf);
	if (send_file >= 0)
		close(send_file);
	return failed;
}
