/* bench_redis: the Redis pub/sub baseline of scripts/bench_e2e.sh, a tiny
 * client speaking RESP (the Redis protocol) over a socket to a redis-server
 * on 127.0.0.1 (no libhiredis, so `make test` builds it on any machine).
 *
 *   bench_redis pub PORT CHANNEL VERSION SUBSCRIBERS FILE
 *       publishes FILE as messages of at most 1 MiB, each a 32-byte chunk
 *       header (below) and a slice of the file, waiting for each PUBLISH
 *       reply; fails unless every reply counts SUBSCRIBERS receivers.
 *   bench_redis sub PORT CHANNEL DIR UNTIL
 *       subscribes, prints "subscribed", then reassembles each version's
 *       chunks into DIR/vVERSION.bin (written to a temporary name, renamed)
 *       and prints "version V file PATH bytes B wire W" (W: socket bytes read
 *       for that version, RESP framing included); exits 0 after UNTIL.
 *
 * Chunk header, little-endian: u32 magic "DCRB", u32 0, u64 version,
 * u64 offset, u64 file bytes.  Chunks of one version arrive in order on one
 * connection (Redis keeps a publisher's order), so a version is complete
 * when its bytes are all there.  Bad input is an error naming what was
 * wrong; exit 1. */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define CHUNK_BYTES (1u << 20)
#define HDR_BYTES 32
#define MAGIC 0x42524344u /* "DCRB" */
#define MAX_FILE_BYTES (16ull << 30)
#define READ_BUF_BYTES (256u << 10)
#define LINE_BYTES 128

typedef struct reader {
	int fd;
	size_t pos, len;
	uint64_t wire_bytes; /* bytes read from the socket so far */
	char buf[READ_BUF_BYTES];
} reader;

typedef struct chunk_hdr {
	uint64_t version, offset, total;
} chunk_hdr;

static int fail(const char *what)
{
	fprintf(stderr, "bench_redis: %s\n", what);
	return -1;
}

static int fail_errno(const char *what)
{
	fprintf(stderr, "bench_redis: %s: %s\n", what, strerror(errno));
	return -1;
}

static int redis_connect(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		fail_errno("connect to redis");
		if (fd >= 0)
			close(fd);
		return -1;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

static int write_all(int fd, struct iovec *iov, int n)
{
	while (n > 0) {
		ssize_t w = writev(fd, iov, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return fail_errno("write to redis");
		for (; n > 0 && (size_t)w >= iov->iov_len; iov++, n--)
			w -= (ssize_t)iov->iov_len;
		if (n > 0) {
			iov->iov_base = (char *)iov->iov_base + w;
			iov->iov_len -= (size_t)w;
		}
	}
	return 0;
}

/* Refill the buffer; -1 on EOF or error. */
static int rd_fill(reader *r)
{
	ssize_t n;

	do
		n = read(r->fd, r->buf, sizeof(r->buf));
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return fail_errno("read from redis");
	if (n == 0)
		return fail("redis closed the connection");
	r->pos = 0;
	r->len = (size_t)n;
	r->wire_bytes += (uint64_t)n;
	return 0;
}

/* Copy n bytes to dst (NULL: skip them). */
static int rd_exact(reader *r, char *dst, size_t n)
{
	while (n) {
		size_t k;
		if (r->pos == r->len && rd_fill(r))
			return -1;
		k = r->len - r->pos < n ? r->len - r->pos : n;
		if (dst) {
			memcpy(dst, r->buf + r->pos, k);
			dst += k;
		}
		r->pos += k;
		n -= k;
	}
	return 0;
}

/* One CRLF-terminated line, without the CRLF, into line[LINE_BYTES]. */
static int rd_line(reader *r, char *line)
{
	size_t n = 0;

	for (;;) {
		if (r->pos == r->len && rd_fill(r))
			return -1;
		char c = r->buf[r->pos++];
		if (c == '\n' && n && line[n - 1] == '\r') {
			line[n - 1] = 0;
			return 0;
		}
		if (n == LINE_BYTES - 1)
			return fail("RESP line too long");
		line[n++] = c;
	}
}

/* A line "<type><integer>"; "-ERR ..." replies are reported as errors. */
static int rd_int(reader *r, char type, long long *v)
{
	char line[LINE_BYTES], *end;

	if (rd_line(r, line))
		return -1;
	if (line[0] == '-') {
		fprintf(stderr, "bench_redis: redis error: %s\n", line + 1);
		return -1;
	}
	*v = strtoll(line + 1, &end, 10);
	if (line[0] != type || end == line + 1 || *end) {
		fprintf(stderr, "bench_redis: expected RESP '%c' line, got \"%s\"\n", type, line);
		return -1;
	}
	return 0;
}

/* A bulk string of at most cap bytes into dst; its length in *n. */
static int rd_bulk(reader *r, char *dst, size_t cap, size_t *n)
{
	long long len;

	if (rd_int(r, '$', &len))
		return -1;
	if (len < 0 || (unsigned long long)len > cap)
		return fail("RESP bulk string longer than this field allows");
	*n = (size_t)len;
	return rd_exact(r, dst, *n) || rd_exact(r, NULL, 2) ? -1 : 0;
}

static uint64_t get_u64(const unsigned char *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return le64toh(v);
}

static void put_u64(unsigned char *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, 8);
}

static void put_hdr(unsigned char *h, const chunk_hdr *c)
{
	put_u64(h, MAGIC);
	put_u64(h + 8, c->version);
	put_u64(h + 16, c->offset);
	put_u64(h + 24, c->total);
}

static int get_hdr(const unsigned char *h, size_t n, chunk_hdr *c)
{
	if (n < HDR_BYTES || get_u64(h) != MAGIC)
		return fail("message is not a bench_redis chunk (bad magic or short)");
	*c = (chunk_hdr){get_u64(h + 8), get_u64(h + 16), get_u64(h + 24)};
	if (c->total > MAX_FILE_BYTES || c->offset > c->total || n - HDR_BYTES > c->total - c->offset)
		return fail("chunk header out of range (offset, size or file bytes)");
	return 0;
}

/* PUBLISH one chunk and check that `subscribers` clients received it. */
static int publish_chunk(int fd, reader *r, const char *channel, const chunk_hdr *c,
			 const void *data, size_t n, long long subscribers)
{
	unsigned char hdr[HDR_BYTES];
	char cmd[LINE_BYTES * 2];
	long long got;
	int k = snprintf(cmd, sizeof(cmd), "*3\r\n$7\r\nPUBLISH\r\n$%zu\r\n%s\r\n$%zu\r\n", strlen(channel),
			 channel, n + HDR_BYTES);
	struct iovec iov[4] = {{cmd, (size_t)k}, {hdr, HDR_BYTES}, {(void *)data, n}, {"\r\n", 2}};

	put_hdr(hdr, c);
	if (write_all(fd, iov, 4) || rd_int(r, ':', &got))
		return -1;
	if (got != subscribers) {
		fprintf(stderr, "bench_redis: chunk at %" PRIu64 " reached %lld subscribers, not %lld\n",
			c->offset, got, subscribers);
		return -1;
	}
	return 0;
}

static int publish_file(int port, const char *channel, chunk_hdr *c, const unsigned char *data,
			long long subscribers)
{
	static reader r;
	int rc;

	if ((r.fd = redis_connect(port)) < 0)
		return -1;
	do { /* an empty file is one empty chunk */
		size_t n = c->total - c->offset < CHUNK_BYTES ? c->total - c->offset : CHUNK_BYTES;
		rc = publish_chunk(r.fd, &r, channel, c, n ? data + c->offset : NULL, n, subscribers);
		c->offset += n;
	} while (!rc && c->offset < c->total);
	close(r.fd);
	return rc;
}

static int cmd_pub(int port, const char *channel, uint64_t version, long long subscribers, const char *path)
{
	struct stat st;
	int fd = open(path, O_RDONLY), rc = -1;
	unsigned char *map = NULL;
	chunk_hdr c = {.version = version};

	if (fd < 0 || fstat(fd, &st)) {
		fail_errno(path);
		goto out;
	}
	c.total = (uint64_t)st.st_size;
	if (c.total && (map = mmap(NULL, c.total, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED) {
		map = NULL;
		fail_errno("mmap");
		goto out;
	}
	rc = publish_file(port, channel, &c, map, subscribers);
out:
	if (map)
		munmap(map, c.total);
	if (fd >= 0)
		close(fd);
	return rc;
}

static int subscribe(int fd, reader *r, const char *channel)
{
	char cmd[LINE_BYTES * 2], kind[16];
	int k = snprintf(cmd, sizeof(cmd), "*2\r\n$9\r\nSUBSCRIBE\r\n$%zu\r\n%s\r\n", strlen(channel), channel);
	struct iovec iov = {cmd, (size_t)k};
	long long n;
	size_t len;

	if (write_all(fd, &iov, 1) || rd_int(r, '*', &n) || rd_bulk(r, kind, sizeof(kind), &len))
		return -1;
	if (n != 3 || len != 9 || memcmp(kind, "subscribe", 9))
		return fail("SUBSCRIBE was not confirmed");
	if (rd_bulk(r, cmd, sizeof(cmd), &len) || rd_int(r, ':', &n))
		return -1;
	return 0;
}

/* One pub/sub push: *3 "message" CHANNEL PAYLOAD; the payload into msg. */
static int read_message(reader *r, unsigned char *msg, size_t *n)
{
	char kind[16], chan[LINE_BYTES];
	long long parts;
	size_t len;

	if (rd_int(r, '*', &parts) || rd_bulk(r, kind, sizeof(kind), &len))
		return -1;
	if (parts != 3 || len != 7 || memcmp(kind, "message", 7))
		return fail("unexpected push from redis (not a 3-part \"message\")");
	return rd_bulk(r, chan, sizeof(chan), &len) || rd_bulk(r, (char *)msg, HDR_BYTES + CHUNK_BYTES, n) ? -1 : 0;
}

static int write_file(const char *dir, uint64_t version, const unsigned char *data, uint64_t n, char *path)
{
	char tmp[4096];
	int fd;

	if (snprintf(path, 4096, "%s/v%" PRIu64 ".bin", dir, version) >= 4096 ||
	    snprintf(tmp, sizeof(tmp), "%s/v%" PRIu64 ".tmp", dir, version) >= (int)sizeof(tmp))
		return fail("DIR is too long");
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0)
		return fail_errno(tmp);
	for (uint64_t off = 0; off < n;) {
		ssize_t w = write(fd, data + off, n - off);
		if (w <= 0) {
			close(fd);
			return fail_errno(tmp);
		}
		off += (uint64_t)w;
	}
	if (close(fd) || rename(tmp, path))
		return fail_errno(path);
	return 0;
}

/* Reassemble one version from its chunks into *file (grown as needed). */
static int receive_version(reader *r, unsigned char *msg, unsigned char **file, uint64_t *cap, chunk_hdr *v)
{
	uint64_t have = 0;
	size_t n;
	chunk_hdr c;

	do {
		if (read_message(r, msg, &n) || get_hdr(msg, n, &c))
			return -1;
		if (have == 0)
			*v = c;
		if (c.version != v->version || c.total != v->total || c.offset != have)
			return fail("chunk out of order (version, file size or offset differs)");
		if (c.total > *cap) {
			unsigned char *p = realloc(*file, c.total);
			if (!p)
				return fail("out of memory for a version");
			*file = p;
			*cap = c.total;
		}
		memcpy(*file + have, msg + HDR_BYTES, n - HDR_BYTES);
		have += n - HDR_BYTES;
	} while (have < v->total);
	return 0;
}

static int cmd_sub(int port, const char *channel, const char *dir, uint64_t until)
{
	static reader r;
	unsigned char *msg = malloc(HDR_BYTES + CHUNK_BYTES), *file = NULL;
	uint64_t cap = 0, wire0;
	chunk_hdr v = {0};
	char path[4096];
	int rc = -1;

	if (!msg || (r.fd = redis_connect(port)) < 0 || subscribe(r.fd, &r, channel))
		goto out;
	printf("subscribed %s\n", channel);
	fflush(stdout);
	do {
		wire0 = r.wire_bytes - (r.len - r.pos);
		if (receive_version(&r, msg, &file, &cap, &v) || write_file(dir, v.version, file, v.total, path))
			goto out;
		printf("version %" PRIu64 " file %s bytes %" PRIu64 " wire %" PRIu64 "\n", v.version, path, v.total,
		       r.wire_bytes - (r.len - r.pos) - wire0);
		fflush(stdout);
	} while (v.version < until);
	rc = 0;
out:
	if (r.fd > 0)
		close(r.fd);
	free(msg);
	free(file);
	return rc;
}

static int parse_u64(const char *s, uint64_t *v)
{
	char *end;

	errno = 0;
	*v = strtoull(s, &end, 10);
	return !*s || *end || errno ? fail("argument is not an unsigned integer") : 0;
}

int main(int argc, char **argv)
{
	uint64_t port, a, b;

	if (argc == 7 && !strcmp(argv[1], "pub") && !parse_u64(argv[2], &port) && !parse_u64(argv[4], &a) &&
	    !parse_u64(argv[5], &b))
		return cmd_pub((int)port, argv[3], a, (long long)b, argv[6]) ? 1 : 0;
	if (argc == 6 && !strcmp(argv[1], "sub") && !parse_u64(argv[2], &port) && !parse_u64(argv[5], &a))
		return cmd_sub((int)port, argv[3], argv[4], a) ? 1 : 0;
	fprintf(stderr, "usage: bench_redis pub PORT CHANNEL VERSION SUBSCRIBERS FILE\n"
			"       bench_redis sub PORT CHANNEL DIR UNTIL\n");
	return 2;
}
