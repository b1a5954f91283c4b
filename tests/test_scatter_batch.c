/* The batch scatter (kernels/dcast_batch.h) against plain loops: on fresh
 * seeded random batches of segments of 1-, 2-, 4- and 8-byte elements
 * (empty ones, ones over a tile), with every output slot poisoned first,
 * the CPU twin's scatter writes exactly the new values at the positions,
 * saves the old ones, and its swapped second pass brings every range back
 * bit for bit, whole or for a prefix of the segments (an apply cut off
 * halfway).  Payloads of every sparse encoding decoded ahead
 * (dcast_batch_decode) and resolved by the twin give dcast_codec_resolve's
 * positions, old and new values and digest move, and applied give
 * dcast_codec_apply's bytes; damaged payloads get dcast_codec_apply's
 * error code.  Compact payloads decoded block by block as the device
 * decodes them (batch_decode.h: every block on its own from the index,
 * then the chain check) give the CPU decoder's positions and codes, and a
 * damaged one its error code and text.  test_gpu_codec holds the kernels
 * to this twin. */
#include <stdint.h>
#include "check.h"
#include "batch_cases.h"
#include "batch_decode.h"
#include "deltacast/codec.h"

#define POISON BC_POISON

static uint64_t rng_state;

static uint64_t rnd(void)
{
	return bc_rnd(&rng_state);
}

static void test_scatter_twin(void)
{
	for (int round = 0; round < 40; round++) {
		tbatch t;
		tbatch_make(&t, 1 + rnd() % 12, round % 4 ? 300 : 3000, &rng_state);
		unsigned char *nv = malloc(t.b.d.val_bytes + 1);
		memcpy(nv, t.b.new_vals, t.b.d.val_bytes);
		uint64_t cut = rnd() % (t.b.d.n_seg + 1);
		dcast_batch_scatter_cpu(&t.b, 0, 0, cut); /* cut off after `cut` segments */
		CHECK(tbatch_applied_as(&t, 0, cut));
		dcast_batch_scatter_cpu(&t.b, 1, 0, cut);
		CHECK(!memcmp(t.ranges, t.before, t.range_bytes));
		CHECK(!memcmp(nv, t.b.new_vals, t.b.d.val_bytes));
		dcast_batch_scatter_cpu(&t.b, 0, 0, t.b.d.n_seg);
		CHECK(tbatch_applied_as(&t, 0, t.b.d.n_seg));
		dcast_batch_scatter_cpu(&t.b, 1, 0, t.b.d.n_seg);
		CHECK(!memcmp(t.ranges, t.before, t.range_bytes));
		free(nv);
		tbatch_free(&t);
	}
}

/* ---- payloads decoded ahead, against the codec ---- */

typedef struct pcase {
	uint64_t count;
	unsigned es;
	unsigned char *base, *cur, *pl;
	dcast_chunk_info info;
} pcase;

static void pcase_make(pcase *p, uint64_t count, unsigned es, double density, int enc)
{
	size_t cap = dcast_codec_bound(count, es);

	p->count = count, p->es = es;
	p->base = malloc(count * es + 1), p->cur = malloc(count * es + 1), p->pl = malloc(cap);
	for (uint64_t i = 0; i < count * es; i++)
		p->base[i] = p->cur[i] = (unsigned char)rnd();
	for (uint64_t i = 0; i < count; i++)
		if ((double)(rnd() >> 11) / 9007199254740992.0 < density || i == 0)
			p->cur[i * es + (rnd() % 8 ? 0 : es - 1)] ^= (unsigned char)(1 + rnd() % 3);
	REQUIRE(dcast_codec_encode(p->cur, p->base, count, es, enc, 0, p->pl, cap, &p->info) == DCAST_OK);
}

static void pcase_free(pcase *p)
{
	free(p->base), free(p->cur), free(p->pl);
}

/* A one-segment batch of p's payload over dst (a copy of p->base). */
static void one_seg(dcast_batch *b, unsigned char **buf, const pcase *p, unsigned char *dst, uint32_t tensor,
		    uint64_t start)
{
	dcast_batch_dims d = { 1, dcast_batch_tiles(p->info.changed), p->info.changed,
			       dcast_batch_val_bytes(p->info.changed, p->es) };
	unsigned mode;

	*buf = malloc(dcast_batch_bytes(&d));
	memset(*buf, POISON, dcast_batch_bytes(&d));
	dcast_batch_map(b, *buf, &d);
	REQUIRE(dcast_batch_decode(&p->info, p->pl, b->pos, b->code, &mode) == DCAST_OK);
	b->seg[0] = (dcast_batch_seg){ .dst = (uintptr_t)dst, .start = start, .count = (uint32_t)p->info.changed,
				       .tensor = tensor, .elem_size = p->es, .mode = mode };
	dcast_batch_tile_up(b);
}

static void check_resolve(const pcase *p)
{
	uint64_t n = p->info.changed, bytes = p->count * p->es, move = 0;
	uint32_t tensor = (uint32_t)(rnd() % 7);
	uint64_t start = rnd() % (1ull << 33);
	unsigned char *dst = malloc(bytes + 1), *want = malloc(bytes + 1), *buf;
	uint32_t *pos = malloc(n * 4 + 4);
	unsigned char *old = malloc(n * p->es + 1), *nv = malloc(n * p->es + 1);
	dcast_batch b;

	memcpy(dst, p->base, bytes), memcpy(want, p->base, bytes);
	REQUIRE(dcast_codec_resolve(&p->info, p->pl, p->base, pos, old, nv, tensor, start, &move) == DCAST_OK);
	REQUIRE(dcast_codec_apply(&p->info, p->pl, want, NULL) == DCAST_OK);
	one_seg(&b, &buf, p, dst, tensor, start);
	dcast_batch_resolve_cpu(&b);
	CHECK(!memcmp(b.pos, pos, n * 4));
	CHECK(!memcmp(b.old_vals, old, n * p->es) && !memcmp(b.new_vals, nv, n * p->es));
	CHECK(b.seg[0].move == move);
	dcast_batch_scatter_cpu(&b, 0, 0, 1);
	CHECK(!memcmp(dst, want, bytes));
	dcast_batch_scatter_cpu(&b, 1, 0, 1);
	CHECK(!memcmp(dst, p->base, bytes));
	free(dst), free(want), free(buf), free(pos), free(old), free(nv);
}

/* Damaged copies of p's payload: the decode ahead refuses each as apply
 * does, with apply's code. */
static void check_damage(const pcase *p)
{
	uint64_t n = p->info.changed;
	uint32_t *pos = malloc(n * 4 + 4), *code = malloc(n * 4 + 4);
	unsigned char *bad = malloc(p->info.payload_bytes + 1), *dst = malloc(p->count * p->es + 1);
	unsigned mode;

	for (int round = 0; round < 24 && p->info.payload_bytes; round++) {
		dcast_chunk_info info = p->info;
		memcpy(bad, p->pl, info.payload_bytes);
		if (round % 6 == 5)
			info.payload_bytes -= 1 + rnd() % info.payload_bytes / 2; /* cut short */
		else
			bad[rnd() % info.payload_bytes] ^= (unsigned char)(1u << (rnd() % 8));
		memcpy(dst, p->base, p->count * p->es);
		int want = dcast_codec_apply(&info, bad, dst, NULL);
		CHECK_ERR(dcast_batch_decode(&info, bad, pos, code, &mode), want);
	}
	free(pos), free(code), free(bad), free(dst);
}

static void test_decode_ahead(void)
{
	static const uint64_t counts[] = {1, 999, 4096, 70001};
	static const double dens[] = {0.001, 0.01, 0.3};

	for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
		for (size_t j = 0; j < sizeof(dens) / sizeof(dens[0]); j++)
			for (unsigned es = 1; es <= 4; es *= 2)
				for (int enc = DCAST_ENC_IDX32; enc < DCAST_ENC_COUNT; enc++) {
					pcase p;
					pcase_make(&p, counts[i], es, dens[j], enc);
					check_resolve(&p);
					check_damage(&p);
					pcase_free(&p);
				}
	pcase p;
	unsigned mode;
	pcase_make(&p, 100, 2, 0.5, DCAST_ENC_DENSE);
	CHECK_ERR(dcast_batch_decode(&p.info, p.pl, NULL, NULL, &mode), DCAST_EINVAL);
	pcase_free(&p);
}

/* ---- compact payloads decoded as the device decodes them ---- */

/* Damage p's payload (kept valid in length) one time in two: a flipped
 * bit, or its last bytes cut off. */
static void maybe_damage(pcase *p)
{
	uint64_t n = p->info.payload_bytes;

	if (rnd() % 2 || !n)
		return;
	if (rnd() % 4 == 0)
		p->info.payload_bytes -= 1 + rnd() % (n < 8 ? n : 8);
	else
		p->pl[rnd() % n] ^= (unsigned char)(1u << (rnd() % 8));
}

/* What the CPU says of p: its error and text, its positions and codes. */
static int cpu_verdict(const pcase *p, char *why, size_t why_len, uint32_t *pos, uint32_t *code)
{
	unsigned char *dst = malloc(p->count * p->es + 1);
	unsigned mode;
	int rc;

	memcpy(dst, p->base, p->count * p->es);
	rc = dcast_codec_apply(&p->info, p->pl, dst, NULL);
	snprintf(why, why_len, "%s", rc ? dcast_last_error() : "");
	if (!rc)
		REQUIRE(dcast_batch_decode(&p->info, p->pl, pos, code, &mode) == DCAST_OK);
	free(dst);
	return rc;
}

static int dec_refused, dec_decoded; /* chunks of each verdict, over the rounds */

static void check_dec_round(uint64_t n)
{
	pcase *p = calloc(n, sizeof(*p));
	dcast_chunk_info *info = calloc(n, sizeof(*info));
	uint64_t total = 0, at = 0, first = 0;
	dcast_batch_ddims d;
	dcast_batch_dec x;

	for (uint64_t c = 0; c < n; c++) {
		int v2 = rnd() % 2; /* compact2's blocks are 4096 changes: longer ranges */
		pcase_make(&p[c], 1 + rnd() % (v2 ? 50000 : 9000), 1u << (rnd() % 3), rnd() % 2 ? 0.01 : 0.2,
			   v2 ? DCAST_ENC_COMPACT2 : DCAST_ENC_COMPACT);
		maybe_damage(&p[c]);
		info[c] = p[c].info;
		total += info[c].changed;
	}
	dcast_batch_ddims_for(info, n, &d);
	unsigned char *buf = malloc(dcast_batch_dbytes(&d));
	uint32_t *pos = malloc(total * 4 + 4), *code = malloc(total * 4 + 4);
	uint32_t *rpos = malloc(total * 4 + 4), *rcode = malloc(total * 4 + 4);
	int *want = calloc(n, sizeof(int)), *put = calloc(n, sizeof(int));
	char (*why)[512] = calloc(n, 512);
	memset(buf, POISON, dcast_batch_dbytes(&d));
	memset(pos, POISON, total * 4), memset(code, POISON, total * 4);
	dcast_batch_dmap(&x, buf, &d);
	for (uint64_t c = 0; c < n; first += info[c].changed, c++) {
		want[c] = cpu_verdict(&p[c], why[c], sizeof(why[c]), rpos + first, rcode + first);
		want[c] ? dec_refused++ : dec_decoded++;
		if ((put[c] = dcast_batch_dput(&x, c, &info[c], p[c].pl, &at, first))) {
			CHECK_ERR(put[c], want[c]);
			CHECK(!strcmp(dcast_last_error(), why[c]));
		}
	}
	dcast_batch_blk_up(&x);
	dcast_batch_decode_cpu(&x, pos, code);
	first = 0;
	for (uint64_t c = 0; c < n; first += info[c].changed, c++) {
		if (put[c])
			continue;
		int got = dcast_batch_cpt_report(&x.cpt[c]);
		CHECK_ERR(got, want[c]);
		CHECK(!got || !strcmp(dcast_last_error(), why[c]));
		if (!want[c])
			CHECK(!memcmp(pos + first, rpos + first, info[c].changed * 4) &&
			      !memcmp(code + first, rcode + first, info[c].changed * 4));
	}
	for (uint64_t c = 0; c < n; c++)
		pcase_free(&p[c]);
	free(p), free(info), free(buf), free(pos), free(code), free(rpos), free(rcode), free(want), free(put), free(why);
}

static void test_device_decode_twin(void)
{
	for (int round = 0; round < 60; round++)
		check_dec_round(1 + rnd() % 6);
	printf("device decode twin: %d chunks decoded, %d refused as the CPU refuses them\n", dec_decoded, dec_refused);
	CHECK(dec_decoded > 20 && dec_refused > 20);
}

int main(void)
{
	rng_state = 20261128;
	test_scatter_twin();
	test_decode_ahead();
	test_device_decode_twin();
	return check_done("test_scatter_batch");
}
