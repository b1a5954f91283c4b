/* Delta codec on the CPU: exact round trips and reverts for every encoding,
 * element size and density (including empty and all-changed ranges and the
 * range ends), for every compare variant the CPU has (each with its compact
 * v2 build: scalar, AVX2, AVX-512; the variants it lacks are named); and
 * corrupted payloads of every encoding rejected with the destination
 * untouched, compact v2's with the same error by every build. */
#include <math.h>
#include <stdint.h>
#include "check.h"
#include "dcast_common.h"
#include "codec_shared.h"
#include "deltacast/codec.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double rnd01(void)
{
	return (double)(rnd() >> 11) / 9007199254740992.0;
}

typedef struct range {
	uint64_t count;
	unsigned es;
	uint8_t *base, *cur;
} range;

/* base random; cur differs at Bernoulli(density) positions, mostly by one
 * or two ulps (RL-like), sometimes by a random pattern; `ends` forces the
 * first and last element to change. */
static range make_range(uint64_t count, unsigned es, double density, int ends)
{
	range r = { count, es, malloc(count * es + 1), malloc(count * es + 1) };
	unsigned w = 8 * es;
	for (uint64_t i = 0; i < count; i++) {
		uint32_t b = (uint32_t)rnd() & dcast_mask_w(w), c = b;
		int change = rnd01() < density || (ends && (i == 0 || i + 1 == count));
		while (change && c == b) {
			uint64_t k = rnd() % 10;
			c = k < 7 ? dcast_ulp_apply(b, 1 + (uint32_t)(k & 1), w)
			    : k < 9 ? dcast_ulp_apply(b, 3 + (uint32_t)(rnd() % 6), w)
				    : (uint32_t)rnd() & dcast_mask_w(w);
		}
		dcast_store_elem(r.base + i * es, es, b);
		dcast_store_elem(r.cur + i * es, es, c);
	}
	return r;
}

static void free_range(range *r)
{
	free(r->base);
	free(r->cur);
}

/* dcast_codec_resolve against base: the changed positions with base's and
 * cur's values there; scattering them turns base into cur and back, and
 * they move base's digest to cur's. */
static void resolved(const range *r, const dcast_chunk_info *info, const uint8_t *pl)
{
	uint64_t n = info->changed, bytes = r->count * r->es, d = 0, want = 0;
	uint32_t *pos = malloc(n * 4 + 4);
	uint8_t *old = malloc(n * r->es + 1), *nv = malloc(n * r->es + 1), *dst = malloc(bytes + 1);
	REQUIRE(pos && old && nv && dst);
	uint64_t moved = 0, walked = 0;
	CHECK_ERR(dcast_codec_resolve(info, pl, r->base, pos, old, nv, 3, 5, NULL), DCAST_OK);
	CHECK_ERR(dcast_codec_resolve(info, pl, r->base, pos, old, nv, 3, (1ull << 32) - 7, &moved), DCAST_OK);
	CHECK_ERR(dcast_ldigest_payload(&walked, 3, (1ull << 32) - 7, info, pl, r->base, NULL, 0, info->count),
		  DCAST_OK);
	CHECK(moved == walked); /* across a segment's seed boundary too */
	CHECK_ERR(dcast_codec_resolve(info, pl, r->base, pos, old, nv, 3, 5, &moved), DCAST_OK);
	for (uint64_t i = 0; i < n; i++)
		CHECK(pos[i] < r->count && (i == 0 || pos[i] > pos[i - 1]) &&
		      !memcmp(old + i * r->es, r->base + (uint64_t)pos[i] * r->es, r->es) &&
		      !memcmp(nv + i * r->es, r->cur + (uint64_t)pos[i] * r->es, r->es));
	memcpy(dst, r->base, bytes);
	dcast_codec_scatter(pos, nv, n, r->es, dst);
	CHECK(memcmp(dst, r->cur, bytes) == 0);
	CHECK_ERR(dcast_ldigest(3, 5, r->base, r->count, r->es, &d), DCAST_OK);
	CHECK_ERR(dcast_ldigest_update(&d, 3, 5, pos, old, nv, n, r->es), DCAST_OK);
	CHECK_ERR(dcast_ldigest(3, 5, r->cur, r->count, r->es, &want), DCAST_OK);
	CHECK(d == want);
	dcast_codec_scatter(pos, old, n, r->es, dst);
	CHECK(memcmp(dst, r->base, bytes) == 0);
	free(pos);
	free(old);
	free(nv);
	free(dst);
}

/* dcast_codec_encode_digest: the same payload as dcast_codec_encode, and
 * the digest of base moved to cur's in the update (across a seed segment
 * too); refused without UPDATE_BASE, *digest and base untouched. */
static void encoded_digest(const range *r, int enc, const dcast_chunk_info *want_info)
{
	size_t cap = dcast_codec_bound(r->count, r->es), bytes = r->count * r->es;
	uint8_t *out = malloc(cap), *b = malloc(bytes + 1);
	uint64_t starts[2] = { 11, (1ull << 32) - 3 };
	dcast_chunk_info info;
	REQUIRE(out && b);
	for (int k = 0; k < 2; k++) {
		uint64_t d = 0, want = 0, kept;
		memcpy(b, r->base, bytes);
		CHECK_ERR(dcast_ldigest(2, starts[k], b, r->count, r->es, &d), DCAST_OK);
		kept = d;
		CHECK_ERR(dcast_codec_encode_digest(r->cur, b, r->count, r->es, enc, 0, out, cap, &info, 2,
						    starts[k], &d), DCAST_EINVAL);
		CHECK(d == kept && memcmp(b, r->base, bytes) == 0);
		CHECK_ERR(dcast_codec_encode_digest(r->cur, b, r->count, r->es, enc, DCAST_ENCODE_UPDATE_BASE, out,
						    cap, &info, 2, starts[k], &d), DCAST_OK);
		CHECK_ERR(dcast_ldigest(2, starts[k], r->cur, r->count, r->es, &want), DCAST_OK);
		CHECK(d == want && memcmp(b, r->cur, bytes) == 0);
		CHECK(info.encoding == want_info->encoding && info.changed == want_info->changed &&
		      info.payload_bytes == want_info->payload_bytes);
	}
	free(out);
	free(b);
}

static void roundtrip(const range *r, int enc)
{
	size_t cap = dcast_codec_bound(r->count, r->es), bytes = r->count * r->es;
	uint8_t *out = malloc(cap), *dst = malloc(bytes + 1), *old = malloc(bytes + 1);
	dcast_chunk_info info;
	REQUIRE(out && dst && old);
	CHECK_ERR(dcast_codec_encode(r->cur, r->base, r->count, r->es, enc, 0, out, cap, &info), DCAST_OK);
	CHECK(enc < 0 || info.encoding == (uint32_t)enc);
	memcpy(dst, r->base, bytes);
	CHECK_ERR(dcast_codec_apply(&info, out, dst, old), DCAST_OK);
	CHECK(memcmp(dst, r->cur, bytes) == 0);
	CHECK_ERR(dcast_codec_revert(&info, out, dst, old), DCAST_OK);
	CHECK(memcmp(dst, r->base, bytes) == 0);
	if (info.encoding != DCAST_ENC_DENSE) { /* the positions apply decodes: exactly the changed ones */
		uint32_t *pa = malloc(info.changed * 4 + 4);
		REQUIRE(pa);
		CHECK_ERR(dcast_codec_apply_positions(&info, out, dst, NULL, pa), DCAST_OK);
		CHECK(memcmp(dst, r->cur, bytes) == 0);
		for (uint64_t i = 0; i < info.changed; i++) /* increasing, each a change: info.changed of them */
			CHECK(pa[i] < r->count && (i == 0 || pa[i] > pa[i - 1]) &&
			      memcmp(r->base + (uint64_t)pa[i] * r->es, r->cur + (uint64_t)pa[i] * r->es, r->es));
		free(pa);
	}
	if (info.encoding != DCAST_ENC_DENSE)
		resolved(r, &info, out);
	encoded_digest(r, enc, &info);
	if (check_failures)
		fprintf(stderr, "  in roundtrip count=%" PRIu64 " es=%u enc=%d changed=%" PRIu64 "\n",
			r->count, r->es, enc, info.changed);
	free(out);
	free(dst);
	free(old);
}

/* The automatic pick is the smallest size (compact2 where it is at most
 * 1/64 above compact), UPDATE_BASE makes base cur, and
 * SAVE_OLD keeps what revert needs to undo that. */
static void auto_pick(const range *r)
{
	size_t cap = dcast_codec_bound(r->count, r->es), bytes = r->count * r->es;
	uint8_t *out = malloc(cap), *b2 = malloc(bytes + 1);
	uint64_t sizes[DCAST_ENC_COUNT], changed;
	dcast_chunk_info info;
	REQUIRE(out && b2);
	memcpy(b2, r->base, bytes);
	CHECK_ERR(dcast_codec_sizes(r->cur, r->base, r->count, r->es, sizes, &changed), DCAST_OK);
	/* without DCAST_ENCODE_COMPACT2: the smallest of 0..3, never compact2 */
	CHECK_ERR(dcast_codec_encode(r->cur, b2, r->count, r->es, -1, DCAST_ENCODE_UPDATE_BASE, out, cap,
				     &info), DCAST_OK);
	CHECK(info.changed == changed && info.encoding != DCAST_ENC_COMPACT2);
	for (int e = 0; e < DCAST_ENC_COMPACT2; e++)
		CHECK(info.payload_bytes <= sizes[e]);
	CHECK(info.payload_bytes == sizes[info.encoding]);
	CHECK(memcmp(b2, r->cur, bytes) == 0);
	/* with it: the smallest, or compact2 at most 1/64 above compact */
	memcpy(b2, r->base, bytes);
	CHECK_ERR(dcast_codec_encode(r->cur, b2, r->count, r->es, -1,
				     DCAST_ENCODE_UPDATE_BASE | DCAST_ENCODE_COMPACT2, out, cap, &info), DCAST_OK);
	for (int e = 0; e < DCAST_ENC_COUNT; e++)
		CHECK(info.payload_bytes <= sizes[e] ||
		      (info.encoding == DCAST_ENC_COMPACT2 && sizes[e] == sizes[DCAST_ENC_COMPACT] &&
		       info.payload_bytes - sizes[e] <= sizes[e] / 64));
	CHECK(info.payload_bytes == sizes[info.encoding]);
	CHECK(memcmp(b2, r->cur, bytes) == 0);
	/* SAVE_OLD: the old values after the payload revert the update */
	memcpy(b2, r->base, bytes);
	CHECK_ERR(dcast_codec_encode(r->cur, b2, r->count, r->es, -1,
				     DCAST_ENCODE_UPDATE_BASE | DCAST_ENCODE_SAVE_OLD, out, cap, &info),
		  DCAST_OK);
	CHECK(memcmp(b2, r->cur, bytes) == 0);
	CHECK_ERR(dcast_codec_revert(&info, out, b2, out + ((info.payload_bytes + 7) & ~7ull)),
		  DCAST_OK);
	CHECK(memcmp(b2, r->base, bytes) == 0);
	free(out);
	free(b2);
}

static void test_roundtrips(void)
{
	static const uint64_t counts[] = { 0, 1, 7, 8, 9, 1000, 4099, 100003 };
	static const double dens[] = { 0, 0.001, 0.01, 0.05, 0.3, 1.0 };
	static const unsigned sizes[] = { 1, 2, 4 };
	for (size_t c = 0; c < DCAST_ARRAY_LEN(counts); c++)
		for (size_t d = 0; d < DCAST_ARRAY_LEN(dens); d++)
			for (size_t s = 0; s < DCAST_ARRAY_LEN(sizes); s++) {
				range r = make_range(counts[c], sizes[s], dens[d], (int)(c + d) & 1);
				for (int e = -1; e < DCAST_ENC_COUNT; e++)
					roundtrip(&r, e);
				auto_pick(&r);
				free_range(&r);
			}
}

static void test_anchor_and_args(void)
{
	range r = make_range(1000, 2, 0.01, 1);
	size_t cap = dcast_codec_bound(1000, 2);
	uint8_t *out = malloc(cap), dst[2000];
	dcast_chunk_info info;
	CHECK_ERR(dcast_codec_encode(r.cur, NULL, 1000, 2, -1, 0, out, cap, &info), DCAST_OK);
	CHECK(info.encoding == DCAST_ENC_DENSE && info.changed == 1000 && info.payload_bytes == 2000);
	CHECK_ERR(dcast_codec_apply(&info, out, dst, NULL), DCAST_OK);
	CHECK(memcmp(dst, r.cur, 2000) == 0);
	CHECK_ERR(dcast_codec_encode(r.cur, NULL, 1000, 2, DCAST_ENC_IDX32, 0, out, cap, &info), DCAST_EINVAL);
	CHECK_ERR(dcast_codec_encode(r.cur, r.base, 1000, 3, -1, 0, out, cap, &info), DCAST_EINVAL);
	CHECK_ERR(dcast_codec_encode(r.cur, r.base, 1000, 2, DCAST_ENC_COUNT, 0, out, cap, &info), DCAST_EINVAL);
	CHECK_ERR(dcast_codec_encode(r.cur, r.base, 1000, 2, -1, 0, out, cap - 1, &info), DCAST_EINVAL);
	CHECK_ERR(dcast_codec_encode(r.cur, r.base, (uint64_t)DCAST_MAX_CHUNK_ELEMS + 1, 2, -1, 0, out,
				     cap, &info), DCAST_EINVAL);
	CHECK(strcmp(dcast_encoding_name(DCAST_ENC_COMPACT), "compact") == 0);
	CHECK(strcmp(dcast_encoding_name(DCAST_ENC_COMPACT2), "compact2") == 0);
	CHECK(strcmp(dcast_encoding_name(DCAST_ENC_COUNT), "?") == 0);
	CHECK(strcmp(dcast_encoding_name(9), "?") == 0);
	free(out);
	free_range(&r);
}

/* Apply a (maybe broken) payload: it either fails with dst untouched, or
 * succeeds.  Returns 1 when rejected. */
static int rejected(const dcast_chunk_info *info, const uint8_t *pl, const range *r)
{
	uint64_t bytes = r->count * r->es;
	uint8_t *dst = malloc(bytes + 1), *old = malloc(bytes + 1);
	REQUIRE(dst && old);
	memcpy(dst, r->base, bytes);
	int rc = dcast_codec_apply(info, pl, dst, old);
	if (rc) {
		CHECK(memcmp(dst, r->base, bytes) == 0);
		CHECK(dcast_last_error()[0] != 0);
	}
	if (info->encoding != DCAST_ENC_DENSE) { /* resolving refuses what apply refuses */
		uint64_t n = info->changed + 1;
		uint32_t *pos = malloc(n * 4);
		uint8_t *ov = malloc(n * 4), *nv = malloc(n * 4);
		REQUIRE(pos && ov && nv);
		uint64_t d = 7;
		int rr = dcast_codec_resolve(info, pl, r->base, pos, ov, nv, 0, 0, &d);
		CHECK((rr != 0) == (rc != 0) && (rr == 0 || d == 7));
		free(pos);
		free(ov);
		free(nv);
	}
	free(dst);
	free(old);
	return rc != 0;
}

static void encode_forced(const range *r, int enc, uint8_t **out, dcast_chunk_info *info)
{
	size_t cap = dcast_codec_bound(r->count, r->es) + 16;
	*out = calloc(1, cap);
	REQUIRE(*out);
	REQUIRE(dcast_codec_encode(r->cur, r->base, r->count, r->es, enc, 0, *out, cap, info) == DCAST_OK);
}

/* Every single-bit flip of a small payload, truncations, extensions and
 * wrong counts. Structure flips must be caught; value flips may pass. */
static void corrupt_all_bits(int enc, unsigned es)
{
	range r = make_range(300, es, 0.05, 1);
	uint8_t *pl;
	dcast_chunk_info info, bad;
	encode_forced(&r, enc, &pl, &info);
	unsigned caught = 0, flips = 0;
	for (uint64_t i = 0; i < info.payload_bytes; i++)
		for (unsigned b = 0; b < 8; b++, flips++) {
			pl[i] ^= (uint8_t)(1u << b);
			caught += (unsigned)rejected(&info, pl, &r);
			pl[i] ^= (uint8_t)(1u << b);
		}
	CHECK(enc == DCAST_ENC_DENSE || caught > 0);
	bad = info, bad.payload_bytes--;
	CHECK(info.payload_bytes == 0 || rejected(&bad, pl, &r));
	bad = info, bad.payload_bytes++;
	CHECK(rejected(&bad, pl, &r));
	bad = info, bad.changed++;
	CHECK(enc == DCAST_ENC_DENSE || rejected(&bad, pl, &r));
	bad = info, bad.changed--;
	CHECK(enc == DCAST_ENC_DENSE || rejected(&bad, pl, &r));
	bad = info, bad.count--;
	CHECK(rejected(&bad, pl, &r));
	bad = info, bad.count = (uint64_t)DCAST_MAX_CHUNK_ELEMS + 1;
	CHECK(rejected(&bad, pl, &r));
	bad = info, bad.elem_size = 3;
	CHECK(rejected(&bad, pl, &r));
	bad = info, bad.encoding = 7;
	CHECK(rejected(&bad, pl, &r));
	CHECK(!rejected(&info, pl, &r));
	free(pl);
	free_range(&r);
}

static void test_idx32_positions(void)
{
	range r = make_range(500, 2, 0.05, 1);
	uint8_t *pl;
	dcast_chunk_info info;
	encode_forced(&r, DCAST_ENC_IDX32, &pl, &info);
	uint32_t p0, p1, big = 500;
	memcpy(&p0, pl, 4);
	memcpy(&p1, pl + 6, 4);
	memcpy(pl + 6, &p0, 4); /* repeat */
	CHECK(rejected(&info, pl, &r));
	memcpy(pl, &p1, 4); /* decreasing */
	CHECK(rejected(&info, pl, &r));
	memcpy(pl, &p0, 4);
	memcpy(pl + 6, &p1, 4);
	memcpy(pl + (info.changed - 1) * 6, &big, 4); /* out of range */
	CHECK(rejected(&info, pl, &r));
	free(pl);
	free_range(&r);
}

static void test_compact_structure(void)
{
	range r = make_range(200000, 2, 0.05, 1); /* ~10 index blocks */
	uint8_t *pl;
	dcast_chunk_info info;
	encode_forced(&r, DCAST_ENC_COMPACT, &pl, &info);
	REQUIRE(info.changed > 3 * DCAST_CPT_BLOCK);
	unsigned hb = dcast_cpt_hdr_bytes(pl[1], 16);
	uint8_t save = pl[0];
	pl[0] = 26; /* k too large */
	CHECK(rejected(&info, pl, &r));
	pl[0] = save;
	save = pl[1];
	pl[1] = 2; /* unknown mode */
	CHECK(rejected(&info, pl, &r));
	pl[1] = save;
	pl[hb - 1] ^= 0x80; /* header padding */
	CHECK(rejected(&info, pl, &r));
	pl[hb - 1] ^= 0x80;
	for (unsigned i = 0; i < 16; i++) { /* every index field, every byte */
		pl[hb + i] ^= 1;
		CHECK(rejected(&info, pl, &r));
		pl[hb + i] ^= 1;
	}
	dcast_chunk_info longer = info;
	longer.payload_bytes++; /* trailing garbage byte (zero) */
	CHECK(rejected(&longer, pl, &r));
	for (uint64_t i = 0; i < info.payload_bytes; i += 97) { /* truncations */
		dcast_chunk_info t = info;
		t.payload_bytes = i;
		CHECK(rejected(&t, pl, &r));
	}
	CHECK(!rejected(&info, pl, &r));
	free(pl);
	free_range(&r);
}

/* A bad table: lengths that overfill the Kraft sum, or one above LMAX. */
static void test_compact_table(void)
{
	range r = make_range(5000, 2, 0.05, 1);
	uint8_t *pl;
	dcast_chunk_info info;
	encode_forced(&r, DCAST_ENC_COMPACT, &pl, &info);
	REQUIRE(pl[1] == DCAST_CPT_CODED);
	uint8_t t0 = pl[2];
	pl[2] = 0x11; /* two codes of length 1, plus the rest */
	CHECK(rejected(&info, pl, &r));
	pl[2] = 0xd0 | (t0 & 15); /* length 13 */
	CHECK(rejected(&info, pl, &r));
	pl[2] = t0;
	CHECK(!rejected(&info, pl, &r));
	free(pl);
	free_range(&r);
}

/* RL-like bf16 at 1% (changes of one ulp, a few of two): the compact code
 * lands under 12 bits a change and within 1.15x of the entropy bound. */
static void test_compact_size(void)
{
	range r = make_range(1u << 20, 2, 0, 0);
	uint64_t sizes[DCAST_ENC_COUNT], changed, twos = 0, n = r.count;
	for (uint64_t i = 0; i < n; i++) {
		if (rnd01() >= 0.01)
			continue;
		uint32_t b = dcast_load_elem(r.base + 2 * i, 2), zz = rnd01() < 0.05 ? 3 + (rnd() & 1) : 1 + (rnd() & 1);
		twos += zz > 2;
		dcast_store_elem(r.cur + 2 * i, 2, dcast_ulp_apply(b, zz, 16));
	}
	CHECK_ERR(dcast_codec_sizes(r.cur, r.base, n, 2, sizes, &changed), DCAST_OK);
	double p = (double)changed / (double)n, q = (double)twos / (double)changed;
	double hpos = -(double)n * (p * log2(p) + (1 - p) * log2(1 - p));
	double hval = -(double)changed * ((1 - q) * log2((1 - q) / 2) + q * log2(q / 2));
	double bits = 8.0 * (double)sizes[DCAST_ENC_COMPACT];
	printf("compact at 1%%: %.2f bits per changed element, %.3fx the entropy bound\n",
	       bits / (double)changed, bits / (hpos + hval));
	CHECK(bits / (double)changed < 12.0);
	CHECK(bits < 1.15 * (hpos + hval));
	free_range(&r);
}

/* Changes at the given gaps (gap: elements skipped before the change),
 * each by a difference of zz 1..80 (so both below and above the emitter's
 * table of 64). */
static range range_at_gaps(const uint64_t *gaps, unsigned n, unsigned es)
{
	uint64_t count = 0;
	for (unsigned i = 0; i < n; i++)
		count += gaps[i] + 1;
	range r = make_range(count, es, 0, 0);
	uint64_t at = 0;
	for (unsigned i = 0; i < n; i++) {
		at += gaps[i];
		uint32_t b = dcast_load_elem(r.base + at * es, es), c = b;
		while (c == b)
			c = dcast_ulp_apply(b, 1 + (uint32_t)(rnd() % 80), 8 * es);
		dcast_store_elem(r.cur + at * es, es, c);
		at++;
	}
	return r;
}

/* Gaps of about 2^s, and one change in 24 at a gap of j * 2^s for j =
 * 0..45, so that with the Rice parameter k the plan picks (about s) the
 * quotients run over 0 .. QESC and past it.  Returns how many. */
static unsigned sweep_gaps(unsigned s, uint64_t *gaps)
{
	unsigned n = 0;
	for (unsigned j = 0; j < 46; j++) {
		for (unsigned i = 0; i < 23; i++)
			gaps[n++] = (1ull << s) + (rnd() & ((1ull << s) - 1) & 7);
		gaps[n++] = ((uint64_t)j << s) + (rnd() & ((1ull << s) - 1));
	}
	return n;
}

/* The compact emitter builds, per chunk, the bits of every usual element
 * (gap quotient q below QESC, difference below 64) for its Rice parameter
 * k.  For k from 0 up, gaps whose quotients cover every row of that table
 * and the escape past it, differences below and above 64: every payload
 * must round-trip exactly, and the test checks that the last row and the
 * escape were written for many k. */
static void test_compact_rows(void)
{
	static uint64_t gaps[46 * 24];
	unsigned ks_last_row = 0, ks_escape = 0;
	for (unsigned es = 1; es <= 4; es *= 2)
		for (unsigned s = 0; s <= 11; s++) {
			unsigned n = sweep_gaps(s, gaps);
			range r = range_at_gaps(gaps, n, es);
			uint8_t *pl;
			dcast_chunk_info info;
			encode_forced(&r, DCAST_ENC_COMPACT, &pl, &info);
			CHECK(info.changed == n);
			for (unsigned i = 0; pl[1] == DCAST_CPT_CODED && i < n; i++) { /* byte 0: k */
				ks_last_row |= (uint32_t)(gaps[i] >> pl[0] == DCAST_CPT_QESC - 1) << pl[0];
				ks_escape |= (uint32_t)(gaps[i] >> pl[0] >= DCAST_CPT_QESC) << pl[0];
			}
			roundtrip(&r, DCAST_ENC_COMPACT);
			free(pl);
			free_range(&r);
		}
	CHECK(__builtin_popcount(ks_last_row) >= 10);
	CHECK(__builtin_popcount(ks_escape) >= 10);
}

/* The fast compact decoder alone (header parsed as dcast_cpt_decode does):
 * 0 accepted, -1 refused, -2 header refused before it runs. */
static int fast_decode(const dcast_chunk_info *info, const uint8_t *pl, uint32_t *pos, uint32_t *val)
{
	dcast_cpt_dec d;
	dcast_cpt_table t;
	if (dcast_cpt_hdr_parse(pl, info->payload_bytes, 8 * info->elem_size, &d, &t))
		return -2;
	uint64_t hb = dcast_cpt_hdr_bytes(d.mode, d.w), off = hb + dcast_cpt_index_bytes(info->changed);
	if (off > info->payload_bytes)
		return -2;
	d.stream = pl + off;
	d.stream_bytes = info->payload_bytes - off;
	d.count = info->count;
	d.lut = NULL;
	return dcast_cpt_decode_fast(&d, &t, pl + hb, info->changed, pos, val);
}

/* The fast decoder accepts exactly what the checking one accepts, with the
 * same positions and values (compact2: its decoder, whose fast path hands
 * every failure to the lane-by-lane reference, against that reference). */
static void fast_agrees(const dcast_chunk_info *info, const uint8_t *pl)
{
	size_t n = info->changed + 1;
	uint32_t *p1 = malloc(n * 4), *v1 = malloc(n * 4), *p2 = malloc(n * 4), *v2 = malloc(n * 4);
	unsigned mode;
	REQUIRE(p1 && v1 && p2 && v2);
	int v2enc = info->encoding == DCAST_ENC_COMPACT2;
	int rf = v2enc ? (dcast_cpt2_decode(info, pl, p1, v1, &mode) ? -1 : 0) : fast_decode(info, pl, p1, v1);
	int rr = v2enc ? dcast_cpt2_decode_checked(info, pl, p2, v2, &mode)
		       : dcast_cpt_decode_checked(info, pl, p2, v2, &mode);
	if (rf != -2) {
		CHECK((rf == 0) == (rr == DCAST_OK));
		CHECK(rf || (!memcmp(p1, p2, info->changed * 4) && !memcmp(v1, v2, info->changed * 4)));
	}
	free(p1);
	free(v1);
	free(p2);
	free(v2);
}

/* Valid payloads of every shape the fast decoder has a path for (coded and
 * raw values, 1/2/4-byte elements, escaped gaps, Rice codes so long the
 * value needs a second load, a partial last block, lanes in lockstep), then
 * random bit flips and byte overwrites of each. */
static void fast_case(range *r, int want_mode)
{
	for (int enc = DCAST_ENC_COMPACT; enc <= DCAST_ENC_COMPACT2; enc++) {
		uint8_t *pl;
		dcast_chunk_info info;
		encode_forced(r, enc, &pl, &info);
		CHECK(want_mode < 0 || pl[1] == want_mode);
		fast_agrees(&info, pl);
		for (unsigned i = 0; i < 400 && info.payload_bytes; i++) {
			uint64_t at = rnd() % info.payload_bytes;
			uint8_t save = pl[at];
			pl[at] = i & 1 ? (uint8_t)rnd() : (uint8_t)(save ^ (1u << (rnd() & 7)));
			fast_agrees(&info, pl);
			pl[at] = save;
		}
		free(pl);
	}
	free_range(r);
}

/* Changes in two dense clusters far apart: the gap between them escapes. */
static range clustered(uint64_t count, unsigned es)
{
	range r = make_range(count, es, 0, 0);
	for (uint64_t i = 0; i < count; i++)
		if ((i < count / 16 || i >= count - count / 16) && rnd01() < 0.5)
			dcast_store_elem(r.cur + i * es, es,
					 dcast_ulp_apply(dcast_load_elem(r.base + i * es, es), 1 + (rnd() & 1), 8 * es));
	return r;
}

/* Every change a random bit pattern: raw values are the smaller. */
static range random_changes(uint64_t count, unsigned es, double density)
{
	range r = make_range(count, es, 0, 0);
	for (uint64_t i = 0; i < count; i++)
		if (rnd01() < density)
			dcast_store_elem(r.cur + i * es, es, ~dcast_load_elem(r.base + i * es, es));
	return r;
}

/* Every change +1 ulp: one value symbol, a code of one bit, so that a
 * flipped bit can match no code. */
static range one_symbol(uint64_t count, unsigned es, double density)
{
	range r = make_range(count, es, 0, 0);
	for (uint64_t i = 0; i < count; i++)
		if (rnd01() < density)
			dcast_store_elem(r.cur + i * es, es, dcast_ulp_apply(dcast_load_elem(r.base + i * es, es), 2, 8 * es));
	return r;
}

static void test_fast_decoder(void)
{
	for (unsigned es = 1; es <= 4; es *= 2) {
		range r = make_range(200000, es, 0.05, 1); /* ~10 blocks: lockstep and alone */
		fast_case(&r, DCAST_CPT_CODED);
		r = clustered(400000, es);
		fast_case(&r, -1);
		r = random_changes(120000, es, 0.1);
		fast_case(&r, DCAST_CPT_RAW);
		r = one_symbol(100000, es, 0.1);
		fast_case(&r, DCAST_CPT_CODED);
	}
	range r = make_range(1u << 22, 4, 0.00002, 1); /* k ~ 15: long Rice codes, long values */
	fast_case(&r, -1);
	/* Fewer than 1024 changes: a lut of fewer index bits (lut_bits), long
	 * values through value_long; 2 to ~650 changes, the ends always. */
	for (unsigned es = 1; es <= 4; es *= 2)
		for (uint64_t n = 64; n <= 65536; n *= 4) {
			r = make_range(n, es, 0.01, 1);
			fast_case(&r, -1);
		}
}

/* Payload bytes must not change (the CUDA twin writes the same ones): a
 * hash over payloads of fixed inputs (every element size; sparse, RL-like,
 * long differences, random values, all changed; a clustered range whose
 * gap escapes), every encoding forced and picked (without
 * DCAST_ENCODE_COMPACT2).  The value since compact2 (id 4) joined; the
 * encodings 0..3, forced and picked, still hash to 0xa6539e6c53b6af5c, the
 * value the encoder gave before its speed work (commit 0f43f06).  Each
 * range reseeds rnd(), so the inputs do not depend on the tests run before. */
#define GOLDEN_HASH 0x1c34ab37981410b3ull

static uint32_t golden_change(uint32_t x, unsigned w)
{
	uint64_t k = rnd() % 16;
	return k < 12 ? dcast_ulp_apply(x, 1 + (uint32_t)(k & 1), w)
	       : k < 15 ? dcast_ulp_apply(x, 3 + (uint32_t)(rnd() % 300), w)
			: (uint32_t)rnd() & dcast_mask_w(w);
}

static uint64_t golden_range(unsigned es, double density, uint64_t n, int clustered)
{
	uint8_t *b = malloc(n * es), *c = malloc(n * es), *out = malloc(dcast_codec_bound(n, es));
	unsigned w = 8 * es;
	uint64_t h = 0;
	REQUIRE(b && c && out);
	for (uint64_t i = 0; i < n; i++) {
		uint32_t x = (uint32_t)rnd() & dcast_mask_w(w), y = x;
		double u = (double)(rnd() >> 11) / 9007199254740992.0;
		int in = !clustered || i < n / 16 || i >= n - n / 16;
		if (in && u < density)
			y = golden_change(x, w);
		dcast_store_elem(b + i * es, es, x);
		dcast_store_elem(c + i * es, es, y);
	}
	for (int e = -1; e < DCAST_ENC_COUNT; e++) {
		dcast_chunk_info info;
		REQUIRE(dcast_codec_encode(c, b, n, es, e, 0, out, dcast_codec_bound(n, es), &info) == DCAST_OK);
		h = h * 31 + dcast_checksum(out, info.payload_bytes) + info.payload_bytes * 7 + info.encoding +
		    info.changed * 3;
	}
	free(b);
	free(c);
	free(out);
	return h;
}

static void golden_bytes(void)
{
	static const double dens[] = { 0.0005, 0.01, 0.05, 0.3, 1.0 };
	uint64_t h = 0;
	for (unsigned es = 1; es <= 4; es *= 2) {
		for (unsigned d = 0; d < DCAST_ARRAY_LEN(dens); d++) {
			rng_state = es * 100 + d;
			h = h * 31 + golden_range(es, dens[d], 70001, 0);
		}
		rng_state = es;
		h = h * 31 + golden_range(es, 0.5, 300000, 1);
		h = h * 31 + golden_range(es, 0.00002, 1u << 21, 0);
	}
	printf("golden payload hash %016" PRIx64 "\n", h);
	CHECK(h == GOLDEN_HASH);
}

static const int simd_all[] = { DCAST_SIMD_PORTABLE, DCAST_SIMD_AVX2, DCAST_SIMD_AVX512 };
static const char *simd_name[] = { "auto", "portable", "AVX2", "AVX-512" };
static const char *build_name[] = { "plain", "AVX2", "AVX-512" };

/* Forces variant simd; 0 when this CPU lacks it.  Each variant runs its
 * own compact v2 build: the scalar one, AVX2, AVX-512 (AVX2 where the CPU
 * lacks AVX512CD or AVX512VL). */
static int force_variant(int simd)
{
	if (dcast_simd_force(simd) != simd)
		return 0;
	int want = simd == DCAST_SIMD_PORTABLE ? DCAST_CPT2_PLAIN
		   : simd == DCAST_SIMD_AVX2 || !dcast_simd_avx512() ? DCAST_CPT2_AVX2 : DCAST_CPT2_AVX512;
	CHECK(dcast_cpt2_build() == want);
	return 1;
}

/* fn under every compare variant this CPU has (each has its own scan and
 * gather, and its compact v2 build), then back to the automatic choice;
 * says which it could not run. */
static void each_variant(const char *what, void (*fn)(void))
{
	for (size_t i = 0; i < DCAST_ARRAY_LEN(simd_all); i++) {
		if (!force_variant(simd_all[i])) {
			printf("%s, compare variant %s: not run, this CPU lacks it\n", what, simd_name[simd_all[i]]);
			continue;
		}
		printf("%s, compare variant %s, compact v2 build %s\n", what, simd_name[simd_all[i]],
		       build_name[dcast_cpt2_build()]);
		fn();
	}
	dcast_simd_force(DCAST_SIMD_AUTO);
}

/* Apply under variant simd, of payload pl onto dst, a copy of base made
 * here: its return, and the error it names into err. */
static int apply_under(int simd, const dcast_chunk_info *info, const uint8_t *pl, const range *r, uint8_t *dst,
		       char err[256])
{
	memcpy(dst, r->base, r->count * r->es);
	force_variant(simd);
	int rc = dcast_codec_apply(info, pl, dst, NULL);
	snprintf(err, 256, "%s", rc ? dcast_last_error() : "");
	return rc;
}

/* Every single-bit flip of a compact v2 payload (coded and raw values,
 * escaped gaps, a partial round) gets the same answer from every compact
 * v2 build this CPU has: the same elements written, or refused with the
 * same error. */
static void v2_flips_agree(range *r)
{
	uint64_t bytes = r->count * r->es;
	uint8_t *pl, *want = malloc(bytes + 1), *got = malloc(bytes + 1);
	dcast_chunk_info info;
	char want_err[256], got_err[256];
	REQUIRE(want && got);
	encode_forced(r, DCAST_ENC_COMPACT2, &pl, &info);
	for (uint64_t i = 0; i < info.payload_bytes; i++)
		for (unsigned b = 0; b < 8; b++) {
			pl[i] ^= (uint8_t)(1u << b);
			int rc = apply_under(DCAST_SIMD_PORTABLE, &info, pl, r, want, want_err);
			for (size_t v = 1; v < DCAST_ARRAY_LEN(simd_all); v++)
				if (dcast_simd_force(simd_all[v]) == simd_all[v])
					CHECK(apply_under(simd_all[v], &info, pl, r, got, got_err) == rc &&
					      !strcmp(got_err, want_err) && !memcmp(got, want, bytes));
			pl[i] ^= (uint8_t)(1u << b);
		}
	dcast_simd_force(DCAST_SIMD_AUTO);
	free(pl);
	free(want);
	free(got);
	free_range(r);
}

static void test_v2_builds_agree(void)
{
	for (unsigned es = 1; es <= 4; es *= 2) {
		range r = make_range(600, es, 0.1, 1);
		v2_flips_agree(&r);
		r = clustered(3000, es);
		v2_flips_agree(&r);
		r = random_changes(400, es, 0.1);
		v2_flips_agree(&r);
	}
}

static void v2_corrupt(void)
{
	for (unsigned es = 1; es <= 4; es *= 2)
		corrupt_all_bits(DCAST_ENC_COMPACT2, es);
}

int main(void)
{
	each_variant("round trips", test_roundtrips);
	test_anchor_and_args();
	for (int e = 0; e < DCAST_ENC_COUNT; e++)
		for (unsigned es = 1; es <= 4; es *= 2)
			corrupt_all_bits(e, es);
	test_idx32_positions();
	test_compact_structure();
	test_compact_table();
	test_compact_size();
	test_compact_rows();
	each_variant("fast decoders", test_fast_decoder);
	each_variant("compact v2 corrupted", v2_corrupt);
	test_v2_builds_agree();
	each_variant("golden bytes", golden_bytes);
	return check_done("test_codec");
}
