/* dcast_io on real files, through io_uring and through the plain path
 * (DELTACAST_IO_URING=0): writes read back equal, short transfers are
 * requeued, a write cut short by RLIMIT_FSIZE reports the file, fixed
 * buffers, the in-flight bound, errors naming file and operation, a
 * file removed beside another's writes, the event fd that says a
 * completion waits; the plain path's threads (dcast-io), there while an
 * engine is, joined by its close. */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "dcast_io.h"
#include "proc.h"

static char dir[] = "/tmp/dcast_test_io_XXXXXX";

static void fill(unsigned char *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		p[i] = (unsigned char)(seed >> 24);
	}
}

static int open_file(const char *name, int flags, char *path, size_t cap)
{
	snprintf(path, cap, "%s/%s", dir, name);
	return open(path, flags | O_CREAT | O_CLOEXEC, 0644);
}

/* Many async writes under a small depth (reaping on EBUSY), fsync, then
 * async reads back with tags; every byte equal. */
static void test_async_roundtrip(unsigned depth, size_t max_xfer)
{
	enum { PIECE = 4096, PIECES = 256 };
	static unsigned char src[PIECE * PIECES], dst[PIECE * PIECES];
	char path[256];
	dcast_io *io;
	dcast_io_done done[8];
	int fd = open_file("rt", O_RDWR | O_TRUNC, path, sizeof(path)), f, seen[PIECES] = {0};

	REQUIRE(fd >= 0);
	REQUIRE(dcast_io_open(&io, depth) == 0);
	dcast_io_set_max_xfer(io, max_xfer);
	f = dcast_io_file_add(io, fd, path);
	REQUIRE(f >= 0);
	fill(src, sizeof(src), depth);
	for (unsigned i = 0; i < PIECES; i++) {
		int rc;

		while ((rc = dcast_io_write(io, f, src + i * PIECE, PIECE, (uint64_t)i * PIECE,
					    DCAST_IO_NO_BUF, i)) == DCAST_EBUSY) {
			int n = dcast_io_wait(io, 1, done, 8);

			REQUIRE(n >= 1);
			for (int k = 0; k < n; k++)
				CHECK(done[k].err == 0 && done[k].bytes == PIECE);
		}
		CHECK_ERR(rc, 0);
	}
	CHECK_ERR(dcast_io_drain(io), 0);
	CHECK_ERR(dcast_io_sync(io, f, 0), 0);
	memset(dst, 0xee, sizeof(dst));
	for (unsigned i = 0; i < PIECES; i++) {
		while (dcast_io_read(io, f, dst + i * PIECE, PIECE, (uint64_t)i * PIECE,
				     DCAST_IO_NO_BUF, 1000 + i) == DCAST_EBUSY) {
			int n = dcast_io_wait(io, 1, done, 8);

			REQUIRE(n >= 1);
			for (int k = 0; k < n; k++) {
				CHECK(done[k].tag >= 1000 && done[k].tag < 1000 + PIECES);
				CHECK(done[k].err == 0 && done[k].bytes == PIECE);
				seen[done[k].tag - 1000]++;
			}
		}
	}
	for (int n; (n = dcast_io_wait(io, 1, done, 8)) > 0;)
		for (int k = 0; k < n; k++)
			seen[done[k].tag - 1000]++;
	for (unsigned i = 0; i < PIECES; i++)
		CHECK(seen[i] == 1);
	CHECK(memcmp(src, dst, sizeof(src)) == 0);
	dcast_io_close(&io);
	CHECK(io == NULL);
	close(fd);
}

/* Registered buffers: write_fixed from buffer 0, read_fixed into 1. */
static void test_fixed_buffers(void)
{
	static unsigned char a[65536], b[65536];
	struct iovec iov[2] = {{a, sizeof(a)}, {b, sizeof(b)}};
	dcast_io_done d;
	char path[256];
	dcast_io *io;
	int fd = open_file("fixed", O_RDWR | O_TRUNC, path, sizeof(path)), f;

	REQUIRE(fd >= 0);
	REQUIRE(dcast_io_open(&io, 4) == 0);
	f = dcast_io_file_add(io, fd, path);
	CHECK_ERR(dcast_io_register_buffers(io, iov, 2), 0);
	CHECK_ERR(dcast_io_register_buffers(io, iov, 2), DCAST_EINVAL);
	fill(a, sizeof(a), 7);
	CHECK_ERR(dcast_io_write(io, f, a + 100, 60000, 100, 0, 1), 0);
	REQUIRE(dcast_io_wait(io, 1, &d, 1) == 1);
	CHECK(d.tag == 1 && d.err == 0 && d.bytes == 60000 && d.buf_index == 0);
	CHECK_ERR(dcast_io_read(io, f, b, 60000, 100, 1, 2), 0);
	REQUIRE(dcast_io_wait(io, 1, &d, 1) == 1);
	CHECK(d.tag == 2 && d.err == 0 && d.bytes == 60000 && d.buf_index == 1);
	CHECK(memcmp(a + 100, b, 60000) == 0);
	/* A range outside the named buffer is refused before anything runs. */
	CHECK_ERR(dcast_io_write(io, f, a, 100, 0, 1, 3), DCAST_EINVAL);
	CHECK_ERR(dcast_io_write(io, f, a + 65000, 1000, 0, 0, 3), DCAST_EINVAL);
	dcast_io_close(&io);
	close(fd);
}

/* Removing a file with nothing of its own outstanding leaves the other
 * files' operations to their owner: a write on A still comes back from
 * dcast_io_wait, with its tag, after B is removed; A's removal with its
 * write not reaped drains it (the write done, its completion consumed). */
static void test_remove_beside(void)
{
	static unsigned char a[8192];
	char pa[256], pb[256];
	dcast_io_done d;
	dcast_io *io;
	int fa = open_file("beside-a", O_RDWR | O_TRUNC, pa, sizeof(pa));
	int fb = open_file("beside-b", O_RDWR | O_TRUNC, pb, sizeof(pb)), a_h, b_h;
	struct stat st;

	REQUIRE(fa >= 0 && fb >= 0);
	REQUIRE(dcast_io_open(&io, 4) == 0);
	a_h = dcast_io_file_add(io, fa, pa);
	b_h = dcast_io_file_add(io, fb, pb);
	REQUIRE(a_h >= 0 && b_h >= 0);
	fill(a, sizeof(a), 11);
	CHECK_ERR(dcast_io_write(io, a_h, a, sizeof(a), 0, DCAST_IO_NO_BUF, 7), 0);
	CHECK_ERR(dcast_io_file_remove(io, b_h), 0);
	REQUIRE(dcast_io_wait(io, 1, &d, 1) == 1);
	CHECK(d.tag == 7 && d.err == 0 && d.bytes == sizeof(a));
	CHECK_ERR(dcast_io_write(io, a_h, a, sizeof(a), sizeof(a), DCAST_IO_NO_BUF, 8), 0);
	CHECK_ERR(dcast_io_file_remove(io, a_h), 0);
	CHECK(dcast_io_wait(io, 1, &d, 1) == 0);
	CHECK(fstat(fa, &st) == 0 && st.st_size == 2 * (off_t)sizeof(a));
	dcast_io_close(&io);
	close(fa);
	close(fb);
}

/* The in-flight bound, bad handles, reads past the end, failing fds. */
static void test_errors(void)
{
	char path[256], buf[64] = "0123456789";
	dcast_io_done d[4];
	dcast_io *io;
	int fd = open_file("err", O_RDWR | O_TRUNC, path, sizeof(path)), f, wo, fw;

	REQUIRE(fd >= 0);
	CHECK_ERR(dcast_io_open(&io, 0), DCAST_EINVAL);
	REQUIRE(dcast_io_open(&io, 2) == 0);
	f = dcast_io_file_add(io, fd, path);
	CHECK(dcast_io_file_add(io, -1, "x") == -DCAST_EINVAL);
	CHECK_ERR(dcast_io_write(io, f, buf, 10, 0, DCAST_IO_NO_BUF, 1), 0);
	CHECK_ERR(dcast_io_write(io, f, buf, 10, 10, DCAST_IO_NO_BUF, 2), 0);
	CHECK_ERR(dcast_io_write(io, f, buf, 10, 20, DCAST_IO_NO_BUF, 3), DCAST_EBUSY);
	CHECK(dcast_io_wait(io, 2, d, 4) == 2);
	CHECK_ERR(dcast_io_write(io, 7, buf, 10, 0, DCAST_IO_NO_BUF, 1), DCAST_EINVAL);
	CHECK_ERR(dcast_io_pread_all(io, f, buf, 30, 0), DCAST_ETRUNCATED);
	CHECK(strstr(dcast_last_error(), "rt") || strstr(dcast_last_error(), "err"));
	CHECK_ERR(dcast_io_pread_all(io, f, buf, 20, 0), 0);
	CHECK(memcmp(buf, "01234567890123456789", 20) == 0);
	/* Reading from a write-only fd fails with the file and op named. */
	wo = open(path, O_WRONLY | O_CLOEXEC);
	fw = dcast_io_file_add(io, wo, "write-only-file");
	CHECK_ERR(dcast_io_pread_all(io, fw, buf, 4, 0), DCAST_EIO);
	CHECK(strstr(dcast_last_error(), "write-only-file") && strstr(dcast_last_error(), "read"));
	CHECK_ERR(dcast_io_file_remove(io, fw), 0);
	CHECK_ERR(dcast_io_file_remove(io, fw), DCAST_EINVAL);
	dcast_io_close(&io);
	close(wo);
	close(fd);
}

/* RLIMIT_FSIZE cuts a write short (a real short write), then EFBIG: the
 * engine requeues the rest and reports the failure naming the file; the
 * bytes before the limit are on disk.  Runs in a child: the limit is
 * process-wide. */
static int short_write_child(void)
{
	static unsigned char src[4096], back[1000];
	struct rlimit rl = {1000, 1000};
	char path[256];
	dcast_io *io;
	int fd = open_file("short", O_RDWR | O_TRUNC, path, sizeof(path)), f, bad = 0;
	struct stat st;

	signal(SIGXFSZ, SIG_IGN);
	if (fd < 0 || setrlimit(RLIMIT_FSIZE, &rl) || dcast_io_open(&io, 4))
		return 2;
	f = dcast_io_file_add(io, fd, path);
	fill(src, sizeof(src), 99);
	bad |= dcast_io_pwrite_all(io, f, src, sizeof(src), 0) != DCAST_EIO;
	bad |= !strstr(dcast_last_error(), "short") || !strstr(dcast_last_error(), "write");
	bad |= !strstr(dcast_last_error(), "1000 of 4096");
	if (bad)
		fprintf(stderr, "short write detail: %s\n", dcast_last_error());
	bad |= fstat(fd, &st) != 0 || st.st_size != 1000;
	bad |= dcast_io_pread_all(io, f, back, sizeof(back), 0) != 0;
	bad |= memcmp(back, src, sizeof(back)) != 0;
	dcast_io_close(&io);
	return bad;
}

static void test_short_write(void)
{
	int status = -1;
	pid_t pid = fork();

	REQUIRE(pid >= 0);
	if (pid == 0)
		_exit(short_write_child());
	REQUIRE(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void count_io(const char *name, const char *tid, unsigned long long ns, void *arg)
{
	(void)tid, (void)ns;
	*(int *)arg += !strcmp(name, "dcast-io");
}

/* Threads of this process named dcast-io. */
static int io_threads(void)
{
	int n = 0;

	tp_threads(count_io, &n);
	return n;
}

/* A write pushed and not reaped: the event fd polls readable, and the
 * next wait hands back its completion without blocking.  On the plain
 * path, `threads` threads run the operations, and none is left after the
 * close. */
static void test_event_fd(int threads)
{
	static unsigned char src[1 << 20];
	char path[256];
	dcast_io_done d;
	dcast_io *io;
	int fd = open_file("ev", O_RDWR | O_TRUNC, path, sizeof(path)), f, got;
	struct pollfd pfd = {.events = POLLIN};

	REQUIRE(fd >= 0);
	REQUIRE(dcast_io_open(&io, 8) == 0);
	f = dcast_io_file_add(io, fd, path);
	fill(src, sizeof(src), 7);
	CHECK_ERR(dcast_io_write(io, f, src, sizeof(src), 0, DCAST_IO_NO_BUF, 42), 0);
	pfd.fd = dcast_io_event_fd(io);
	CHECK(pfd.fd >= 0);
	CHECK(io_threads() == threads);
	got = dcast_io_wait(io, 0, &d, 1); /* pushes it to the kernel */
	if (got == 0) {
		CHECK(poll(&pfd, 1, 30000) == 1 && (pfd.revents & POLLIN));
		got = dcast_io_wait(io, 0, &d, 1);
	}
	CHECK(got == 1 && d.tag == 42 && d.err == 0 && d.bytes == sizeof(src));
	dcast_io_close(&io);
	CHECK(io_threads() == 0);
	close(fd);
}

static void run_all(const char *label)
{
	fprintf(stderr, "-- %s\n", label);
	test_async_roundtrip(8, 1ul << 30);
	test_async_roundtrip(3, 1000); /* every transfer comes back short */
	test_fixed_buffers();
	test_remove_beside();
	test_errors();
	test_short_write();
}

int main(void)
{
	dcast_io *io;

	REQUIRE(mkdtemp(dir));
	unsetenv("DELTACAST_IO_URING");
	REQUIRE(dcast_io_open(&io, 4) == 0);
	fprintf(stderr, "io_uring path available: %d\n", dcast_io_uses_uring(io));
	test_event_fd(dcast_io_uses_uring(io) ? 0 : 4);
	dcast_io_close(&io);
	run_all("default path");
	setenv("DELTACAST_IO_URING", "0", 1);
	REQUIRE(dcast_io_open(&io, 4) == 0);
	CHECK(dcast_io_uses_uring(io) == 0);
	CHECK(dcast_io_event_fd(io) == -1 && io_threads() == 0); /* no thread before the first submit */
	dcast_io_close(&io);
	test_event_fd(4);
	run_all("plain path");
	check_remove_dir(dir);
	return check_done("test_io");
}
