/* common/reclog.c, the durable record format (dcast_reclog.h), on real
 * files: records encoded with dcast_rec_encode and written with write()
 * read back equal (with and without payloads); the on-disk layout matches
 * the header's table, its checksum recomputed here with xxhash; a scan cuts
 * after the last record its callback says closes a unit; a file cut at any
 * offset scans back to the last whole unit, without error and without a
 * callback for a partial record; a flipped bit stops the scan at the record
 * that holds it (payload bits only when payloads are read: by design, the
 * prefix covers the header, a payload is checked by its sum); a whole record
 * of another format is DCAST_EPROTO_VERSION, the same bytes with a stale
 * checksum damage; over-limit lengths, bad kinds and flags are corrupt,
 * without a large buffer; dcast_rec_next_magic resynchronises; the
 * directory helpers.  DCAST_TEST_SEED=n picks another random file. */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include "dcast_reclog.h"
#include "deltacast/codec.h"
#include "deltacast/schema.h"
#include "check.h"
#include "old_format.h"

#define N_RECS 50
#define MAX_KIND 4
#define SMALL_TAIL 4        /* the last records stay small: every cut inside them is tried */
#define PREFIX DCAST_REC_PREFIX

static char root[] = "/tmp/dcast_test_reclog_XXXXXX";
static char path[300];
static int fd = -1;
static uint8_t *img;                 /* the file's bytes as written */
static uint64_t size;                /* and its size */
static uint64_t start[N_RECS + 1];   /* record offsets; start[N_RECS] == size */
static dcast_rec recs[N_RECS];
static dcast_rec_reader rd;
static uint64_t rng;

static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static uint32_t below(uint32_t n)
{
	return (uint32_t)(rnd() % n);
}

/* Little-endian field of n bytes at p, read and written independently. */
static uint64_t le(const uint8_t *p, int n)
{
	uint64_t v = 0;

	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* The prefix checksum as the header documents it. */
static uint64_t doc_checksum(const uint8_t *p, const void *hdr, size_t hdr_len)
{
	return XXH3_64bits_withSeed(hdr, hdr_len, XXH3_64bits(p, 32));
}

static void pw(int f, const void *p, size_t n, uint64_t off)
{
	REQUIRE(pwrite(f, p, n, (off_t)off) == (ssize_t)n);
}

static void write_all(int f, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = write(f, p, n);

		REQUIRE(w > 0 || (w < 0 && errno == EINTR));
		if (w > 0)
			p += w, n -= (size_t)w;
	}
}

static int same_rec(const dcast_rec *a, const dcast_rec *b)
{
	return a->kind == b->kind && a->hdr_len == b->hdr_len && a->payload_len == b->payload_len &&
	       a->version == b->version && a->payload_sum == b->payload_sum;
}

/* Index of the record that holds byte off; the count of whole records
 * before a cut when off is a cut (start[i] <= off < start[i + 1]). */
static unsigned record_at(uint64_t off)
{
	unsigned i = 0;

	while (i < N_RECS && start[i + 1] <= off)
		i++;
	return i;
}

/* ---- the file ---------------------------------------------------------- */

/* Random header and payload for record i in img, then its prefix. */
static void fill_record(unsigned i)
{
	uint8_t *p = img + start[i], *hdr = p + PREFIX, *pl = hdr + recs[i].hdr_len;

	for (uint8_t *b = hdr; b < pl + recs[i].payload_len; b++)
		*b = (uint8_t)rnd();
	recs[i].payload_sum = dcast_checksum(pl, recs[i].payload_len);
	dcast_rec_encode(p, &recs[i], hdr);
}

/* How many times "DCR3" occurs in img. */
static unsigned count_magic(void)
{
	unsigned n = 0;

	for (const uint8_t *p = img; (p = memmem(p, size - (uint64_t)(p - img), "DCR3", 4)); p++)
		n++;
	return n;
}

/* N_RECS random records in img, none with "DCR3" in its random bytes (so
 * that dcast_rec_next_magic has exactly one answer). */
static void make_records(void)
{
	do {
		uint64_t off = 0;

		for (unsigned i = 0; i < N_RECS; i++) {
			recs[i].kind = (uint16_t)(1 + below(MAX_KIND));
			recs[i].hdr_len = below(301);
			recs[i].payload_len = below(i < N_RECS - SMALL_TAIL ? (64u << 10) + 1 : 1025);
			recs[i].version = rnd();
			start[i] = off;
			off += dcast_rec_bytes(&recs[i]);
		}
		start[N_RECS] = size = off;
		free(img);
		REQUIRE((img = malloc(size)));
		for (unsigned i = 0; i < N_RECS; i++)
			fill_record(i);
	} while (count_magic() != N_RECS);
}

/* Write the records as a writer does: prefix, header, payload. */
static void write_file(void)
{
	int f;

	snprintf(path, sizeof(path), "%s/records", root);
	REQUIRE((f = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644)) >= 0);
	for (unsigned i = 0; i < N_RECS; i++) {
		write_all(f, img + start[i], PREFIX);
		write_all(f, img + start[i] + PREFIX, recs[i].hdr_len);
		write_all(f, img + start[i] + PREFIX + recs[i].hdr_len, recs[i].payload_len);
	}
	REQUIRE(close(f) == 0);
	REQUIRE((fd = open(path, O_RDWR)) >= 0);
	rd = (dcast_rec_reader){.fd = fd, .size = size, .max_kind = MAX_KIND};
}

/* Put back the file's bytes from off on (after a cut). */
static void restore_from(uint64_t off)
{
	struct stat st;

	pw(fd, img + off, size - off, off);
	REQUIRE(fstat(fd, &st) == 0 && (uint64_t)st.st_size == size);
}

/* ---- scanning ---------------------------------------------------------- */

struct scan_ctx {
	uint64_t cut;      /* rd.size of the scan */
	int payload;       /* the scan reads payloads */
	unsigned refuse;   /* 1 + index of a record to refuse, 0: none */
	unsigned calls, wrong, partial;
};

/* Every 3rd record closes a unit; each record must be the one written. */
static int on_rec(void *ctx, uint64_t off, const dcast_rec *r, const uint8_t *hdr,
		  const uint8_t *payload, char *why, size_t why_cap)
{
	struct scan_ctx *c = ctx;
	unsigned i = c->calls++;
	const uint8_t *want = img + off + PREFIX;

	if (off + dcast_rec_bytes(r) > c->cut)
		c->partial++;
	if (i >= N_RECS || off != start[i] || !same_rec(r, &recs[i]))
		return c->wrong++, -1;
	if (memcmp(hdr, want, r->hdr_len) ||
	    (c->payload ? !payload || memcmp(payload, want + r->hdr_len, r->payload_len)
			: payload != NULL))
		c->wrong++;
	if (c->refuse == i + 1)
		return snprintf(why, why_cap, "refused record %u", i), -1;
	return i % 3 == 2;
}

/* Scan the first cut bytes, expecting records 0 .. whole-1 to read back and
 * the scan to stop at start[whole].  Returns 1 when all checks held. */
static int scan_expect(int mode, uint64_t cut, unsigned whole, dcast_rec_scan_out *out)
{
	struct scan_ctx c = {.cut = cut, .payload = mode};
	int before = check_failures;

	rd.size = cut;
	CHECK_ERR(dcast_rec_scan(&rd, mode, on_rec, &c, out), 0);
	rd.size = size;
	CHECK(c.calls == whole && c.wrong == 0 && c.partial == 0);
	CHECK(out->units == whole / 3 && out->good_end == start[whole / 3 * 3]);
	CHECK(out->bad_off == start[whole]);
	CHECK((out->why[0] == '\0') == (start[whole] == cut));
	if (check_failures != before)
		fprintf(stderr, "  (scan of %llu bytes, payload=%d: %s)\n", (unsigned long long)cut,
			mode, out->why);
	return check_failures == before;
}

/* ---- the cases --------------------------------------------------------- */

/* 1. Every record reads back as written, with and without its payload. */
static void test_roundtrip(void)
{
	struct stat st;

	for (int mode = 0; mode < 2; mode++) {
		uint64_t total = 0;

		for (unsigned i = 0; i < N_RECS; i++) {
			dcast_rec r;
			char why[256] = "";
			size_t n = recs[i].hdr_len + (mode ? (size_t)recs[i].payload_len : 0);
			int rc = dcast_rec_read(&rd, start[i], mode, &r, why, sizeof(why));

			CHECK_ERR(rc, 0);
			CHECK(rc == 0 && same_rec(&r, &recs[i]));
			CHECK(rc == 0 && memcmp(rd.buf, img + start[i] + PREFIX, n) == 0);
			total += rc ? 0 : dcast_rec_bytes(&r);
		}
		CHECK(fstat(fd, &st) == 0 && (uint64_t)st.st_size == total && total == size);
	}
}

/* 2a. One record's prefix, field by field, against the table. */
static void check_layout(const uint8_t *f, unsigned i)
{
	const uint8_t *p = f + start[i], *hdr = p + PREFIX;
	const dcast_rec *r = &recs[i];

	CHECK(p[0] == 'D' && p[1] == 'C' && p[2] == 'R' && p[3] == '3');
	CHECK(le(p + 4, 2) == r->kind && le(p + 6, 2) == 0);
	CHECK(le(p + 8, 4) == r->hdr_len && le(p + 12, 4) == r->payload_len);
	CHECK(le(p + 16, 8) == r->version);
	CHECK(le(p + 24, 8) == dcast_checksum(hdr + r->hdr_len, r->payload_len));
	CHECK(le(p + 32, 8) == XXH3_64bits_withSeed(hdr, r->hdr_len, XXH3_64bits(p, 32)));
}

/* 2b. Known values: every byte of a prefix, and its checksum. */
static void check_layout_bytes(void)
{
	static const uint8_t want[32] = {
		'D', 'C', 'R', '3', 0x03, 0x02, 0, 0, 5, 0, 0, 0, 0x04, 0x03, 0x02, 0x01,
		0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
		0x00, 0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x99};
	dcast_rec r = {.kind = 0x0203, .hdr_len = 5, .payload_len = 0x01020304,
		       .version = 0x1122334455667788ull, .payload_sum = 0x99aabbccddeeff00ull};
	uint8_t p[PREFIX];

	memset(p, 0xa5, sizeof(p));
	dcast_rec_encode(p, &r, "hello");
	CHECK(memcmp(p, want, sizeof(want)) == 0);
	CHECK(le(p + 32, 8) == XXH3_64bits_withSeed("hello", 5, XXH3_64bits(want, 32)));
	r.hdr_len = 0;
	dcast_rec_encode(p, &r, "hello");
	CHECK(le(p + 8, 4) == 0 && le(p + 32, 8) == XXH3_64bits_withSeed("", 0, XXH3_64bits(p, 32)));
}

/* 2. The layout, read from the file itself. */
static void test_layout(void)
{
	size_t n;
	uint8_t *f = check_read_file(path, &n);

	CHECK(n == size);
	for (unsigned i = 0; i < N_RECS && n == size; i++)
		check_layout(f, i);
	free(f);
	check_layout_bytes();
}

/* 3. An intact file: every record, a unit per 3; a refusal stops there. */
static void test_scan(void)
{
	struct scan_ctx c = {.cut = size, .payload = 1, .refuse = 11};
	dcast_rec_scan_out out;

	scan_expect(0, size, N_RECS, &out);
	scan_expect(1, size, N_RECS, &out); /* the last unit is open: good_end < size */
	CHECK_ERR(dcast_rec_scan(&rd, 1, on_rec, &c, &out), 0);
	CHECK(c.calls == 11 && out.bad_off == start[10] && out.good_end == start[9] &&
	      out.units == 3 && strcmp(out.why, "refused record 10") == 0);
}

/* 4a. The file cut at cut, scanned both ways. */
static int torn_at(uint64_t cut)
{
	dcast_rec_scan_out out;
	int ok;

	REQUIRE(ftruncate(fd, (off_t)cut) == 0);
	ok = scan_expect(0, cut, record_at(cut), &out) && scan_expect(1, cut, record_at(cut), &out);
	if (!ok)
		fprintf(stderr, "  torn at %llu\n", (unsigned long long)cut);
	return ok;
}

/* 4. Every cut inside the last records, then random cuts anywhere. */
static void test_torn(void)
{
	uint64_t from = start[N_RECS - SMALL_TAIL];

	for (uint64_t cut = size; cut-- > from;)
		if (!torn_at(cut))
			break;
	restore_from(from);
	for (int t = 0; t < 200; t++) {
		uint64_t cut = t ? rnd() % (size + 1) : 0;

		if (!torn_at(cut))
			t = 200;
		restore_from(cut);
	}
}

/* 5a. One bit flipped at off: where the scans stop. */
static int flip_at(uint64_t off)
{
	unsigned i = record_at(off);
	int in_payload = off >= start[i] + PREFIX + recs[i].hdr_len, before = check_failures;
	uint8_t b = img[off] ^ (uint8_t)(1u << below(8));
	dcast_rec_scan_out out;
	dcast_rec r;
	char why[256];

	pw(fd, &b, 1, off);
	scan_expect(1, size, i, &out);
	if (in_payload) {
		CHECK(strstr(out.why, "checksum") != NULL);
		CHECK_ERR(dcast_rec_read(&rd, start[i], 1, &r, why, sizeof(why)), DCAST_ECHECKSUM);
		/* by design: without payloads a payload bit passes; its sum catches it when read */
		CHECK_ERR(dcast_rec_read(&rd, start[i], 0, &r, why, sizeof(why)), 0);
	}
	scan_expect(0, size, in_payload ? N_RECS : i, &out);
	pw(fd, img + off, 1, off);
	if (check_failures != before)
		fprintf(stderr, "  bit flipped at %llu (record %u)\n", (unsigned long long)off, i);
	return in_payload;
}

/* 5. Bit flips anywhere, and in prefixes and headers (a third of trials). */
static void test_damage(void)
{
	unsigned in_payload = 0, trials = 300, before = (unsigned)check_failures;
	dcast_rec_scan_out out;

	for (unsigned t = 0; t < trials && (unsigned)check_failures == before; t++) {
		unsigned i = below(N_RECS);
		uint64_t off = t % 3 ? rnd() % size : start[i] + below(PREFIX + recs[i].hdr_len);

		in_payload += (unsigned)flip_at(off);
	}
	CHECK(in_payload > 0);
	scan_expect(1, size, N_RECS, &out); /* restored */
}

/* Byte at (0..3) of record k's magic set to c, its checksum redone
 * (as a writer of that format would) or not. */
static void set_magic(unsigned k, int at, char c, int redo)
{
	uint8_t p[PREFIX];

	memcpy(p, img + start[k], sizeof(p));
	p[at] = (uint8_t)c;
	if (redo)
		put_le(p + 32, doc_checksum(p, img + start[k] + PREFIX, recs[k].hdr_len), 8);
	pw(fd, p, sizeof(p), start[k]);
}

/* 6a. A whole record of format fmt at k: refused, not cut. */
static void check_other_format(unsigned k, char fmt)
{
	char want[16], why[256];
	dcast_rec_scan_out out;
	dcast_rec r;

	snprintf(want, sizeof(want), "format %c", fmt);
	set_magic(k, 3, fmt, 1);
	CHECK_ERR(dcast_rec_read(&rd, start[k], 1, &r, why, sizeof(why)), DCAST_EPROTO_VERSION);
	for (int mode = 0; mode < 2; mode++) {
		struct scan_ctx c = {.cut = size, .payload = mode};

		CHECK_ERR(dcast_rec_scan(&rd, mode, on_rec, &c, &out), DCAST_EPROTO_VERSION);
		CHECK(strstr(out.why, want) != NULL && c.calls == k && c.wrong == 0);
	}
	set_magic(k, 3, fmt, 0); /* the same byte, checksum stale: damage */
	CHECK_ERR(dcast_rec_read(&rd, start[k], 1, &r, why, sizeof(why)), DCAST_ECHECKSUM);
	scan_expect(0, size, k, &out);
	scan_expect(1, size, k, &out);
}

/* 6. Formats 2 and 4 at record 20; not a format: "DCRA", "XCR3". */
static void test_format(void)
{
	dcast_rec_scan_out out;
	dcast_rec r;
	char why[256];

	check_other_format(20, '2');
	check_other_format(20, '4');
	for (int at = 3; at >= 0; at -= 3) {
		set_magic(20, at, at ? 'A' : 'X', 1);
		CHECK_ERR(dcast_rec_read(&rd, start[20], 1, &r, why, sizeof(why)), DCAST_ECORRUPT);
		scan_expect(1, size, 20, &out);
	}
	pw(fd, img + start[20], PREFIX, start[20]);
	scan_expect(1, size, N_RECS, &out);
}

/* A prefix with these fields and a checksum over hdr[0..sum_len). */
static void forge(uint8_t *p, uint16_t kind, uint16_t flags, uint32_t hdr_len,
		  uint32_t payload_len, uint64_t payload_sum, const void *hdr, size_t sum_len)
{
	memcpy(p, "DCR3", 4);
	put_le(p + 4, kind, 2);
	put_le(p + 6, flags, 2);
	put_le(p + 8, hdr_len, 4);
	put_le(p + 12, payload_len, 4);
	put_le(p + 16, 7, 8);
	put_le(p + 24, payload_sum, 8);
	put_le(p + 32, doc_checksum(p, hdr, sum_len), 8);
}

/* 7a. A 64-byte record (8-byte header, 16-byte payload) with these
 * fields, read back both ways: rc expected of each. */
static void check_small(int f, uint16_t kind, uint16_t flags, uint32_t hl, uint32_t pl, int want)
{
	dcast_rec_reader r2 = {.fd = f, .size = PREFIX + 24, .max_kind = MAX_KIND};
	uint8_t p[PREFIX];
	dcast_rec r;
	char why[256];

	forge(p, kind, flags, hl, pl, dcast_checksum("payload-16-bytes", 16), "headerXX",
	      hl <= 8 ? hl : 8);
	pw(f, p, sizeof(p), 0);
	for (int mode = 0; mode < 2; mode++) {
		int rc = dcast_rec_read(&r2, 0, mode, &r, why, sizeof(why));

		CHECK_ERR(rc, want);
		CHECK(r2.cap < 4096);
		if (rc != want)
			fprintf(stderr, "  kind %u flags %#x lengths %u+%u: %s\n", kind, flags, hl, pl, why);
	}
	dcast_rec_reader_free(&r2);
}

/* 7b. A sparse file whose one record has these lengths, its checksum
 * right (zero header), read without its payload. */
static void check_big(int f, uint32_t hl, uint32_t pl, int want)
{
	dcast_rec_reader r2 = {.fd = f, .size = PREFIX + (uint64_t)hl + pl, .max_kind = MAX_KIND};
	uint8_t p[PREFIX], *zero = calloc(1, hl + 1);
	dcast_rec r;
	char why[256];

	REQUIRE(zero && ftruncate(f, (off_t)r2.size) == 0);
	forge(p, 1, 0, hl, pl, 0, zero, hl);
	pw(f, p, sizeof(p), 0);
	CHECK_ERR(dcast_rec_read(&r2, 0, 0, &r, why, sizeof(why)), want);
	CHECK(!want || r2.cap < 4096);
	dcast_rec_reader_free(&r2);
	free(zero);
	REQUIRE(ftruncate(f, 0) == 0);
}

/* 7. Lengths over the limits, kinds and flags out of range: corrupt. */
static void test_limits(void)
{
	char p[320];
	int f;

	snprintf(p, sizeof(p), "%s/limits", root);
	REQUIRE((f = open(p, O_RDWR | O_CREAT | O_TRUNC, 0644)) >= 0);
	pw(f, "headerXXpayload-16-bytes", 24, PREFIX);
	check_small(f, 1, 0, 8, 16, 0);
	check_small(f, MAX_KIND, 0, 8, 16, 0);
	check_small(f, 0, 0, 8, 16, DCAST_ECORRUPT);
	check_small(f, MAX_KIND + 1, 0, 8, 16, DCAST_ECORRUPT);
	check_small(f, 0xffff, 0, 8, 16, DCAST_ECORRUPT);
	check_small(f, 1, 1, 8, 16, DCAST_ECORRUPT);
	check_small(f, 1, 0x8000, 8, 16, DCAST_ECORRUPT);
	check_small(f, 1, 0, 0xffffffffu, 16, DCAST_ECORRUPT);
	check_small(f, 1, 0, 8, 0xffffffffu, DCAST_ECORRUPT);
	check_small(f, 1, 0, 0xffffffffu, 0xffffffffu, DCAST_ECORRUPT);
	REQUIRE(ftruncate(f, 0) == 0);
	check_big(f, DCAST_MAX_HEADER_BYTES, 0, 0);
	check_big(f, DCAST_MAX_HEADER_BYTES + 1, 0, DCAST_ECORRUPT);
	check_big(f, 0, DCAST_MAX_CHUNK_BYTES, 0);
	check_big(f, 0, DCAST_MAX_CHUNK_BYTES + 1, DCAST_ECORRUPT);
	close(f);
	CHECK(unlink(p) == 0);
}

/* 8a. Magic at the edges of next_magic's 16 KiB reads, and past size. */
static void check_magic_edges(void)
{
	char p[320];
	static uint8_t zero[40000];
	int f;

	snprintf(p, sizeof(p), "%s/magic", root);
	REQUIRE((f = open(p, O_RDWR | O_CREAT | O_TRUNC, 0644)) >= 0);
	pw(f, zero, sizeof(zero), 0);
	pw(f, "DCR3", 4, 16382); /* straddles the first read */
	pw(f, "DCR2", 4, 20000); /* another format: not a hit */
	pw(f, "DCR3", 4, 30000);
	CHECK(dcast_rec_next_magic(f, 0, sizeof(zero)) == 16382);
	CHECK(dcast_rec_next_magic(f, 16383, sizeof(zero)) == 30000);
	CHECK(dcast_rec_next_magic(f, 30001, sizeof(zero)) == sizeof(zero));
	CHECK(dcast_rec_next_magic(f, sizeof(zero), sizeof(zero)) == sizeof(zero));
	/* "or size if there is none before it": the magic at 30000 is past 25000 */
	CHECK(dcast_rec_next_magic(f, 16383, 25000) == 25000);
	close(f);
	CHECK(unlink(p) == 0);
}

/* 8. From each record start and past it; past a damaged one. */
static void test_next_magic(void)
{
	dcast_rec_scan_out out;

	for (unsigned i = 0; i < N_RECS; i++) {
		CHECK(dcast_rec_next_magic(fd, start[i], size) == start[i]);
		CHECK(dcast_rec_next_magic(fd, start[i] + 1, size) == start[i + 1]);
	}
	pw(fd, "X", 1, start[7]);
	scan_expect(1, size, 7, &out);
	CHECK(out.bad_off == start[7] && dcast_rec_next_magic(fd, out.bad_off, size) == start[8]);
	set_magic(7, 3, '2', 1);
	CHECK(dcast_rec_next_magic(fd, start[7], size) == start[8]);
	pw(fd, img + start[7], PREFIX, start[7]);
	check_magic_edges();
}

/* 9. dcast_mkdir, dcast_fsync_dir, dcast_fsync_parent. */
static void test_dirs(void)
{
	char d[320], missing[320], f[340], quoted[340];
	struct stat st;

	snprintf(d, sizeof(d), "%s/sub", root);
	snprintf(missing, sizeof(missing), "%s/missing", root);
	snprintf(quoted, sizeof(quoted), "'%s'", missing);
	CHECK_ERR(dcast_mkdir(d), 0);
	CHECK(stat(d, &st) == 0 && S_ISDIR(st.st_mode));
	CHECK_ERR(dcast_mkdir(d), 0);
	CHECK_ERR(dcast_fsync_dir(d), 0);
	CHECK_ERR(dcast_fsync_dir(missing), DCAST_EIO);
	CHECK(strstr(dcast_last_error(), quoted) != NULL);
	snprintf(f, sizeof(f), "%s/file", d);
	CHECK_ERR(dcast_fsync_parent(f), 0);
	snprintf(f, sizeof(f), "%s/file", missing);
	CHECK_ERR(dcast_fsync_parent(f), DCAST_EIO);
	CHECK(strstr(dcast_last_error(), quoted) != NULL); /* the folder, not the file */
	CHECK_ERR(dcast_fsync_parent("no-slash"), 0);
	snprintf(f, sizeof(f), "%s/sub", missing);
	CHECK_ERR(dcast_mkdir(f), DCAST_EIO);
	CHECK(strstr(dcast_last_error(), f) != NULL && stat(f, &st) != 0);
}

static void run_case(const char *name, void (*fn)(void))
{
	int before = check_failures;

	fn();
	printf("%-12s %s\n", name, check_failures == before ? "ok" : "FAILED");
	fflush(stdout);
}

/* dcast_rec_msg: msgpack message m encoded as the header of a record of
 * kind and version; its result. */
static int msg_as(const dcast_msg *m, uint16_t kind, uint64_t version)
{
	dcast_rec r = {kind, 0, 0, version, 0};
	dcast_msg out;
	void *enc = NULL;
	size_t len = 0;
	int err;

	REQUIRE(dcast_msg_encode(m, &enc, &len) == 0);
	r.hdr_len = (uint32_t)len;
	err = dcast_rec_msg(&r, enc, &out);
	if (!err) {
		CHECK(out.type == m->type);
		dcast_msg_free(&out);
	}
	free(enc);
	return err;
}

/* A record's header is the message its kind holds, of its version. */
static void test_msg(void)
{
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_COMMIT);
	strcpy(m.u.commit.model, "m");
	m.u.commit.version = 7;
	m.u.commit.base_version = 6;
	CHECK_ERR(msg_as(&m, DCAST_REC_COMMIT, 7), 0);
	CHECK_ERR(msg_as(&m, DCAST_REC_COMMIT, 8), DCAST_ECORRUPT); /* another version */
	CHECK(strstr(dcast_last_error(), "version 7 in a record of version 8") != NULL);
	CHECK_ERR(msg_as(&m, DCAST_REC_CHUNK, 7), DCAST_ECORRUPT);  /* another kind */
	CHECK(strstr(dcast_last_error(), "holds a COMMIT") != NULL);
	CHECK_ERR(msg_as(&m, DCAST_REC_FILE, 7), DCAST_ECORRUPT);   /* FILE holds a name */
	dcast_rec r = {DCAST_REC_COMMIT, 3, 0, 7, 0};
	CHECK(dcast_rec_msg(&r, (const uint8_t *)"\xc1\xc1\xc1", &m) != 0); /* not msgpack */
}

/* A MANIFEST record of an older build, without "sum", still loads (the
 * record's checksum covered it); one with a sum that does not match its
 * content is refused, as on the wire. */
static void test_old_manifest(void)
{
	dcast_tensor_desc t = {.name = "layers.0.w", .dtype = DCAST_DTYPE_BF16, .ndim = 1, .shape = {8}};
	dcast_rec r = {DCAST_REC_MANIFEST, 0, 0, 1, 0};
	dcast_msg m, out;
	void *enc, *old;
	size_t len, old_len;

	dcast_msg_init(&m, DCAST_MSG_MANIFEST);
	strcpy(m.u.manifest.model, "m");
	m.u.manifest.n_tensors = 1, m.u.manifest.tensors = &t;
	CHECK_ERR(msg_as(&m, DCAST_REC_MANIFEST, 1), 0);
	REQUIRE(dcast_msg_encode(&m, &enc, &len) == 0);
	REQUIRE(old_without_sum(enc, len, &old, &old_len) == 0);
	r.hdr_len = (uint32_t)old_len;
	CHECK_ERR(dcast_rec_msg(&r, old, &out), 0);
	CHECK(out.type == DCAST_MSG_MANIFEST && out.u.manifest.n_tensors == 1 &&
	      !strcmp(out.u.manifest.tensors[0].name, "layers.0.w"));
	dcast_msg_free(&out);
	CHECK_ERR(dcast_msg_decode(old, old_len, &out), DCAST_EFIELD_MISSING); /* not from a peer */
	free(old);
	uint8_t *dot = memmem(enc, len, "layers.0", 8);
	REQUIRE(dot);
	dot[6] ^= 1; /* "layers/0.w": the sum no longer matches */
	r.hdr_len = (uint32_t)len;
	CHECK_ERR(dcast_rec_msg(&r, enc, &out), DCAST_ECHECKSUM);
	free(enc);
}

/* A FILE record's name: what both record logs take from it. */
static void test_file_name(void)
{
	char name[DCAST_MAX_NAME + 1] = "kept", big[DCAST_MAX_NAME + 2];
	dcast_rec r = {DCAST_REC_FILE, 5, 0, 1, 0};

	CHECK_ERR(dcast_rec_file_name(&r, (const uint8_t *)"llama", name), 0);
	CHECK(!strcmp(name, "llama"));
	r.hdr_len = 3;
	CHECK_ERR(dcast_rec_file_name(&r, (const uint8_t *)"a\0b", name), DCAST_ECORRUPT); /* a NUL */
	CHECK(!strcmp(name, "llama")); /* untouched */
	r.hdr_len = 0;
	CHECK_ERR(dcast_rec_file_name(&r, (const uint8_t *)"", name), DCAST_ECORRUPT);
	memset(big, 'x', sizeof(big));
	r.hdr_len = DCAST_MAX_NAME + 1;
	CHECK_ERR(dcast_rec_file_name(&r, (const uint8_t *)big, name), DCAST_ECORRUPT); /* too long */
	r = (dcast_rec){DCAST_REC_FILE, 5, 1, 1, 0};
	CHECK_ERR(dcast_rec_file_name(&r, (const uint8_t *)"llama", name), DCAST_ECORRUPT); /* a payload */
	r = (dcast_rec){DCAST_REC_COMMIT, 5, 0, 1, 0};
	CHECK_ERR(dcast_rec_file_name(&r, (const uint8_t *)"llama", name), DCAST_ECORRUPT); /* another kind */
}

int main(void)
{
	const char *seed = getenv("DCAST_TEST_SEED");

	rng = seed ? strtoull(seed, NULL, 0) : 0x5eed2024c0ffeeull;
	rng = rng ? rng : 1;
	printf("seed %#llx\n", (unsigned long long)rng);
	REQUIRE(mkdtemp(root));
	make_records();
	write_file();
	run_case("roundtrip", test_roundtrip);
	run_case("layout", test_layout);
	run_case("scan", test_scan);
	run_case("torn", test_torn);
	run_case("damage", test_damage);
	run_case("format", test_format);
	run_case("limits", test_limits);
	run_case("next_magic", test_next_magic);
	run_case("dirs", test_dirs);
	run_case("msg", test_msg);
	run_case("old_manifest", test_old_manifest);
	run_case("file_name", test_file_name);
	close(fd);
	dcast_rec_reader_free(&rd);
	free(img);
	check_remove_dir(root);
	return check_done("test_reclog");
}
