/* Digests and the XXH3 port: dcast_digest() equals its definition in
 * docs/protocol.md computed here with libxxhash; the host+device XXH3-64 port
 * (kernels/xxh3_hd.h) equals libxxhash on every length 0..3000 and on block
 * sizes, both walked in order and split four ways as the GPU warp does.
 * The additive digest (dcast_ldigest) equals its definition written out
 * here and fixed golden values, follows random sequences of deltas of
 * every encoding exactly when updated incrementally, and changes with any
 * flipped bit.  A payload hashed as it lands (kernels/dcast_landing.h), fed
 * in pieces of any size, gives its checksum and exactly the hashes of the
 * digest blocks it holds whole. */
#include <xxhash.h>
#include "check.h"
#include "codec_shared.h"
#include "dcast_common.h"
#include "dcast_landing.h"

#define MIB (1u << 20)

static uint8_t *random_bytes(size_t n)
{
	uint8_t *p = malloc(n + 1);
	uint64_t x = 88172645463325252ull;
	REQUIRE(p);
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		p[i] = (uint8_t)x;
	}
	return p;
}

/* The definition: XXH3-64 of each 1 MiB block (the last may be shorter),
 * then XXH3-64 of those hashes as little-endian u64s. */
static uint64_t digest_by_definition(const uint8_t *p, size_t len)
{
	size_t nb = (len + MIB - 1) / MIB;
	uint8_t *arr = malloc(nb * 8 + 1);
	REQUIRE(arr);
	for (size_t b = 0; b < nb; b++) {
		size_t n = len - b * MIB < MIB ? len - b * MIB : MIB;
		uint64_t h = XXH3_64bits(p + b * MIB, n);
		for (int i = 0; i < 8; i++)
			arr[b * 8 + i] = (uint8_t)(h >> (8 * i));
	}
	uint64_t d = XXH3_64bits(arr, nb * 8);
	free(arr);
	return d;
}

/* The long-input loop as the GPU runs it: four groups of threads each sum
 * every fourth stripe of a block, per lane. */
static uint64_t xxh3_split4(const uint8_t *in, size_t len)
{
	const uint8_t *s = dcast_xxh3_secret();
	if (len <= 240)
		return dcast_xxh3_64(in, len);
	uint64_t acc[8];
	size_t nblocks = dcast_xxh3_long_blocks(len);
	unsigned tail = dcast_xxh3_long_tail_stripes(len);
	for (unsigned l = 0; l < 8; l++) {
		acc[l] = dcast_xxh3_acc_init(l);
		for (size_t b = 0; b < nblocks; b++) {
			for (unsigned g = 0; g < 4; g++)
				acc[l] += dcast_xxh3_block_lane(in + b * DCAST_XXH_BLOCK, g,
								DCAST_XXH_STRIPES_PER_BLOCK, 4, l, s);
			acc[l] = dcast_xxh3_scramble_lane(acc[l], l, s);
		}
		for (unsigned g = 0; g < 4; g++)
			acc[l] += dcast_xxh3_block_lane(in + nblocks * DCAST_XXH_BLOCK, g, tail, 4, l, s);
		acc[l] += dcast_xxh3_last_stripe_lane(in, len, l, s);
	}
	return dcast_xxh3_merge(acc, len, s);
}

/* ---- the additive digest ---- */

/* The definition in docs/protocol.md, written out independently. */
static uint64_t mix_def(uint64_t x)
{
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t term_def(uint32_t t, uint64_t i, uint32_t bits)
{
	uint64_t seed = mix_def(((uint64_t)t << 32 | (i >> 32)) ^ 0x9e3779b97f4a7c15ull);
	return mix_def((i << 32 | bits) ^ seed);
}

static uint32_t elem(const uint8_t *p, uint64_t j, unsigned es)
{
	uint32_t v = 0;
	for (unsigned b = 0; b < es; b++)
		v |= (uint32_t)p[j * es + b] << (8 * b); /* little-endian bit pattern */
	return v;
}

static uint64_t ldigest_def(uint32_t t, uint64_t start, const uint8_t *p, uint64_t count, unsigned es)
{
	uint64_t sum = 0;
	for (uint64_t j = 0; j < count; j++)
		sum += term_def(t, start + j, elem(p, j, es));
	return sum;
}

static uint64_t ld(uint32_t t, uint64_t start, const void *p, uint64_t count, unsigned es)
{
	uint64_t d = 0xdeadull;
	REQUIRE(dcast_ldigest(t, start, p, count, es, &d) == DCAST_OK);
	return d;
}

static void test_ldigest_definition(const uint8_t *p)
{
	static const uint64_t starts[] = { 0, 1, 1000, (1ull << 32) - 37, 5ull << 40 };
	for (unsigned es = 1; es <= 4; es *= 2)
		for (size_t s = 0; s < DCAST_ARRAY_LEN(starts); s++)
			for (uint64_t n = 0; n < 80; n += 1 + n / 8) /* vector bodies and tails */
				CHECK(ld(7, starts[s], p + 3, n, es) == ldigest_def(7, starts[s], p + 3, n, es));
	CHECK(ld(0, 0, NULL, 0, 2) == 0); /* an empty range */
	CHECK(dcast_ldigest_term(3, 5, 9) == term_def(3, 5, 9));
	uint64_t d = 1;
	CHECK_ERR(dcast_ldigest(0, 0, p, 4, 3, &d), DCAST_EINVAL);
	CHECK_ERR(dcast_ldigest(0, 0, NULL, 4, 2, &d), DCAST_EINVAL);
	CHECK_ERR(dcast_ldigest(0, UINT64_MAX, p, 4, 2, &d), DCAST_EINVAL);
	CHECK(d == 1);
}

/* Fixed values, so that a GPU run (test_gpu_codec) and other
 * implementations compare against the same numbers. */
static void test_ldigest_golden(const uint8_t *p)
{
	CHECK(dcast_ldigest_term(0, 0, 0) == 0x48218226ff3cd4bfull);
	CHECK(dcast_ldigest_term(1, 1ull << 33, 0x3f80) == 0x74d16fef81768469ull);
	CHECK(ld(0, 0, p, 4096, 1) == 0xc762ca83ac8402c2ull);
	CHECK(ld(5, 123, p, 4096, 2) == 0xe234e357e849dbcdull);
	CHECK(ld(9, (1ull << 32) - 100, p, 4096, 4) == 0x4ea466f0047c49eeull);
}

/* Flipping any bit of the state changes the digest. */
static void test_ldigest_flips(uint8_t *p)
{
	for (unsigned es = 1; es <= 4; es *= 2) {
		uint64_t want = ld(2, 40, p, 64, es);
		for (unsigned bit = 0; bit < 64 * es * 8; bit++) {
			p[bit / 8] ^= (uint8_t)(1u << (bit % 8));
			CHECK(ld(2, 40, p, 64, es) != want);
			p[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		}
	}
	uint64_t x = 7, want = ld(4, 0, p, MIB, 2);
	for (int k = 0; k < 200; k++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		uint64_t bit = x % (2ull * MIB * 8);
		p[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		CHECK(ld(4, 0, p, MIB, 2) != want);
		p[bit / 8] ^= (uint8_t)(1u << (bit % 8));
	}
}

/* A random next state: `density` in 1/1000 of the elements change (1000:
 * all of them, each to a different value). */
static void mutate(uint8_t *cur, uint64_t count, unsigned es, unsigned density, uint64_t *x)
{
	for (uint64_t j = 0; j < count; j++) {
		*x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
		if (density < 1000 && *x % 1000 >= density)
			continue;
		uint32_t v = elem(cur, j, es) + 1 + (uint32_t)(*x >> 40) % 5;
		for (unsigned b = 0; b < es; b++)
			cur[j * es + b] = (uint8_t)(v >> (8 * b));
	}
}

/* Positions, old and new values of every difference (for dcast_ldigest_update). */
static uint64_t diff_arrays(const uint8_t *a, const uint8_t *b, uint64_t count, unsigned es, uint32_t *pos,
			    uint8_t *oldv, uint8_t *newv)
{
	uint64_t n = 0;
	for (uint64_t j = 0; j < count; j++)
		if (memcmp(a + j * es, b + j * es, es)) {
			pos[n] = (uint32_t)j;
			memcpy(oldv + n * es, a + j * es, es);
			memcpy(newv + n * es, b + j * es, es);
			n++;
		}
	return n;
}

typedef struct delta_run {
	unsigned es;
	uint64_t count, start;
	uint8_t *base, *cur, *live, *out, *old_out, *oldv, *newv;
	uint32_t *pos;
	uint64_t before, after, arrays; /* the three incremental digests */
} delta_run;

/* One delta of encoding enc: encode, check before apply, apply, check after. */
static void one_delta(delta_run *r, int enc, unsigned density, uint64_t *x)
{
	dcast_chunk_info info;
	uint64_t n, lo = r->count / 3, part = r->before;

	mutate(r->cur, r->count, r->es, density, x);
	n = diff_arrays(r->live, r->cur, r->count, r->es, r->pos, r->oldv, r->newv);
	REQUIRE(dcast_codec_encode(r->cur, r->base, r->count, r->es, enc, DCAST_ENCODE_UPDATE_BASE, r->out,
				   dcast_codec_bound(r->count, r->es), &info) == DCAST_OK);
	CHECK(dcast_ldigest_payload(&r->before, 6, r->start, &info, r->out, r->live, NULL, 0, info.count) == 0);
	CHECK(dcast_ldigest_payload(&part, 6, r->start, &info, r->out, r->live, NULL, 0, lo) == 0);
	CHECK(dcast_ldigest_payload(&part, 6, r->start, &info, r->out, r->live, NULL, lo, info.count) == 0);
	CHECK(part == r->before); /* a range split in two parts */
	CHECK(dcast_ldigest_update(&r->arrays, 6, r->start, r->pos, r->oldv, r->newv, n, r->es) == 0);
	REQUIRE(dcast_codec_apply(&info, r->out, r->live, r->old_out) == DCAST_OK);
	CHECK(dcast_ldigest_payload(&r->after, 6, r->start, &info, r->out, r->live, r->old_out, 0, info.count) == 0);
	uint64_t full = ld(6, r->start, r->live, r->count, r->es);
	CHECK(r->before == full && r->after == full && r->arrays == full);
	CHECK(!memcmp(r->live, r->cur, r->count * r->es));
}

static void test_ldigest_deltas(uint64_t count, unsigned es)
{
	delta_run r = { es, count, (1ull << 32) - count / 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 };
	uint64_t x = 0x1234567 + count * es, bytes = count * es + 1;
	static const unsigned density[] = { 0, 1, 10, 300, 1000 };

	r.base = random_bytes(bytes), r.cur = malloc(bytes), r.live = malloc(bytes);
	r.out = malloc(dcast_codec_bound(count, es)), r.old_out = malloc(bytes);
	r.oldv = malloc(bytes), r.newv = malloc(bytes), r.pos = malloc(count * 4 + 4);
	REQUIRE(r.cur && r.live && r.out && r.old_out && r.oldv && r.newv && r.pos);
	memcpy(r.cur, r.base, bytes);
	memcpy(r.live, r.base, bytes);
	r.before = r.after = r.arrays = ld(6, r.start, r.live, count, es);
	for (int step = 0; step < 40; step++)
		one_delta(&r, step % 5 - 1, density[(step / 5) % 5], &x);
	free(r.base), free(r.cur), free(r.live), free(r.out), free(r.old_out), free(r.oldv), free(r.newv), free(r.pos);
}

static void test_ldigest_payload_errors(const uint8_t *p)
{
	dcast_chunk_info info = { DCAST_ENC_IDX32, 2, 4, 1, 6 };
	uint8_t bad[6] = { 9, 0, 0, 0, 1, 2 }; /* position 9 of 4 */
	uint64_t d = 5;
	CHECK_ERR(dcast_ldigest_payload(&d, 0, 0, &info, bad, p, NULL, 0, 4), DCAST_ECORRUPT);
	bad[0] = 1;
	CHECK_ERR(dcast_ldigest_payload(&d, 0, 0, &info, bad, p, NULL, 3, 2), DCAST_EINVAL);
	CHECK_ERR(dcast_ldigest_payload(&d, 0, 0, &info, bad, p, NULL, 0, 5), DCAST_EINVAL);
	CHECK(d == 5);
	CHECK_ERR(dcast_ldigest_update(&d, 0, 0, NULL, p, p, 1, 2), DCAST_EINVAL);
	CHECK_ERR(dcast_ldigest_update(&d, 0, 0, (const uint32_t *)p, p, p, 1, 8), DCAST_EINVAL);
	CHECK(d == 5);
}

/* Payload [at, at + len) of string s (total bytes), fed in pieces of
 * `piece` bytes: its sum, and each block it holds whole by definition. */
static void landing_case(dcast_landing *l, const uint8_t *s, uint64_t total, uint64_t at, uint64_t len,
			 uint64_t piece)
{
	uint64_t first, want_first = (at + MIB - 1) / MIB, n = 0;
	const uint64_t *h;

	REQUIRE(dcast_landing_start(l, at, len, total) == 0);
	for (uint64_t off = 0; off < len; off += piece) {
		CHECK(!dcast_landing_done(l));
		dcast_landing_add(l, s + at + off, (size_t)(len - off < piece ? len - off : piece));
	}
	REQUIRE(dcast_landing_done(l));
	CHECK(dcast_landing_sum(l) == XXH3_64bits(s + at, (size_t)len));
	uint32_t got = dcast_landing_blocks(l, &first, &h);
	CHECK(first == want_first);
	for (uint64_t b = want_first; b * MIB < total && (b * MIB + MIB <= at + len || at + len == total); b++, n++) {
		uint64_t bytes = total - b * MIB < MIB ? total - b * MIB : MIB;
		CHECK(n < got && h[n] == XXH3_64bits(s + b * MIB, (size_t)bytes));
	}
	CHECK(got == n);
}

static void test_landing(const uint8_t *p)
{
	const uint64_t total = 3 * MIB + MIB / 2;
	static const uint64_t places[][2] = {
		{0, 3 * MIB + MIB / 2}, /* the whole string: its blocks join to dcast_digest */
		{MIB / 2, 2 * MIB},     /* one block whole, two cut */
		{MIB, 2 * MIB + MIB / 2}, /* to the end: the short last block is whole */
		{3 * MIB + 5, MIB / 2 - 5}, {MIB, MIB}, {MIB, MIB - 1}, {17, 0}};
	static const uint64_t pieces[] = {4093, 256 * 1024, MIB, 4 * MIB};
	dcast_landing *l = dcast_landing_new();
	uint64_t first;
	const uint64_t *h;

	REQUIRE(l);
	for (size_t i = 0; i < DCAST_ARRAY_LEN(places); i++)
		for (size_t k = 0; k < DCAST_ARRAY_LEN(pieces); k++)
			landing_case(l, p, total, places[i][0], places[i][1], pieces[k]);
	landing_case(l, p, 5000, 1000, 3000, 1); /* byte by byte */
	landing_case(l, p, total, 0, total, 65536);
	CHECK(dcast_digest_join(h = NULL, 0) == dcast_digest(p, 0));
	CHECK(dcast_landing_blocks(l, &first, &h) == 4 && first == 0);
	CHECK(dcast_digest_join(h, 4) == dcast_digest(p, total));
	CHECK(dcast_landing_start(l, MIB, 2, MIB + 1) == DCAST_EINVAL); /* past the string */
	CHECK(dcast_landing_done(l) && !dcast_landing_blocks(l, &first, &h));
	dcast_landing_free(l);
}

/* dcast_checksum, dcast_digest and a payload hashed as it lands, with the
 * XXH3 code of the level set, against libxxhash. */
static void test_xxh3_level(const uint8_t *p)
{
	for (size_t n = 0; n <= 3000; n += 7) /* short, mid and long paths */
		CHECK(dcast_checksum(p + 5, n) == XXH3_64bits(p + 5, n));
	CHECK(dcast_checksum(p, 2 * MIB + 3) == XXH3_64bits(p, 2 * MIB + 3));
	CHECK(dcast_digest(p + 1, 3 * MIB + 12345) == digest_by_definition(p + 1, 3 * MIB + 12345));
	test_landing(p);
}

int main(void)
{
	uint8_t *p = random_bytes(4 * MIB + 4096);
	for (int level = dcast_xxh3_level_set(-1); level >= 0; level--) { /* each XXH3 this CPU runs */
		dcast_xxh3_level_set(level);
		test_xxh3_level(p);
	}
	dcast_xxh3_level_set(-1);
	for (size_t len = 0; len <= 3000; len++) {
		uint64_t want = XXH3_64bits(p + (len % 13), len);
		CHECK(dcast_xxh3_64(p + (len % 13), len) == want);
		CHECK(xxh3_split4(p + (len % 13), len) == want);
	}
	static const size_t big[] = { 4096, 65535, 65536, 100001, MIB - 1, MIB, MIB + 1 };
	for (size_t i = 0; i < DCAST_ARRAY_LEN(big); i++) {
		CHECK(dcast_xxh3_64(p + 3, big[i]) == XXH3_64bits(p + 3, big[i]));
		CHECK(xxh3_split4(p + 3, big[i]) == XXH3_64bits(p + 3, big[i]));
	}
	static const size_t lens[] = { 0, 1, 17, 4096, MIB - 1, MIB, MIB + 1, 2 * MIB, 3 * MIB + 12345 };
	for (size_t i = 0; i < DCAST_ARRAY_LEN(lens); i++)
		CHECK(dcast_digest(p + 1, lens[i]) == digest_by_definition(p + 1, lens[i]));
	CHECK(dcast_digest(p, 100) != dcast_digest(p + 1, 100));
	test_ldigest_definition(p);
	test_ldigest_golden(p);
	test_ldigest_flips(p);
	test_ldigest_payload_errors(p);
	for (unsigned es = 1; es <= 4; es *= 2) {
		test_ldigest_deltas(0, es);
		test_ldigest_deltas(1, es);
		test_ldigest_deltas(37, es);
		test_ldigest_deltas(5000, es);
	}
	free(p);
	return check_done("test_digest");
}
