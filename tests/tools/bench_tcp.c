/* bench_tcp BYTES N [keep] [whole | sendfile FILE | map FILE | pread FILE] | warm: the raw
 * TCP loopback ceiling for the benches.  Sends BYTES to each of N receivers
 * at once (one sender and one receiver thread per connection, 1 MiB writes
 * from one shared 1 MiB buffer, reads into a per-receiver 1 MiB buffer) and
 * prints
 *   seconds S bytes B send_cpu_s X recv_cpu_s Y
 * S: the time until every receiver has all of its bytes; X, Y: the CPU
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
 * whose first touch of each page some VMs make dear).  "warm" sends nothing: it
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
#include <time.h>
#include <unistd.h>

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

typedef struct conn {
	int fd;
	int failed;
	double cpu_s; /* this thread's user + system seconds, at its end */
	pthread_t th;
} conn;

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

static void *receiver(void *arg)
{
	conn *c = arg;
	unsigned char *buf = recv_buf();
	uint64_t left = total_bytes;

	while (buf && left && !c->failed) {
		ssize_t r = read(c->fd, buf + (keep ? total_bytes - left : 0), left < IO_BYTES ? left : IO_BYTES);
		if (r <= 0)
			c->failed = 1;
		else
			left -= (uint64_t)r;
	}
	c->failed |= !buf;
	c->cpu_s = thread_cpu_s(); /* before the free: handing the memory back is no part of receiving */
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

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t len = sizeof(a);
	conn snd[MAX_CONN], rcv[MAX_CONN];
	int lfd, n, failed = 0;
	double t0, send_cpu = 0, recv_cpu = 0;

	if (argc < 3 || (n = atoi(argv[2])) < 1 || n > MAX_CONN || mode(argc, argv)) {
		fprintf(stderr, "usage: bench_tcp BYTES N [keep] [whole | sendfile FILE | map FILE | pread FILE] | warm (1 <= N <= %d)\n",
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
		close(snd[i].fd);
		close(rcv[i].fd);
	}
	printf("seconds %.6f bytes %llu send_cpu_s %.6f recv_cpu_s %.6f\n", now_s() - t0,
	       (unsigned long long)(total_bytes * (uint64_t)n), send_cpu, recv_cpu);
	close(lfd);
	if (!map_file)
		free(whole_buf);
	if (send_file >= 0)
		close(send_file);
	return failed;
}
