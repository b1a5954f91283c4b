/* bench_fs: the shared-filesystem checkpoint baseline of scripts/bench_e2e.sh
 * (a trainer saves the whole checkpoint to a shared directory, every worker
 * reloads it, as slime's disk path and prime-rl do).
 *
 *   bench_fs put SRC DST   writes SRC's bytes to a temporary file beside DST,
 *                          fsyncs it, renames it to DST and fsyncs the folder
 *   bench_fs load PATH     reads PATH whole into memory; prints
 *                          "loaded EPOCH bytes B xxh3 H" (EPOCH: wall clock
 *                          when the read finished, before hashing)
 *   bench_fs hash PATH     prints "bytes B xxh3 H" of PATH
 *
 * H is XXH3-64 (seed 0) in hex; exit 1 with a message on any I/O error. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define IO_BYTES (4u << 20)

static int fail_errno(const char *what)
{
	fprintf(stderr, "bench_fs: %s: %s\n", what, strerror(errno));
	return 1;
}

/* Read the whole file at path into a new buffer (caller frees). */
static int read_whole(const char *path, unsigned char **data, uint64_t *size)
{
	struct stat st;
	int fd = open(path, O_RDONLY);
	uint64_t off = 0;

	*data = NULL;
	if (fd < 0 || fstat(fd, &st)) {
		if (fd >= 0)
			close(fd);
		return fail_errno(path);
	}
	*size = (uint64_t)st.st_size;
	if (!(*data = malloc(*size ? *size : 1))) {
		close(fd);
		fprintf(stderr, "bench_fs: %s: out of memory for %" PRIu64 " bytes\n", path, *size);
		return 1;
	}
	while (off < *size) {
		ssize_t r = read(fd, *data + off, *size - off < IO_BYTES ? *size - off : IO_BYTES);
		if (r <= 0) {
			if (r == 0)
				errno = EIO; /* the file shrank under us */
			close(fd);
			return fail_errno(path);
		}
		off += (uint64_t)r;
	}
	close(fd);
	return 0;
}

static int write_all(int fd, const unsigned char *data, uint64_t size)
{
	for (uint64_t off = 0; off < size;) {
		ssize_t w = write(fd, data + off, size - off < IO_BYTES ? size - off : IO_BYTES);
		if (w <= 0)
			return -1;
		off += (uint64_t)w;
	}
	return 0;
}

static int fsync_dir_of(const char *path)
{
	char copy[4096];
	int fd, rc;

	snprintf(copy, sizeof(copy), "%s", path);
	if ((fd = open(dirname(copy), O_RDONLY | O_DIRECTORY)) < 0)
		return -1;
	rc = fsync(fd);
	close(fd);
	return rc;
}

static int cmd_put(const char *src, const char *dst)
{
	char tmp[4096];
	unsigned char *data;
	uint64_t size;
	int fd, rc;

	if (read_whole(src, &data, &size))
		return 1;
	if (snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", dst) >= (int)sizeof(tmp) || (fd = mkstemp(tmp)) < 0) {
		free(data);
		return fail_errno(dst);
	}
	rc = write_all(fd, data, size) || fsync(fd) || fchmod(fd, 0644);
	rc = close(fd) || rc || rename(tmp, dst) || fsync_dir_of(dst);
	free(data);
	if (rc) {
		fail_errno(dst);
		unlink(tmp);
	}
	return rc;
}

static int cmd_load(const char *path, int stamp)
{
	unsigned char *data;
	uint64_t size;
	struct timespec ts;

	if (read_whole(path, &data, &size))
		return 1;
	clock_gettime(CLOCK_REALTIME, &ts);
	if (stamp)
		printf("loaded %lld.%06ld ", (long long)ts.tv_sec, ts.tv_nsec / 1000);
	printf("bytes %" PRIu64 " xxh3 %016llx\n", size, (unsigned long long)XXH3_64bits(data, size));
	free(data);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "put"))
		return cmd_put(argv[2], argv[3]);
	if (argc == 3 && (!strcmp(argv[1], "load") || !strcmp(argv[1], "hash")))
		return cmd_load(argv[2], !strcmp(argv[1], "load"));
	fprintf(stderr, "usage: bench_fs put SRC DST | bench_fs load PATH | bench_fs hash PATH\n");
	return 2;
}
