/* broker/segment.c on real files (through io_uring and the plain path):
 * versions written then reloaded equal; an anchor starts a new segment and
 * deletes the old; an aborted version leaves nothing; a segment truncated at
 * random offsets or with a random byte flipped reloads as exactly the
 * committed prefix (file cut back, never a partial version), the bytes cut
 * off are in quarantine/ byte for byte, the whole versions after a flipped
 * byte are replayed past it (BROKER_SEG_TAIL; with the MANIFEST when the
 * anchor was hit), and takes new versions after it; a
 * whole segment of another format stops the load and is left untouched; a
 * version with a chunk record that is whole (its checksums hold) but lies
 * outside the segment's MANIFEST (another tensor, a range past the
 * tensor's end, another element size) is set aside like a damaged one. */
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include "../broker/segment.c"
#include "check.h"

#define N_VERSIONS 10
#define MAX_RECS 256
#define CHUNKS_PER_VERSION 4
#define CHUNK_ELEMS 512

static char root[] = "/tmp/dcast_test_segment_XXXXXX";

/* A record as written or as replayed: kind, version, hashes of its bytes. */
struct rec {
	int kind;
	uint64_t version, hdr_hash, payload_hash;
};

static struct rec written[MAX_RECS], loaded[MAX_RECS], tail[MAX_RECS];
static unsigned n_written, n_loaded, n_lost; /* n_lost: BROKER_SEG_LOST reports */
static unsigned n_tail;  /* records replayed past the damage (BROKER_SEG_TAIL) */
static unsigned tails;   /* damage trials that replayed records past it */
static int in_tail;
static uint64_t commit_end[N_VERSIONS + 4]; /* segment size after commit i */
static uint32_t rng = 12345;
static int bad_chunk; /* write_version: chunk 2 outside the manifest, how (1..3) */

static int visit(void *ctx, const char *model, const dcast_rec *r, const void *hdr,
		 const void *payload)
{
	(void)ctx;
	if (strcmp(model, "llama/7b") || n_loaded == MAX_RECS)
		return DCAST_EINVAL;
	if (r->kind == BROKER_SEG_LOST)
		return in_tail = 0, n_lost++, 0;
	if (r->kind == BROKER_SEG_TAIL)
		return in_tail = 1, 0;
	if (in_tail && n_tail < MAX_RECS)
		tail[n_tail++] = (struct rec){r->kind, r->version, XXH3_64bits(hdr, r->hdr_len),
					      XXH3_64bits(payload, r->payload_len)};
	else if (!in_tail)
		loaded[n_loaded++] = (struct rec){r->kind, r->version, XXH3_64bits(hdr, r->hdr_len),
						  XXH3_64bits(payload, r->payload_len)};
	return 0;
}

static void note(int kind, uint64_t version, const void *hdr, size_t hdr_len,
		 const void *payload, size_t payload_len)
{
	REQUIRE(n_written < MAX_RECS);
	written[n_written++] = (struct rec){kind, version, XXH3_64bits(hdr, hdr_len),
					    XXH3_64bits(payload, payload_len)};
}

static void encode(const dcast_msg *m, void **out, size_t *len)
{
	REQUIRE(dcast_msg_encode(m, out, len) == 0);
}

static void begin_anchor(broker_seg_store *s, uint64_t version)
{
	dcast_tensor_desc t = {.name = "w", .dtype = DCAST_DTYPE_F32, .ndim = 1,
			       .shape = {CHUNKS_PER_VERSION * CHUNK_ELEMS}};
	dcast_msg m;
	void *hdr;
	size_t len;

	dcast_msg_init(&m, DCAST_MSG_MANIFEST);
	snprintf(m.u.manifest.model, sizeof(m.u.manifest.model), "llama/7b");
	m.u.manifest.n_tensors = 1;
	m.u.manifest.tensors = &t;
	encode(&m, &hdr, &len);
	CHECK_ERR(broker_seg_begin_anchor(s, "llama/7b", version, hdr, len), 0);
	note(BROKER_SEG_MANIFEST, version, hdr, len, NULL, 0);
	free(hdr);
}

/* Write one version (anchor or delta) with dense chunks, optionally commit. */
static void write_version(broker_seg_store *s, uint64_t version, int anchor, int commit)
{
	static uint32_t payload[CHUNKS_PER_VERSION][CHUNK_ELEMS];
	void *hdrs[CHUNKS_PER_VERSION], *chdr;
	size_t lens[CHUNKS_PER_VERSION], clen;
	dcast_range_digest dg = {0, 0, CHUNKS_PER_VERSION * CHUNK_ELEMS, version * 7};
	dcast_msg m;

	if (anchor)
		begin_anchor(s, version);
	for (unsigned i = 0; i < CHUNKS_PER_VERSION; i++) {
		for (unsigned k = 0; k < CHUNK_ELEMS; k++)
			payload[i][k] = rng = rng * 1664525u + 1013904223u;
		dcast_msg_init(&m, DCAST_MSG_CHUNK);
		dcast_chunk *c = &m.u.chunk;
		snprintf(c->model, sizeof(c->model), "llama/7b");
		c->version = version;
		c->base_version = anchor ? DCAST_VERSION_NONE : version - 1;
		c->anchor = (uint32_t)anchor;
		c->seq = i;
		c->start = (uint64_t)i * CHUNK_ELEMS;
		c->count = CHUNK_ELEMS;
		c->elem_size = 4;
		c->changed = CHUNK_ELEMS;
		c->payload_bytes = sizeof(payload[i]);
		if (i == 2 && bad_chunk == 1)
			c->tensor = 1; /* the manifest has one */
		if (i == 2 && bad_chunk == 2)
			c->start = CHUNKS_PER_VERSION * CHUNK_ELEMS - 1; /* runs past the end */
		if (i == 2 && bad_chunk == 3)
			c->elem_size = 2, c->count = 2 * CHUNK_ELEMS; /* f32 has 4 */
		dcast_chunk_seal(c, payload[i]); /* sealed whole: only the manifest refuses it */
		encode(&m, &hdrs[i], &lens[i]);
		CHECK_ERR(broker_seg_append_chunk(s, "llama/7b", version, hdrs[i], lens[i],
						  payload[i], sizeof(payload[i]),
						  dcast_checksum(payload[i], sizeof(payload[i]))), 0);
	}
	dcast_msg_init(&m, DCAST_MSG_COMMIT);
	snprintf(m.u.commit.model, sizeof(m.u.commit.model), "llama/7b");
	m.u.commit.version = version;
	m.u.commit.base_version = anchor ? DCAST_VERSION_NONE : version - 1;
	m.u.commit.anchor = (uint32_t)anchor;
	m.u.commit.chunks = CHUNKS_PER_VERSION;
	m.u.commit.bytes = sizeof(payload);
	m.u.commit.n_digests = 1;
	m.u.commit.digests = &dg;
	encode(&m, &chdr, &clen);
	if (commit) {
		CHECK_ERR(broker_seg_commit(s, "llama/7b", version, chdr, clen), 0);
		for (unsigned i = 0; i < CHUNKS_PER_VERSION; i++)
			note(BROKER_SEG_CHUNK, version, hdrs[i], lens[i], payload[i],
			     sizeof(payload[i]));
		note(BROKER_SEG_COMMIT, version, chdr, clen, NULL, 0);
	} else {
		CHECK_ERR(broker_seg_abort(s, "llama/7b"), 0);
	}
	for (unsigned i = 0; i < CHUNKS_PER_VERSION; i++)
		free(hdrs[i]);
	free(chdr);
}

static void reload(broker_seg_store **s, const char *dir)
{
	broker_seg_close(s);
	n_loaded = n_lost = n_tail = 0;
	in_tail = 0;
	REQUIRE(broker_seg_open(s, dir) == 0);
	CHECK_ERR(broker_seg_load(*s, visit, NULL), 0);
}

/* Records replayed == the first n records written. */
static int loaded_equals_prefix(unsigned n)
{
	if (n_loaded != n)
		return 0;
	for (unsigned i = 0; i < n; i++)
		if (memcmp(&loaded[i], &written[i], sizeof(loaded[i])))
			return 0;
	return 1;
}

static unsigned records_through(unsigned versions)
{
	return versions ? 1 + versions * (CHUNKS_PER_VERSION + 1) : 0;
}

static int count_segments(const char *model_dir)
{
	uint64_t a[16];

	return (int)list_segments(model_dir, a, 16);
}

static void model_dir_of(const char *dir, char *out, size_t cap)
{
	char dn[128];

	model_dirname("llama/7b", dn, sizeof(dn));
	snprintf(out, cap, "%s/%s", dir, dn);
}

/* Basic round trip, abort, new anchor superseding the old segment. */
static void test_roundtrip(const char *dir)
{
	broker_seg_store *s;
	char mdir[512];

	n_written = 0;
	REQUIRE(broker_seg_open(&s, dir) == 0);
	CHECK_ERR(broker_seg_load(s, visit, NULL), 0);
	CHECK_ERR(broker_seg_append_chunk(s, "llama/7b", 1, "x", 1, NULL, 0, 0), DCAST_ESTATE);
	for (uint64_t v = 1; v <= N_VERSIONS; v++) {
		write_version(s, v, v == 1, 1);
		commit_end[v] = broker_seg_bytes(s, "llama/7b");
	}
	write_version(s, N_VERSIONS + 1, 0, 0); /* aborted: leaves nothing */
	CHECK(broker_seg_bytes(s, "llama/7b") == commit_end[N_VERSIONS]);
	reload(&s, dir);
	CHECK(loaded_equals_prefix(records_through(N_VERSIONS)));
	/* Appending continues after a reload. */
	write_version(s, N_VERSIONS + 1, 0, 1);
	reload(&s, dir);
	CHECK(loaded_equals_prefix(n_written));
	/* A new anchor: new segment; the old one goes once it commits. */
	model_dir_of(dir, mdir, sizeof(mdir));
	CHECK(count_segments(mdir) == 1);
	n_written = 0;
	write_version(s, N_VERSIONS + 2, 1, 1);
	CHECK(count_segments(mdir) == 1);
	write_version(s, N_VERSIONS + 3, 0, 1);
	reload(&s, dir);
	CHECK(loaded_equals_prefix(n_written) && n_written == records_through(2));
	/* An anchor begun and aborted: the previous segment stays current. */
	write_version(s, N_VERSIONS + 4, 1, 0);
	CHECK(count_segments(mdir) == 1);
	reload(&s, dir);
	CHECK(loaded_equals_prefix(records_through(2)));
	broker_seg_close(&s);
}

/* The one file in dir/quarantine/ (NULL if none), malloc'd, its length in
 * *n; the folder is emptied for the next trial. */
static uint8_t *take_quarantined(const char *dir, size_t *n)
{
	char q[300], path[600], cmd[400];
	DIR *d;
	struct dirent *e;
	uint8_t *p = NULL;
	int files = 0;

	snprintf(q, sizeof(q), "%s/quarantine", dir);
	*n = 0;
	if (!(d = opendir(q)))
		return NULL;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.' && !files++) {
			snprintf(path, sizeof(path), "%s/%s", q, e->d_name);
			p = check_read_file(path, n);
		}
	closedir(d);
	CHECK(files <= 1);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", q);
	CHECK(system(cmd) == 0);
	return p;
}

/* Damage the segment (cut at `cut`, or flip the byte at `flip`), reload,
 * and check exactly the versions wholly before the damage come back and
 * the rest is in quarantine/ byte for byte. */
/* After a reload of an image of `end` bytes cut back to `kept`: bytes
 * [kept, end) are the quarantined file, and one BROKER_SEG_LOST report
 * came (none when nothing was cut, or the file was empty). */
static void check_quarantine(const char *dir, const uint8_t *img, size_t end, size_t kept)
{
	size_t qn;
	uint8_t *q = take_quarantined(dir, &qn);

	if (end == kept || end == 0) {
		CHECK(q == NULL && n_lost == 0);
		return;
	}
	CHECK(q && qn == end - kept && memcmp(q, img + kept, qn) == 0);
	CHECK(n_lost <= 1); /* 0 when the FILE record itself is hit: no model name */
	free(q);
}

/* Offset of the i-th record (0: FILE) of a segment image. */
static size_t record_off(const uint8_t *p, unsigned i);

/* The records replayed past a flipped byte in version k + 1 (the versions
 * before it whole): the versions after it, whole, and the MANIFEST first
 * when the anchor was hit; none when the FILE or MANIFEST record was, or
 * for a cut (a torn end). */
static int tail_is(const uint8_t *orig, long flip, unsigned k)
{
	unsigned from = records_through(k + 1), n = 0;

	if (flip < 0 || (size_t)flip < record_off(orig, 2) || k + 1 >= N_VERSIONS)
		return n_tail == 0;
	if (k == 0 && n_tail && memcmp(&tail[n++], &written[0], sizeof(tail[0])))
		return 0;
	return n_tail - n == records_through(N_VERSIONS) - from &&
	       memcmp(&tail[n], &written[from], (n_tail - n) * sizeof(tail[0])) == 0;
}

static void damage_trial(const char *dir, const char *seg, const uint8_t *orig, size_t n,
			 size_t cut, long flip)
{
	uint8_t *copy = malloc(n);
	size_t limit = flip >= 0 ? (size_t)flip : cut;
	unsigned k = 0;
	broker_seg_store *s = NULL;
	struct stat st;

	memcpy(copy, orig, n);
	if (flip >= 0)
		copy[flip] ^= (uint8_t)(1u << (rng++ % 8));
	check_write_file(seg, copy, flip >= 0 ? n : cut);
	while (k < N_VERSIONS && commit_end[k + 1] <= limit)
		k++;
	reload(&s, dir);
	if (!loaded_equals_prefix(records_through(k)))
		fprintf(stderr, "damage cut=%zu flip=%ld: loaded %u records, want %u\n", cut, flip,
			n_loaded, records_through(k));
	CHECK(loaded_equals_prefix(records_through(k)));
	if (!tail_is(orig, flip, k))
		fprintf(stderr, "damage flip=%ld in version %u: %u records past it\n", flip, k + 1,
			n_tail);
	CHECK(tail_is(orig, flip, k));
	tails += n_tail > 0;
	check_quarantine(dir, copy, flip >= 0 ? n : cut, k ? commit_end[k] : 0);
	if (k == 0)
		CHECK(stat(seg, &st) != 0);
	else
		CHECK(stat(seg, &st) == 0 && (uint64_t)st.st_size == commit_end[k]);
	/* The store takes the next version after the cut (an anchor if empty). */
	if (k > 0) {
		unsigned save = n_written;

		n_written = records_through(k);
		write_version(s, k + 1, 0, 1);
		reload(&s, dir);
		CHECK(loaded_equals_prefix(records_through(k + 1)));
		n_written = save;
	}
	broker_seg_close(&s);
	free(copy);
}

static void test_damage(const char *dir)
{
	broker_seg_store *s;
	char mdir[512], seg[600];
	uint8_t *orig;
	size_t n;

	n_written = 0;
	REQUIRE(broker_seg_open(&s, dir) == 0);
	for (uint64_t v = 1; v <= N_VERSIONS; v++) {
		write_version(s, v, v == 1, 1);
		commit_end[v] = broker_seg_bytes(s, "llama/7b");
	}
	broker_seg_close(&s);
	model_dir_of(dir, mdir, sizeof(mdir));
	snprintf(seg, sizeof(seg), "%s/seg-%020llu.log", mdir, 1ull);
	orig = check_read_file(seg, &n);
	CHECK(n == commit_end[N_VERSIONS]);
	struct rec saved[MAX_RECS];
	memcpy(saved, written, sizeof(saved));
	for (int t = 0; t < 40; t++) {
		size_t cut = (rng = rng * 1664525u + 1013904223u) % n;

		memcpy(written, saved, sizeof(saved));
		damage_trial(dir, seg, orig, n, cut, -1);
		memcpy(written, saved, sizeof(saved));
		damage_trial(dir, seg, orig, n, 0, (long)((rng = rng * 1664525u + 1013904223u) % n));
	}
	/* Cuts exactly at version boundaries and one byte either side. */
	for (unsigned v = 1; v <= N_VERSIONS; v++)
		for (int d = -1; d <= 1; d++) {
			memcpy(written, saved, sizeof(saved));
			if (commit_end[v] + d <= n)
				damage_trial(dir, seg, orig, n, (size_t)(commit_end[v] + d), -1);
		}
	fprintf(stderr, "damage trials with versions replayed past a flipped byte: %u\n", tails);
	CHECK(tails > 0);
	free(orig);
}

/* The record at p (dcast_reclog.h's layout, read here on its own terms). */
static void rec_at(const uint8_t *p, dcast_rec *r)
{
	memcpy(&r->hdr_len, p + 8, 4);
	memcpy(&r->payload_len, p + 12, 4);
}

/* Rewrite the record at p + off as record format `fmt` with its checksum
 * whole again: what a build writing that format would have left. */
static void reformat_record(uint8_t *p, size_t off, char fmt)
{
	dcast_rec r;
	uint64_t sum;

	rec_at(p + off, &r);
	p[off + 3] = (uint8_t)fmt;
	sum = XXH3_64bits_withSeed(p + off + DCAST_REC_PREFIX, r.hdr_len, XXH3_64bits(p + off, 32));
	memcpy(p + off + 32, &sum, 8);
}

/* Offset of the i-th record (0: FILE) of a segment image. */
static size_t record_off(const uint8_t *p, unsigned i)
{
	size_t off = 0;

	for (; i; i--) {
		dcast_rec r;

		rec_at(p + off, &r);
		off += DCAST_REC_PREFIX + (size_t)r.hdr_len + r.payload_len;
	}
	return off;
}

/* A whole record of another segment format (its first, or a CHUNK in the
 * middle; older "2" or newer "4") stops the load with an error naming the
 * file, and the file is left byte for byte.  The same byte flipped by
 * damage (checksum broken) is damage: cut as before. */
static void test_other_format(const char *dir)
{
	static const struct { unsigned rec; char fmt; } cases[] = {
		{0, '2'}, {1 + 1 + CHUNKS_PER_VERSION + 1, '2'}, {0, '4'}};
	broker_seg_store *s;
	char mdir[512], seg[600], want[32];
	uint8_t *orig, *copy, *after;
	size_t n, m;

	n_written = 0;
	REQUIRE(broker_seg_open(&s, dir) == 0);
	for (uint64_t v = 1; v <= 3; v++)
		write_version(s, v, v == 1, 1);
	broker_seg_close(&s);
	model_dir_of(dir, mdir, sizeof(mdir));
	snprintf(seg, sizeof(seg), "%s/seg-%020llu.log", mdir, 1ull);
	orig = check_read_file(seg, &n);
	REQUIRE((copy = malloc(n)) != NULL);
	for (unsigned t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
		memcpy(copy, orig, n);
		reformat_record(copy, record_off(orig, cases[t].rec), cases[t].fmt);
		check_write_file(seg, copy, n);
		REQUIRE(broker_seg_open(&s, dir) == 0);
		n_loaded = 0;
		CHECK_ERR(broker_seg_load(s, visit, NULL), DCAST_EPROTO_VERSION);
		snprintf(want, sizeof(want), "record of format %c", cases[t].fmt);
		CHECK(strstr(dcast_last_error(), seg) && strstr(dcast_last_error(), want));
		CHECK(n_loaded == 0);
		broker_seg_close(&s);
		after = check_read_file(seg, &m);
		CHECK(m == n && memcmp(after, copy, n) == 0);
		free(after);
	}
	memcpy(copy, orig, n);
	copy[3] ^= 1; /* "DCR3" -> "DCR2", checksum not redone */
	check_write_file(seg, copy, n);
	reload(&s, dir);
	CHECK(n_loaded == 0 && count_segments(mdir) == 0);
	broker_seg_close(&s);
	free(copy);
	free(orig);
}

/* Versions 1..3, then 4 with a chunk outside the manifest, committed:
 * the load replays 1..3, sets 4 aside (reported lost) and cuts the file
 * back to the end of 3. */
static void test_outside_manifest(const char *dir)
{
	char mdir[512], seg[600], cmd[300];
	broker_seg_store *s;
	uint64_t end3 = 0;

	for (bad_chunk = 1; bad_chunk <= 3; bad_chunk++) {
		n_written = 0;
		REQUIRE(broker_seg_open(&s, dir) == 0);
		for (uint64_t v = 1; v <= 4; v++) {
			int bad = bad_chunk;
			bad_chunk = v == 4 ? bad : 0;
			write_version(s, v, v == 1, 1);
			bad_chunk = bad;
			if (v == 3)
				end3 = broker_seg_bytes(s, "llama/7b");
		}
		reload(&s, dir);
		CHECK(loaded_equals_prefix(records_through(3)));
		CHECK(n_lost == 1);
		broker_seg_close(&s);
		model_dir_of(dir, mdir, sizeof(mdir));
		snprintf(seg, sizeof(seg), "%s/seg-%020llu.log", mdir, 1ull);
		struct stat st;
		CHECK(stat(seg, &st) == 0 && (uint64_t)st.st_size == end3);
		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		CHECK(system(cmd) == 0);
	}
	bad_chunk = 0;
}

static void run(const char *label)
{
	char dir[256], cmd[300];

	fprintf(stderr, "-- %s\n", label);
	snprintf(dir, sizeof(dir), "%s/%s", root, label);
	test_roundtrip(dir);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK(system(cmd) == 0);
	test_damage(dir);
	CHECK(system(cmd) == 0);
	test_other_format(dir);
	CHECK(system(cmd) == 0);
	test_outside_manifest(dir);
}

int main(void)
{
	REQUIRE(mkdtemp(root));
	dcast_log_set_level(DCAST_LOG_WARN);
	unsetenv("DELTACAST_IO_URING");
	run("uring");
	setenv("DELTACAST_IO_URING", "0", 1);
	run("plain");
	check_remove_dir(root);
	return check_done("test_segment");
}
