/* The durable record format (dcast_reclog.h): encode a prefix, read a
 * record back and check it, scan a file with a torn-tail cut, and the
 * directory fsyncs that make created and removed files durable. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include "dcast_common.h"
#include "dcast_reclog.h"
#include "deltacast/codec.h"
#include "deltacast/schema.h"
#include "dcast_bytes.h"
#include "dcast_io.h"

#define REC_MAGIC (0x00524344u | (uint32_t)DCAST_REC_FORMAT << 24) /* "DCR3" */
#define REC_FAMILY(m) (((m) & 0xffffffu) == (REC_MAGIC & 0xffffffu) && \
		       ((m) >> 24) >= '0' && ((m) >> 24) <= '9')

static uint64_t prefix_checksum(const uint8_t *p, const void *hdr, size_t hdr_len)
{
	return XXH3_64bits_withSeed(hdr, hdr_len, XXH3_64bits(p, 32));
}

void dcast_rec_encode(uint8_t *p, const dcast_rec *r, const void *hdr)
{
	dcast_put_le32(p, REC_MAGIC);
	p[4] = (uint8_t)r->kind;
	p[5] = (uint8_t)(r->kind >> 8);
	p[6] = p[7] = 0;
	dcast_put_le32(p + 8, r->hdr_len);
	dcast_put_le32(p + 12, r->payload_len);
	dcast_put_le64(p + 16, r->version);
	dcast_put_le64(p + 24, r->payload_sum);
	dcast_put_le64(p + 32, prefix_checksum(p, hdr, r->hdr_len));
}

void dcast_rec_reader_free(dcast_rec_reader *rd)
{
	if (!rd)
		return;
	free(rd->buf);
	rd->buf = NULL;
	rd->cap = 0;
}

static int reserve(dcast_rec_reader *rd, size_t n)
{
	uint8_t *p;

	if (n <= rd->cap)
		return 0;
	if (!(p = realloc(rd->buf, n)))
		return dcast_fail(DCAST_ENOMEM, "record file: %zu-byte record buffer", n);
	rd->buf = p;
	rd->cap = n;
	return 0;
}

static void decode(const uint8_t *p, dcast_rec *r)
{
	r->kind = (uint16_t)(p[4] | p[5] << 8);
	r->hdr_len = dcast_get_le32(p + 8);
	r->payload_len = dcast_get_le32(p + 12);
	r->version = dcast_get_le64(p + 16);
	r->payload_sum = dcast_get_le64(p + 24);
}

#define WHY(rc, ...) (snprintf(why, why_cap, __VA_ARGS__), (rc))

/* The fixed fields: family, lengths within limits and file, and for this
 * format kind and flags (another format's are its own: only its checksum
 * tells whether it is whole). */
static int prefix_check(const dcast_rec_reader *rd, const uint8_t *p, uint64_t off,
			const dcast_rec *r, char *why, size_t why_cap)
{
	uint64_t left = rd->size - off - DCAST_REC_PREFIX;
	uint32_t magic = dcast_get_le32(p);

	if (!REC_FAMILY(magic) || (magic == REC_MAGIC && (p[6] || p[7] || r->kind < 1 ||
							  r->kind > rd->max_kind)))
		return WHY(DCAST_ECORRUPT, "bad record magic/kind at offset %llu",
			   (unsigned long long)off);
	if (r->hdr_len > DCAST_MAX_HEADER_BYTES || r->payload_len > DCAST_MAX_CHUNK_BYTES)
		return WHY(DCAST_ECORRUPT, "record lengths over limits at offset %llu",
			   (unsigned long long)off);
	if ((uint64_t)r->hdr_len + r->payload_len > left)
		return WHY(DCAST_ECORRUPT, "torn record at offset %llu (%llu bytes missing)",
			   (unsigned long long)off,
			   (unsigned long long)(r->hdr_len + (uint64_t)r->payload_len - left));
	return 0;
}

int dcast_rec_read(dcast_rec_reader *rd, uint64_t off, int payload, dcast_rec *r, char *why,
		   size_t why_cap)
{
	uint8_t p[DCAST_REC_PREFIX];
	size_t len;
	int rc;

	if (off > rd->size || rd->size - off < DCAST_REC_PREFIX)
		return WHY(DCAST_ECORRUPT, "torn record prefix at offset %llu", (unsigned long long)off);
	if ((rc = dcast_pread_full(rd->fd, p, sizeof(p), off, "record file")))
		return WHY(rc, "%s", dcast_last_error());
	decode(p, r);
	if ((rc = prefix_check(rd, p, off, r, why, why_cap)))
		return rc;
	len = r->hdr_len + (payload ? (size_t)r->payload_len : 0);
	if ((rc = reserve(rd, len + 1)) ||
	    (rc = dcast_pread_full(rd->fd, rd->buf, len, off + sizeof(p), "record file")))
		return WHY(rc, "%s", dcast_last_error());
	if (prefix_checksum(p, rd->buf, r->hdr_len) != dcast_get_le64(p + 32))
		return WHY(DCAST_ECHECKSUM, "record checksum mismatch at offset %llu",
			   (unsigned long long)off);
	if (dcast_get_le32(p) != REC_MAGIC) /* whole, so written that way: not damage */
		return WHY(DCAST_EPROTO_VERSION, "a whole record of format %c at offset %llu (this "
			   "build reads format %c)", (char)p[3], (unsigned long long)off,
			   DCAST_REC_FORMAT);
	if (payload && dcast_checksum(rd->buf + r->hdr_len, r->payload_len) != r->payload_sum)
		return WHY(DCAST_ECHECKSUM, "record payload checksum mismatch at offset %llu",
			   (unsigned long long)off);
	return 0;
}

int dcast_rec_scan(dcast_rec_reader *rd, int payload, dcast_rec_fn fn, void *ctx,
		   dcast_rec_scan_out *out)
{
	uint64_t off = 0;
	dcast_rec r;

	memset(out, 0, sizeof(*out));
	while (off < rd->size) {
		int rc = dcast_rec_read(rd, off, payload, &r, out->why, sizeof(out->why));
		int closes;

		if (rc == DCAST_ENOMEM || rc == DCAST_EIO || rc == DCAST_EPROTO_VERSION)
			return rc;
		closes = rc ? -1 : fn(ctx, off, &r, rd->buf, payload ? rd->buf + r.hdr_len : NULL,
				      out->why, sizeof(out->why));
		if (closes < 0) {
			out->bad_off = off;
			return 0;
		}
		off += dcast_rec_bytes(&r);
		if (closes) {
			out->good_end = off;
			out->units++;
		}
	}
	out->bad_off = rd->size;
	out->why[0] = '\0';
	return 0;
}

static int msg_fits(const dcast_rec *r, const dcast_msg *m)
{
	static const uint32_t holds[] = {0, 0, DCAST_MSG_MANIFEST, DCAST_MSG_CHUNK, DCAST_MSG_COMMIT};
	uint64_t v = m->type == DCAST_MSG_CHUNK ? m->u.chunk.version : m->u.commit.version;

	if (r->kind >= DCAST_ARRAY_LEN(holds) || m->type != holds[r->kind])
		return dcast_fail(DCAST_ECORRUPT, "record of kind %u holds a %s", r->kind,
				  dcast_msg_type_name((int)m->type));
	if (r->kind != DCAST_REC_MANIFEST && v != r->version)
		return dcast_fail(DCAST_ECORRUPT, "%s of version %llu in a record of version %llu",
				  dcast_msg_type_name((int)m->type), (unsigned long long)v,
				  (unsigned long long)r->version);
	return 0;
}

int dcast_rec_msg(const dcast_rec *r, const uint8_t *hdr, dcast_msg *m)
{
	int err = dcast_msg_decode_stored(hdr, r->hdr_len, m);

	if (!err && (err = msg_fits(r, m)))
		dcast_msg_free(m);
	return err;
}

int dcast_rec_file_name(const dcast_rec *r, const uint8_t *hdr, char *name)
{
	if (r->kind != DCAST_REC_FILE || r->payload_len || r->hdr_len == 0 || r->hdr_len > DCAST_MAX_NAME ||
	    memchr(hdr, 0, r->hdr_len))
		return dcast_fail(DCAST_ECORRUPT, "not a FILE record with a model name");
	memcpy(name, hdr, r->hdr_len);
	name[r->hdr_len] = '\0';
	return 0;
}

uint64_t dcast_rec_next_magic(int fd, uint64_t off, uint64_t size)
{
	static const uint8_t magic[4] = {'D', 'C', 'R', DCAST_REC_FORMAT};
	uint8_t buf[1 << 14];

	while (off < size) {
		size_t want = size - off < sizeof(buf) ? (size_t)(size - off) : sizeof(buf);
		ssize_t n = pread(fd, buf, want, (off_t)off);
		const uint8_t *hit = n >= 4 ? memmem(buf, (size_t)n, magic, 4) : NULL;

		if (hit)
			return off + (uint64_t)(hit - buf);
		if (n < 4)
			return size;
		off += (uint64_t)n - 3;
	}
	return size;
}

int dcast_fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int rc = fd >= 0 ? fsync(fd) : -1;

	if (rc)
		rc = dcast_fail(DCAST_EIO, "fsync directory '%s': %s", dir, strerror(errno));
	if (fd >= 0)
		close(fd);
	return rc;
}

int dcast_fsync_parent(const char *path)
{
	const char *slash = strrchr(path, '/');
	char dir[4096];

	if (!slash)
		return dcast_fsync_dir(".");
	snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
	return dcast_fsync_dir(slash == path ? "/" : dir);
}

int dcast_mkdir(const char *dir)
{
	if (mkdir(dir, 0755) == 0 || errno == EEXIST)
		return 0;
	return dcast_fail(DCAST_EIO, "mkdir '%s': %s", dir, strerror(errno));
}
