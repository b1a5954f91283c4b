/* CUDA codec against its CPU twin: on fresh seeded random ranges, the GPU
 * encode gives the CPU's payload bytes and info (output poisoned first),
 * GPU apply from device and from pinned host memory gives the CPU's result
 * and saved old values, corrupted payloads get the CPU's verdict with dst
 * untouched, and the GPU digests equal dcast_digest and dcast_ldigest.  A
 * producer's ranges of two tensors encoded at once (dcast_cuda_ranges_encode)
 * give each range the CPU's payload and info and the change of its
 * additive digest, move the baselines, and give up (baselines untouched)
 * past the byte limit.  The batch kernels (dcast_batch.h) give their CPU
 * twin's ranges, old and new values and digest moves on random batches of
 * 1- to 8-byte segments, applied whole or for a prefix of the segments and
 * undone; compact payloads of several chunks (some damaged) decoded in one
 * launch give the twin's positions, codes and first failures.
 * Exits 77 without a CUDA device (or in a build without CUDA). */
#include <stdint.h>
#include "check.h"
#include "deltacast/codec.h"
#include "deltacast/codec_cuda.h"
#include "batch_cases.h"
#include "batch_decode.h"

#ifndef DCAST_HAVE_CUDA
int main(void)
{
	TEST_SKIP("no CUDA device (built without CUDA)");
}
#else
#include <cuda_runtime.h>

#define POISON 0xa5

static uint64_t rng_state;

static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void *dev_alloc(size_t n)
{
	void *p = NULL;
	REQUIRE(cudaMalloc(&p, n ? n : 1) == cudaSuccess);
	REQUIRE(cudaMemset(p, POISON, n ? n : 1) == cudaSuccess);
	return p;
}

static void *to_dev(const void *h, size_t n)
{
	void *d = dev_alloc(n);
	REQUIRE(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) == cudaSuccess);
	return d;
}

static void from_dev(void *h, const void *d, size_t n)
{
	REQUIRE(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) == cudaSuccess);
}

typedef struct gcase {
	uint64_t count;
	unsigned es;
	uint8_t *base, *cur;
} gcase;

/* Mostly +-1 ulp-like changes (low bits), some random patterns. */
static gcase make_case(uint64_t count, unsigned es, double density)
{
	gcase c = { count, es, malloc(count * es + 1), malloc(count * es + 1) };
	for (uint64_t i = 0; i < count * es; i++)
		c.base[i] = c.cur[i] = (uint8_t)rnd();
	for (uint64_t i = 0; i < count; i++) {
		if ((double)(rnd() >> 11) / 9007199254740992.0 >= density && i != 0)
			continue;
		uint8_t *p = c.cur + i * es;
		if (rnd() % 8)
			p[0] ^= (uint8_t)(1 + rnd() % 3);
		else
			p[es - 1] ^= 0x80;
	}
	return c;
}

/* GPU apply of `pl` (host bytes) from device memory, from pinned memory and
 * from ordinary (pageable) host memory equals the CPU result; returns the
 * CPU's error code. */
static int apply_both(const gcase *c, const dcast_chunk_info *info, const uint8_t *pl)
{
	size_t bytes = c->count * c->es, old_bytes = (info->encoding == DCAST_ENC_DENSE ? c->count : info->changed) * c->es;
	uint8_t *cpu = malloc(bytes + 1), *cpu_old = malloc(old_bytes + 1), *gpu = malloc(bytes + 1),
		*gpu_old = malloc(old_bytes + 1), *pinned = NULL;
	memcpy(cpu, c->base, bytes);
	int want = dcast_codec_apply(info, pl, cpu, cpu_old);
	REQUIRE(cudaMallocHost((void **)&pinned, info->payload_bytes + 1) == cudaSuccess);
	memcpy(pinned, pl, info->payload_bytes);
	void *dpl = to_dev(pl, info->payload_bytes);
	const void *srcs[3] = {dpl, pinned, pl};
	for (int k = 0; k < 3; k++) {
		void *dst = to_dev(c->base, bytes), *old = dev_alloc(old_bytes);
		int got = dcast_cuda_apply(info, srcs[k], dst, old, NULL);
		CHECK_ERR(got, want);
		from_dev(gpu, dst, bytes);
		CHECK(memcmp(gpu, want ? c->base : cpu, bytes) == 0);
		if (!want && old_bytes) {
			from_dev(gpu_old, old, old_bytes);
			CHECK(memcmp(gpu_old, cpu_old, old_bytes) == 0);
		}
		cudaFree(dst);
		cudaFree(old);
	}
	cudaFree(dpl);
	cudaFreeHost(pinned);
	free(cpu), free(cpu_old), free(gpu), free(gpu_old);
	return want;
}

/* The encoding the device encoders write for enc: enc itself, or for -1
 * the smallest of 0..3 (they write no compact2). */
static int device_enc(const uint8_t *cur, const uint8_t *base, uint64_t n, unsigned es, int enc)
{
	uint64_t s[DCAST_ENC_COUNT], changed;
	int best = 0;
	if (enc >= 0)
		return enc;
	REQUIRE(dcast_codec_sizes(cur, base, n, es, s, &changed) == DCAST_OK);
	for (int e = 1; e < DCAST_ENC_COMPACT2; e++)
		best = s[e] < s[best] ? e : best;
	return best;
}

/* The device encode of c against the CPU's (compact2: refused); apply of
 * the CPU's payload on both, whole and damaged. */
static void check_case(const gcase *c, int enc)
{
	size_t cap = dcast_codec_bound(c->count, c->es), bytes = c->count * c->es;
	uint8_t *cpu_out = malloc(cap), *gpu_out = malloc(cap), *b2 = malloc(bytes + 1);
	dcast_chunk_info ci, gi;
	REQUIRE(dcast_codec_encode(c->cur, c->base, c->count, c->es, device_enc(c->cur, c->base, c->count, c->es, enc),
				   0, cpu_out, cap, &ci) == DCAST_OK);
	void *dcur = to_dev(c->cur, bytes), *dbase = to_dev(c->base, bytes);
	memset(gpu_out, POISON, cap);
	if (enc == DCAST_ENC_COMPACT2) {
		CHECK_ERR(dcast_cuda_encode(dcur, dbase, c->count, c->es, enc, DCAST_ENCODE_UPDATE_BASE, gpu_out, cap,
					    &gi, NULL), DCAST_EINVAL);
		REQUIRE(cudaMemcpy(dbase, c->cur, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
	} else {
		CHECK_ERR(dcast_cuda_encode(dcur, dbase, c->count, c->es, enc, DCAST_ENCODE_UPDATE_BASE, gpu_out, cap,
					    &gi, NULL), DCAST_OK);
		CHECK(memcmp(&ci, &gi, sizeof(ci)) == 0);
		CHECK(memcmp(cpu_out, gpu_out, ci.payload_bytes) == 0);
	}
	from_dev(b2, dbase, bytes);
	CHECK(memcmp(b2, c->cur, bytes) == 0);
	CHECK_ERR(apply_both(c, &ci, cpu_out), DCAST_OK);
	for (unsigned k = 0; k < 8 && ci.payload_bytes; k++) { /* corruptions: same verdict */
		uint64_t at = rnd() % ci.payload_bytes;
		uint8_t bit = (uint8_t)(1u << (rnd() % 8));
		cpu_out[at] ^= bit;
		apply_both(c, &ci, cpu_out);
		cpu_out[at] ^= bit;
	}
	if (check_failures)
		fprintf(stderr, "  case count=%" PRIu64 " es=%u enc=%d\n", c->count, c->es, enc);
	cudaFree(dcur), cudaFree(dbase);
	free(cpu_out), free(gpu_out), free(b2);
}

static void test_codec(void)
{
	static const uint64_t counts[] = { 0, 1, 1000, 100003, 3000000 };
	static const double dens[] = { 0, 0.001, 0.01, 0.05, 0.3, 1.0 };
	for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
		for (size_t d = 0; d < sizeof(dens) / sizeof(dens[0]); d++)
			for (unsigned es = 1; es <= 4; es *= 2) {
				gcase c = make_case(counts[i], es, dens[d]);
				for (int enc = -1; enc < DCAST_ENC_COUNT; enc++)
					check_case(&c, enc);
				free(c.base), free(c.cur);
			}
}

static void test_digest(void)
{
	static const size_t lens[] = { 0, 1, 16, 100, 240, 241, 1024, 1025, 65536 + 7, (1u << 20) - 1,
				       1u << 20, (1u << 20) + 1, 3 * (1u << 20) + 123 };
	uint8_t *h = malloc(4u << 20);
	for (size_t i = 0; i < (4u << 20); i++)
		h[i] = (uint8_t)rnd();
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		void *d = to_dev(h, lens[i]);
		uint64_t got = 0;
		CHECK_ERR(dcast_cuda_digest(d, lens[i], &got, NULL), DCAST_OK);
		CHECK(got == dcast_digest(h, lens[i]));
		cudaFree(d);
	}
	free(h);
}

/* The additive digest on the device equals the CPU's, for every element
 * size, across a 2^32-element segment boundary, and for an empty range. */
static void test_ldigest(void)
{
	static const uint64_t counts[] = { 0, 1, 31, 1000, 65536 + 7, (1u << 20) + 3 };
	static const uint64_t starts[] = { 0, 77, (1ull << 32) - 500 };
	uint8_t *h = malloc(4u << 20);
	for (size_t i = 0; i < (4u << 20); i++)
		h[i] = (uint8_t)rnd();
	for (unsigned es = 1; es <= 4; es *= 2)
		for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
			for (size_t s = 0; s < sizeof(starts) / sizeof(starts[0]); s++) {
				void *d = to_dev(h, counts[i] * es);
				uint64_t got = 1, want = 2;
				CHECK_ERR(dcast_cuda_ldigest(3, starts[s], d, counts[i], es, &got, NULL), DCAST_OK);
				CHECK_ERR(dcast_ldigest(3, starts[s], h, counts[i], es, &want), DCAST_OK);
				CHECK(got == want);
				cudaFree(d);
			}
	free(h);
}

/* A tensor for dcast_cuda_ranges_encode: host case and device copies. */
typedef struct rtensor {
	gcase c;
	void *dcur, *dbase;
	uint32_t id;
	uint64_t start;
} rtensor;

/* Result k (range `at` of tensor t) against the CPU encode of that range. */
static void check_range(const rtensor *t, const dcast_cuda_ranges *r, uint64_t range, uint64_t at, uint64_t k,
			int enc)
{
	const gcase *c = &t->c;
	uint64_t off = at * range, n = c->count - off < range ? c->count - off : range, move = 0, before, after;
	size_t cap = dcast_codec_bound(n, c->es);
	uint8_t *cpu_out = malloc(cap);
	dcast_chunk_info ci, gi;
	const void *pl = NULL;

	REQUIRE(dcast_codec_encode(c->cur + off * c->es, c->base + off * c->es, n, c->es,
				   device_enc(c->cur + off * c->es, c->base + off * c->es, n, c->es, enc), 0, cpu_out,
				   cap, &ci) == DCAST_OK);
	CHECK_ERR(dcast_cuda_ranges_get(r, k, &gi, &pl, &move), DCAST_OK);
	CHECK(memcmp(&ci, &gi, sizeof(ci)) == 0);
	CHECK(pl && memcmp(cpu_out, pl, ci.payload_bytes) == 0);
	REQUIRE(dcast_ldigest(t->id, t->start + off, c->base + off * c->es, n, c->es, &before) == DCAST_OK);
	REQUIRE(dcast_ldigest(t->id, t->start + off, c->cur + off * c->es, n, c->es, &after) == DCAST_OK);
	CHECK(before + move == after);
	free(cpu_out);
}

/* Tensor t's ranges appended to d (n so far); returns the new n. */
static uint64_t add_ranges(const rtensor *t, uint64_t range, dcast_cuda_range *d, uint64_t n)
{
	for (uint64_t off = 0; off < t->c.count; off += range) {
		uint64_t cnt = t->c.count - off < range ? t->c.count - off : range;
		d[n++] = (dcast_cuda_range){ (uint8_t *)t->dcur + off * t->c.es, (uint8_t *)t->dbase + off * t->c.es,
					     cnt, t->start + off, t->id };
	}
	return n;
}

/* Every result of a two-tensor encode, then both baselines equal cur. */
static void check_results(const rtensor *t, const dcast_cuda_ranges *r, uint64_t range, int enc)
{
	uint8_t *back;
	uint64_t k = 0;

	for (int i = 0; i < 2; i++) {
		for (uint64_t at = 0; at * range < t[i].c.count; at++)
			check_range(&t[i], r, range, at, k++, enc);
		back = malloc(t[i].c.count * t[i].c.es + 1);
		from_dev(back, t[i].dbase, t[i].c.count * t[i].c.es);
		CHECK(memcmp(back, t[i].c.cur, t[i].c.count * t[i].c.es) == 0);
		free(back);
	}
}

/* Two tensors of `count` and count / 3 + 5 elements in ranges of `range`,
 * encoded at once: every range checked, the baselines moved; again in
 * groups (check_split); then refused at a byte limit of 1 with the
 * baselines untouched. */
/* Changes of ranges d[0..n) (host copies in t): in all, and the most of one. */
static uint64_t range_changes(const rtensor *t, const dcast_cuda_range *d, uint64_t n, unsigned es, uint64_t *most)
{
	uint64_t all = 0;

	*most = 0;
	for (uint64_t k = 0; k < n; k++) {
		const rtensor *x = d[k].tensor == t[0].id ? &t[0] : &t[1];
		uint64_t c = 0, off = ((const uint8_t *)d[k].cur - (const uint8_t *)x->dcur) / es;
		for (uint64_t i = 0; i < d[k].count; i++)
			c += memcmp(x->c.cur + (off + i) * es, x->c.base + (off + i) * es, es) != 0;
		all += c;
		*most = c > *most ? c : *most;
	}
	return all;
}

/* The payload bytes the last encode held, each range's as it lays them
 * out (padded to 256 with at least 64 spare). */
static uint64_t held_payloads(const dcast_cuda_ranges *r, uint64_t n)
{
	uint64_t all = 0, move;
	dcast_chunk_info ci;
	const void *pl;

	for (uint64_t k = 0; k < n; k++)
		if (dcast_cuda_ranges_get(r, k, &ci, &pl, &move) == DCAST_OK)
			all += (ci.payload_bytes + 64 + 255) & ~(uint64_t)255;
	return all;
}

/* The ranges again from their old baselines, under a cap that holds half
 * of their changes' scratch (and one range's), and all their payloads: in
 * groups, held, the same results. */
static void check_split(rtensor *t, dcast_cuda_ranges *r, const dcast_cuda_range *d, uint64_t n, uint64_t range,
			unsigned es, double density, int enc)
{
	uint64_t most, all, pay = held_payloads(r, n);
	size_t cap;
	int held = 0;

	for (int i = 0; i < 2; i++)
		REQUIRE(cudaMemcpy(t[i].dbase, t[i].c.base, t[i].c.count * es, cudaMemcpyHostToDevice) == cudaSuccess);
	all = range_changes(t, d, n, es, &most);
	cap = 28 * (all / 2 > most ? all / 2 : most);
	cap = (cap > pay ? cap : pay) + 1;
	if (cap >= 28 * all)
		return; /* one group: covered above */
	CHECK_ERR(dcast_cuda_ranges_encode(r, d, n, es, enc, DCAST_ENCODE_UPDATE_BASE, cap, &held, NULL), DCAST_OK);
	CHECK(held);
	if (held)
		check_results(t, r, range, enc);
	if (check_failures)
		fprintf(stderr, "  split: cap %zu for %" PRIu64 " changes, %" PRIu64 " payload bytes, held %d, "
			"range %" PRIu64 " density %g\n", cap, all, pay, held, range, density);
}

static void check_ranges(dcast_cuda_ranges *r, uint64_t count, uint64_t range, unsigned es, double density,
			 int enc)
{
	rtensor t[2] = { { make_case(count, es, density), 0, 0, 7, (1ull << 32) - 5000 },
			 { make_case(count / 3 + 5, es, density), 0, 0, 9, 123 } };
	uint64_t nr = 2 * (count / range + 2) + 8, n = 0;
	dcast_cuda_range *d = calloc(nr, sizeof(*d));
	int held = 0;

	for (int i = 0; i < 2; i++) {
		t[i].dcur = to_dev(t[i].c.cur, t[i].c.count * es);
		t[i].dbase = to_dev(t[i].c.base, t[i].c.count * es);
		n = add_ranges(&t[i], range, d, n);
	}
	CHECK_ERR(dcast_cuda_ranges_encode(r, d, n, es, enc, DCAST_ENCODE_UPDATE_BASE, (size_t)1 << 30, &held, NULL),
		  DCAST_OK);
	CHECK(held);
	if (held)
		check_results(t, r, range, enc);
	check_split(t, r, d, n, range, es, density, enc);
	REQUIRE(cudaMemcpy(t[0].dbase, t[0].c.base, count * es, cudaMemcpyHostToDevice) == cudaSuccess);
	CHECK_ERR(dcast_cuda_ranges_encode(r, d, n, es, enc, DCAST_ENCODE_UPDATE_BASE, 1, &held, NULL), DCAST_OK);
	CHECK(!held);
	uint8_t *back = malloc(count * es + 1);
	from_dev(back, t[0].dbase, count * es);
	CHECK(memcmp(back, t[0].c.base, count * es) == 0);
	if (check_failures)
		fprintf(stderr, "  ranges count=%" PRIu64 " range=%" PRIu64 " es=%u density=%g enc=%d\n", count,
			range, es, density, enc);
	for (int i = 0; i < 2; i++) {
		cudaFree(t[i].dcur), cudaFree(t[i].dbase);
		free(t[i].c.base), free(t[i].c.cur);
	}
	free(back), free(d);
}

static void test_ranges(void)
{
	static const uint64_t counts[] = { 0, 1, 4095, 70001, 3 * 65536 + 17 };
	static const uint64_t ranges[] = { 1, 1000, 4096, 65536 + 3 };
	static const double dens[] = { 0, 0.01, 0.3, 1.0 };
	dcast_cuda_range bad = { NULL, NULL, 10, 0, 0 };
	dcast_cuda_ranges *r = dcast_cuda_ranges_new();
	int held = 1;

	REQUIRE(r);
	for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
		for (size_t g = 0; g < sizeof(ranges) / sizeof(ranges[0]); g++)
			for (size_t d = 0; d < sizeof(dens) / sizeof(dens[0]); d++)
				for (unsigned es = 1; es <= 4; es *= 2)
					if (counts[i] / ranges[g] <= 200)
						check_ranges(r, counts[i], ranges[g], es, dens[d], -1);
	for (int enc = 0; enc < DCAST_ENC_COMPACT2; enc++)
		check_ranges(r, 70001, 4096, 2, 0.05, enc);
	CHECK_ERR(dcast_cuda_ranges_encode(r, &bad, 0, 2, DCAST_ENC_COMPACT2, 0, 1 << 20, &held, NULL), DCAST_EINVAL);
	CHECK_ERR(dcast_cuda_ranges_encode(r, &bad, 1, 2, -1, 0, 1 << 20, &held, NULL), DCAST_EINVAL);
	CHECK(!held && strstr(dcast_last_error(), "range 0"));
	CHECK_ERR(dcast_cuda_ranges_get(r, 0, NULL, NULL, NULL), DCAST_EINVAL);
	dcast_cuda_ranges_free(r);
}

/* ---- the batch kernels against their CPU twin (batch.c) ---- */

/* t's batch and ranges copied to the device, segments pointing there. */
static void *batch_to_device(const tbatch *t, unsigned char **dranges, dcast_batch *host)
{
	uint64_t bytes = dcast_batch_bytes(&t->b.d);
	unsigned char *copy = malloc(bytes);
	void *dev = NULL;

	REQUIRE(cudaMalloc((void **)dranges, t->range_bytes + 1) == cudaSuccess);
	REQUIRE(cudaMemcpy(*dranges, t->ranges, t->range_bytes, cudaMemcpyHostToDevice) == cudaSuccess);
	memcpy(copy, t->buf, bytes);
	dcast_batch_map(host, copy, &t->b.d);
	for (uint64_t k = 0; k < t->b.d.n_seg; k++)
		host->seg[k].dst = (uintptr_t)(*dranges + t->range_off[k]), host->seg[k].move = 0;
	REQUIRE(cudaMalloc(&dev, bytes) == cudaSuccess);
	REQUIRE(cudaMemcpy(dev, copy, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
	return dev;
}

/* The device batch's ranges, values and moves equal the twin's. */
static void check_batch_same(const tbatch *t, void *dev, const unsigned char *dranges, const dcast_batch *host)
{
	uint64_t bytes = dcast_batch_bytes(&t->b.d);
	unsigned char *got = malloc(bytes), *r = malloc(t->range_bytes + 1);
	dcast_batch g;

	REQUIRE(cudaMemcpy(got, dev, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
	REQUIRE(cudaMemcpy(r, dranges, t->range_bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
	dcast_batch_map(&g, got, &t->b.d);
	CHECK(!memcmp(r, t->ranges, t->range_bytes));
	CHECK(!memcmp(g.old_vals, t->b.old_vals, t->b.d.val_bytes) && !memcmp(g.new_vals, t->b.new_vals, t->b.d.val_bytes));
	for (uint64_t k = 0; k < t->b.d.n_seg; k++)
		CHECK(g.seg[k].move == t->b.seg[k].move && host->seg[k].count == g.seg[k].count);
	free(got), free(r);
}

static void test_batch(void)
{
	for (int round = 0; round < 30; round++) {
		tbatch t;
		dcast_batch host;
		unsigned char *dr;
		tbatch_make(&t, 1 + rnd() % 40, round % 3 ? 500 : 5000, &rng_state);
		for (uint64_t k = 0; k < t.b.d.n_seg; k++) /* resolve: 1-4 bytes, codes as new values */
			if (t.b.seg[k].elem_size == 8)
				t.b.seg[k].elem_size = 4;
			else
				t.b.seg[k].mode = rnd() % 2 ? DCAST_BATCH_ULP : DCAST_BATCH_RAW;
		for (uint64_t i = 0; i < t.b.d.n; i++)
			t.b.code[i] = (uint32_t)rnd() & 0xff;
		void *dev = batch_to_device(&t, &dr, &host);
		uint64_t cut = rnd() % (t.b.d.n_seg + 1);
		for (uint64_t k = 0; k < t.b.d.n_seg; k++)
			t.b.seg[k].move = 0;
		dcast_batch_resolve_cpu(&t.b);
		CHECK(dcast_cuda_batch_resolve(dev, &host, NULL) == DCAST_OK);
		dcast_batch_scatter_cpu(&t.b, 0, 0, cut);
		CHECK(dcast_cuda_batch_scatter(dev, &host, 0, 0, cut, NULL) == DCAST_OK);
		CHECK(dcast_cuda_batch_sync(NULL) == DCAST_OK);
		check_batch_same(&t, dev, dr, &host);
		dcast_batch_scatter_cpu(&t.b, 1, 0, cut);
		CHECK(dcast_cuda_batch_scatter(dev, &host, 1, 0, cut, NULL) == DCAST_OK);
		CHECK(dcast_cuda_batch_sync(NULL) == DCAST_OK);
		check_batch_same(&t, dev, dr, &host);
		free(host.base);
		cudaFree(dev), cudaFree(dr);
		tbatch_free(&t);
	}
}

/* Compact payloads (v1 and v2) of n chunks, one in three damaged,
 * decoded on the device and by the twin from the same buffer: the same
 * changes and verdicts, and the twin's verdict the CPU decoder's. */
static void check_batch_decode(uint64_t n)
{
	dcast_chunk_info *info = calloc(n, sizeof(*info));
	uint8_t **pl = calloc(n, sizeof(*pl));
	uint64_t total = 0, at = 0, first = 0;
	dcast_batch_ddims d;
	dcast_batch_dec x, back;

	for (uint64_t c = 0; c < n; c++) {
		gcase g = make_case(1 + rnd() % 300000, 1u << (rnd() % 3), rnd() % 2 ? 0.01 : 0.1);
		size_t cap = dcast_codec_bound(g.count, g.es);
		pl[c] = malloc(cap);
		int enc = rnd() % 2 ? DCAST_ENC_COMPACT : DCAST_ENC_COMPACT2;
		REQUIRE(dcast_codec_encode(g.cur, g.base, g.count, g.es, enc, 0, pl[c], cap, &info[c]) == 0);
		if (rnd() % 3 == 0)
			pl[c][rnd() % info[c].payload_bytes] ^= (uint8_t)(1u << (rnd() % 8));
		total += info[c].changed;
		free(g.base), free(g.cur);
	}
	dcast_batch_ddims_for(info, n, &d);
	uint64_t bytes = dcast_batch_dbytes(&d);
	uint8_t *host = malloc(bytes), *got = malloc(bytes);
	uint32_t *pos = malloc(total * 4 + 4), *code = malloc(total * 4 + 4), *gpos = malloc(total * 4 + 4),
		 *gcode = malloc(total * 4 + 4);
	dcast_batch_dmap(&x, host, &d);
	for (uint64_t c = 0; c < n; first += info[c].changed, c++)
		dcast_batch_dput(&x, c, &info[c], pl[c], &at, first);
	dcast_batch_blk_up(&x);
	void *dev = to_dev(host, bytes), *dpos = dev_alloc(total * 4), *dcode = dev_alloc(total * 4);
	CHECK(dcast_cuda_batch_decode(dev, &x, dpos, dcode, NULL) == DCAST_OK);
	from_dev(got, dev, bytes), from_dev(gpos, dpos, total * 4), from_dev(gcode, dcode, total * 4);
	memset(pos, POISON, total * 4), memset(code, POISON, total * 4);
	dcast_batch_decode_cpu(&x, pos, code);
	dcast_batch_dmap(&back, got, &d);
	first = 0;
	for (uint64_t c = 0; c < n; first += info[c].changed, c++) {
		CHECK(back.cpt[c].err == x.cpt[c].err);
		CHECK((x.cpt[c].err != DCAST_BATCH_NO_ERR || x.cpt[c].mode == DCAST_BATCH_SKIP) ==
		      (dcast_batch_decode(&info[c], pl[c], pos + first, code + first, &(unsigned){ 0 }) != DCAST_OK));
		if (x.cpt[c].err == DCAST_BATCH_NO_ERR && x.cpt[c].mode != DCAST_BATCH_SKIP)
			CHECK(!memcmp(gpos + first, pos + first, info[c].changed * 4) &&
			      !memcmp(gcode + first, code + first, info[c].changed * 4));
	}
	cudaFree(dev), cudaFree(dpos), cudaFree(dcode);
	for (uint64_t c = 0; c < n; c++)
		free(pl[c]);
	free(info), free(pl), free(host), free(got), free(pos), free(code), free(gpos), free(gcode);
}

static void test_batch_decode(void)
{
	for (int round = 0; round < 20; round++)
		check_batch_decode(1 + rnd() % 12);
}


int main(void)
{
	if (!dcast_cuda_available())
		TEST_SKIP("no CUDA device");
	rng_state = 20260101;
	test_digest();
	test_ldigest();
	test_codec();
	test_ranges();
	test_batch();
	test_batch_decode();
	return check_done("test_gpu_codec");
}
#endif
