/* Tensor-parallel slices end to end through the real broker.  P producer parts (P = 2, then 4) each register only their tile
 * of three tiled tensors (column-parallel, row-parallel, a 3-D grid) with
 * dcast_producer_register_slice, plus a replicated tensor that part 0
 * sends; versions go out as an anchor, then sparse and dense deltas.
 * Two consumers check every version bit for bit against the natural-layout
 * reference:
 *  - "whole": a TP-1 worker that binds each tensor whole (a tiled tensor
 *    becomes a view in natural order), bound before the first apply;
 *  - "tp": a worker with another TP degree (4 against 2 parts, 2 against
 *    4) that binds its column block, its row block and a box that cuts
 *    across the producers' tiles, bound after the first apply; plus
 *    dcast_consumer_read_slice of another odd box.
 * The "tp" consumer's policy folds run from the disk (records in wire
 * order into the file's natural order), none redone from the tensors.
 * Then "whole" folds its checkpoint, which must hold the natural layout
 * (an ordinary safetensors file) with the grids in metadata, is closed and
 * opened again from it, and binds again: same bytes.  Bad slices get clear
 * errors. */
#include <stdint.h>
#include "check.h"
#include "consumer_harness.h"
#include "deltacast/consumer.h"
#include "deltacast/producer.h"
#include "deltacast/safetensors.h"

enum { T_COL, T_ROW, T_CUBE, T_NORM, NT };
static const char *names[NT] = {"col", "row", "cube", "norm"};
static const uint32_t ndims[NT] = {2, 2, 3, 1};
static const uint64_t shapes[NT][3] = {{48, 64}, {64, 40}, {4, 8, 12}, {64}};

typedef struct ref {
	uint16_t *x[NT]; /* natural layout */
	uint64_t n[NT];
} ref;

static uint64_t elems(int t)
{
	uint64_t n = 1;

	for (uint32_t d = 0; d < ndims[t]; d++)
		n *= shapes[t][d];
	return n;
}

/* Copy box (off, ext) of tensor t between the reference and a packed buffer. */
static void box_copy(const ref *r, int t, const uint64_t *off, const uint64_t *ext, uint16_t *buf, int out)
{
	uint64_t i = 0, x[3];
	uint32_t nd = ndims[t];

	for (x[0] = 0; x[0] < ext[0]; x[0]++)
		for (x[1] = 0; x[1] < (nd > 1 ? ext[1] : 1); x[1]++)
			for (x[2] = 0; x[2] < (nd > 2 ? ext[2] : 1); x[2]++, i++) {
				uint64_t n = 0;
				for (uint32_t d = 0; d < nd; d++)
					n = n * shapes[t][d] + off[d] + x[d];
				if (out)
					buf[i] = r->x[t][n];
				else
					r->x[t][n] = buf[i];
			}
}

/* The tile of part p of P for tensor t. */
static void tile_of(int t, uint32_t p, uint32_t P, uint64_t *off, uint64_t *ext)
{
	for (uint32_t d = 0; d < ndims[t]; d++)
		off[d] = 0, ext[d] = shapes[t][d];
	if (t == T_COL) /* column-parallel */
		ext[1] /= P, off[1] = p * ext[1];
	if (t == T_ROW) /* row-parallel */
		ext[0] /= P, off[0] = p * ext[0];
	if (t == T_CUBE) { /* 2 x P/2 over the last two dims */
		ext[1] /= 2, off[1] = (p % 2) * ext[1];
		ext[2] /= P / 2, off[2] = (p / 2) * ext[2];
	}
}

typedef struct part {
	dcast_producer *prod;
	uint16_t *tile[NT];
	uint64_t off[NT][3], ext[NT][3], n[NT];
} part;

static void parts_open(const tp_broker *b, const char *model, part *pt, uint32_t P)
{
	dcast_producer_opts o;

	dcast_producer_opts_init(&o);
	o.range_elems = 500; /* chunks that cross tile rows and tiles */
	for (uint32_t p = 0; p < P; p++) {
		REQUIRE(dcast_producer_open(b->producers, model, p, P, &o, &pt[p].prod) == 0);
		for (int t = 0; t < NT; t++) {
			tile_of(t, p, P, pt[p].off[t], pt[p].ext[t]);
			pt[p].n[t] = 1;
			for (uint32_t d = 0; d < ndims[t]; d++)
				pt[p].n[t] *= pt[p].ext[t][d];
			REQUIRE((pt[p].tile[t] = calloc(pt[p].n[t], 2)));
		}
	}
}

static void parts_register(part *pt, uint32_t P)
{
	for (uint32_t p = 0; p < P; p++) {
		for (int t = 0; t < T_NORM; t++)
			CHECK_ERR(dcast_producer_register_slice(pt[p].prod, names[t], DCAST_DTYPE_BF16, ndims[t],
								shapes[t], pt[p].off[t], pt[p].ext[t],
								pt[p].tile[t], DCAST_MEM_HOST), 0);
		/* replicated: part 0 sends it, the others hold none of it */
		CHECK_ERR(dcast_producer_register(pt[p].prod, names[T_NORM], DCAST_DTYPE_BF16, 1,
						  shapes[T_NORM], p ? NULL : pt[p].tile[T_NORM],
						  DCAST_MEM_HOST, 0, p ? 0 : elems(T_NORM)), 0);
	}
}

/* Every part's tiles from the reference (the ranks' local shards). */
static void parts_load(part *pt, uint32_t P, const ref *r)
{
	for (uint32_t p = 0; p < P; p++)
		for (int t = 0; t < NT; t++)
			box_copy(r, t, pt[p].off[t], pt[p].ext[t], pt[p].tile[t], 1);
}

static void parts_publish(part *pt, uint32_t P, uint64_t v)
{
	for (uint32_t p = 0; p < P; p++)
		CHECK_ERR(dcast_producer_publish(pt[p].prod, v), 0);
	for (uint32_t p = 0; p < P; p++)
		CHECK_ERR(dcast_producer_wait(pt[p].prod, v, 20000), 0);
}

/* Change about one element in `inv` of every tensor (inv 1: all). */
static void ref_step(ref *r, unsigned inv, uint64_t *seed)
{
	for (int t = 0; t < NT; t++)
		for (uint64_t i = 0; i < r->n[t]; i++)
			if (h_rand(seed) % inv == 0)
				r->x[t][i] = (uint16_t)h_rand(seed);
}

/* Poll and apply until c holds v. */
static int drive(dcast_consumer *c, uint64_t v)
{
	dcast_event ev;

	for (int i = 0; i < 300; i++) {
		uint64_t have = dcast_consumer_version(c), ready = dcast_consumer_ready_version(c);
		if (have != DCAST_VERSION_NONE && have >= v)
			return 0;
		if (ready != DCAST_VERSION_NONE && ready <= v && dcast_consumer_apply(c, ready))
			return -1;
		if (dcast_consumer_poll(c, 100, &ev))
			return -1;
	}
	return -1;
}

typedef struct bound {
	uint16_t *buf;
	int t;
	uint64_t off[3], ext[3], n;
} bound;

static int bound_ok(const ref *r, const bound *b)
{
	uint16_t *want = calloc(b->n, 2);
	int ok;

	REQUIRE(want);
	box_copy(r, b->t, b->off, b->ext, want, 1);
	ok = !memcmp(want, b->buf, b->n * 2);
	free(want);
	return ok;
}

static void bound_set(bound *b, int t, const uint64_t *off, const uint64_t *ext)
{
	b->t = t, b->n = 1;
	for (uint32_t d = 0; d < ndims[t]; d++)
		b->off[d] = off[d], b->ext[d] = ext[d], b->n *= ext[d];
	REQUIRE((b->buf = calloc(b->n, 2)));
}

static int bind_box(dcast_consumer *c, bound *b)
{
	return dcast_consumer_bind_slice(c, names[b->t], b->buf, DCAST_MEM_HOST, ndims[b->t], b->off, b->ext,
					 b->n * 2);
}

/* The other TP degree's slices, and a box across the producers' tiles. */
static uint32_t tp_slices(bound *b, uint32_t wtp, uint32_t rank)
{
	uint64_t off[3], ext[3];

	tile_of(T_COL, rank, wtp, off, ext);
	bound_set(&b[0], T_COL, off, ext);
	tile_of(T_ROW, rank, wtp, off, ext);
	bound_set(&b[1], T_ROW, off, ext);
	uint64_t o3[3] = {1, 3, 5}, e3[3] = {2, 4, 6};
	bound_set(&b[2], T_CUBE, o3, e3);
	return 3;
}

static void check_read_slice(dcast_consumer *c, const ref *r)
{
	uint64_t off[2] = {5, 7}, ext[2] = {30, 41};
	bound b;

	bound_set(&b, T_COL, off, ext);
	CHECK_ERR(dcast_consumer_read_slice(c, "col", 2, off, ext, b.buf, b.n * 2), 0);
	CHECK(bound_ok(r, &b));
	CHECK_ERR(dcast_consumer_read_slice(c, "col", 2, off, ext, b.buf, b.n * 2 - 2), DCAST_ESHAPE);
	ext[1] = 58; /* 7 + 58 > 64 */
	CHECK_ERR(dcast_consumer_read_slice(c, "col", 2, off, ext, b.buf, b.n * 2), DCAST_ESHAPE);
	free(b.buf);
}

/* The anchor file: natural layout, grids in metadata. */
static void check_anchor_file(const char *dir, const ref *r, uint32_t P)
{
	char path[700], want[32];
	dcast_st_file *f = NULL;
	size_t hdr = 0;

	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	REQUIRE(dcast_st_open(path, &f) == 0);
	snprintf(want, sizeof(want), "1x%u", P);
	CHECK(dcast_st_metadata_get(f, "deltacast.grid.col") &&
	      !strcmp(dcast_st_metadata_get(f, "deltacast.grid.col"), want));
	CHECK(dcast_st_metadata_get(f, "deltacast.grid.norm") == NULL);
	const dcast_st_tensor *s = dcast_st_find(f, "col");
	uint16_t *data = calloc(elems(T_COL), 2);
	FILE *fp = fopen(path, "rb");
	REQUIRE(s && data && fp && dcast_st_header_bytes(f, &hdr));
	REQUIRE(fseek(fp, (long)(hdr + s->data_offset), SEEK_SET) == 0);
	REQUIRE(fread(data, 2, elems(T_COL), fp) == elems(T_COL));
	CHECK(!memcmp(data, r->x[T_COL], elems(T_COL) * 2));
	fclose(fp);
	free(data);
	dcast_st_close(&f);
}

/* The fold policy's folds of a tiled model (its anchor's record, then the
 * log past a quarter of the model) read the disk alone: every range moved
 * run by run between wire order and the file's natural order, and the
 * result checked against the COMMIT digests, or it would have been redone
 * from the live tensors (counted). */
static void check_disk_folds(dcast_consumer *c)
{
	dcast_consumer_stats st;
	dcast_event ev;

	for (int i = 0; i < 100; i++) {
		dcast_consumer_stats_get(c, &st);
		if (!st.folding && st.folds >= 2)
			break;
		(void)dcast_consumer_poll(c, 100, &ev);
	}
	dcast_consumer_stats_get(c, &st);
	printf("tiled folds: %llu, %llu of them from the tensors\n", (unsigned long long)st.folds,
	       (unsigned long long)st.folds_from_tensors);
	CHECK(st.folds >= 2 && st.folds_from_tensors == 0);
}

static void check_bad_binds(dcast_consumer *c, bound *whole)
{
	uint64_t off[2] = {0, 0}, ext[2] = {48, 64}, e1[1] = {64}, o1[1] = {0};
	uint16_t tmp[64];

	CHECK_ERR(dcast_consumer_bind_slice(c, "col", tmp, DCAST_MEM_HOST, 1, off, ext, 2), DCAST_ESHAPE);
	ext[0] = 49;
	CHECK_ERR(dcast_consumer_bind_slice(c, "col", whole->buf, DCAST_MEM_HOST, 2, off, ext, 49 * 64 * 2),
		  DCAST_ESHAPE);
	CHECK_ERR(dcast_consumer_bind_slice(c, "nope", tmp, DCAST_MEM_HOST, 1, o1, e1, 128), DCAST_ENOTFOUND);
	/* norm is bound whole (untiled): no slice of it any more */
	CHECK_ERR(dcast_consumer_bind_slice(c, "norm", tmp, DCAST_MEM_HOST, 1, o1, e1, 128), DCAST_ESTATE);
}

static void run(const tp_broker *b, const char *base, uint32_t P, uint32_t wtp)
{
	char model[32], dir_w[600], dir_t[600];
	part pt[4] = {0};
	ref r = {0};
	bound whole[NT], tp[3];
	dcast_consumer *cw = NULL, *ct = NULL;
	uint64_t seed = 11 + P;
	uint32_t ntp;

	snprintf(model, sizeof(model), "tp%u", P);
	snprintf(dir_w, sizeof(dir_w), "%s/%s-whole", base, model);
	snprintf(dir_t, sizeof(dir_t), "%s/%s-tp", base, model);
	for (int t = 0; t < NT; t++) {
		r.n[t] = elems(t);
		REQUIRE((r.x[t] = calloc(r.n[t], 2)));
	}
	ref_step(&r, 1, &seed);
	parts_open(b, model, pt, P);
	parts_register(pt, P);
	parts_load(pt, P, &r);
	parts_publish(pt, P, 1);
	REQUIRE(dcast_consumer_open(b->consumers, model, dir_w, 8 << 20, NULL, &cw) == 0);
	REQUIRE(dcast_consumer_open(b->consumers, model, dir_t, 8 << 20, NULL, &ct) == 0);
	for (int i = 0; i < 100 && !dcast_consumer_tensor_count(cw); i++) /* the manifest */
		dcast_consumer_wait_version(cw, 1, 100);
	REQUIRE(dcast_consumer_tensor_count(cw) == NT);
	dcast_tensor_desc d;
	void *ptr;
	CHECK(dcast_consumer_tensor(cw, "col", &ptr, &d, NULL) == 0 && dcast_tensor_tiled(&d) &&
	      d.grid[0] == 1 && d.grid[1] == P);
	for (int t = 0; t < NT; t++) {
		uint64_t off[3] = {0, 0, 0};
		bound_set(&whole[t], t, off, shapes[t]);
		CHECK_ERR(dcast_consumer_bind(cw, names[t], whole[t].buf, DCAST_MEM_HOST, whole[t].n * 2), 0);
	}
	check_bad_binds(cw, whole);
	REQUIRE(drive(cw, 1) == 0 && drive(ct, 1) == 0);
	ntp = tp_slices(tp, wtp, wtp - 1);
	for (uint32_t i = 0; i < ntp; i++)
		CHECK_ERR(bind_box(ct, &tp[i]), 0);
	for (uint64_t v = 1; v <= 6; v++) {
		if (v > 1) {
			ref_step(&r, v == 5 ? 1 : v == 6 ? 3 : 50, &seed); /* 5: dense, 6: a third */
			parts_load(pt, P, &r);
			parts_publish(pt, P, v);
			REQUIRE(drive(cw, v) == 0 && drive(ct, v) == 0);
		}
		for (int t = 0; t < NT; t++)
			CHECK(bound_ok(&r, &whole[t]));
		for (uint32_t i = 0; i < ntp; i++)
			CHECK(bound_ok(&r, &tp[i]));
		check_read_slice(ct, &r);
	}
	check_disk_folds(ct);
	dcast_consumer_close(&ct); /* its file and records, as the folds left them, load again */
	REQUIRE(dcast_consumer_open(b->consumers, model, dir_t, 8 << 20, NULL, &ct) == 0);
	CHECK(dcast_consumer_version(ct) == 6);
	check_read_slice(ct, &r);
	CHECK_ERR(dcast_consumer_checkpoint(cw), 0);
	check_anchor_file(dir_w, &r, P);
	dcast_consumer_close(&cw);
	REQUIRE(dcast_consumer_open(b->consumers, model, dir_w, 8 << 20, NULL, &cw) == 0);
	CHECK(dcast_consumer_version(cw) == 6);
	for (int t = 0; t < NT; t++) {
		memset(whole[t].buf, 0, whole[t].n * 2);
		CHECK_ERR(dcast_consumer_bind(cw, names[t], whole[t].buf, DCAST_MEM_HOST, whole[t].n * 2), 0);
		CHECK(bound_ok(&r, &whole[t]));
	}
	dcast_consumer_close(&cw);
	dcast_consumer_close(&ct);
	for (uint32_t p = 0; p < P; p++) {
		dcast_producer_close(&pt[p].prod);
		for (int t = 0; t < NT; t++)
			free(pt[p].tile[t]);
	}
	for (int t = 0; t < NT; t++)
		free(r.x[t]), free(whole[t].buf);
	for (uint32_t i = 0; i < ntp; i++)
		free(tp[i].buf);
}

/* Registration errors name the problem. */
static void check_register_errors(const tp_broker *b)
{
	dcast_producer *p = NULL;
	uint64_t shape[2] = {6, 8}, off[2] = {0, 3}, ext[2] = {6, 2}, ext2[2] = {6, 3};
	uint16_t buf[48];

	REQUIRE(dcast_producer_open(b->producers, "bad", 0, 1, NULL, &p) == 0);
	CHECK_ERR(dcast_producer_register_slice(p, "w", DCAST_DTYPE_BF16, 2, shape, off, ext, buf,
						DCAST_MEM_HOST), DCAST_ESHAPE); /* offset 3 not a multiple of 2 */
	CHECK(strstr(dcast_last_error(), "not a tile") != NULL);
	off[1] = 0;
	CHECK_ERR(dcast_producer_register_slice(p, "w", DCAST_DTYPE_BF16, 2, shape, off, ext2, buf,
						DCAST_MEM_HOST), DCAST_ESHAPE); /* 3 does not divide 8 */
	ext2[1] = 9;
	CHECK_ERR(dcast_producer_register_slice(p, "w", DCAST_DTYPE_BF16, 2, shape, off, ext2, buf,
						DCAST_MEM_HOST), DCAST_ESHAPE); /* outside */
	CHECK_ERR(dcast_producer_register_slice(p, "w", DCAST_DTYPE_BF16, 2, shape, off, ext, buf,
						DCAST_MEM_HOST), 0);
	ext[1] = 4; /* another grid for the same tensor */
	CHECK_ERR(dcast_producer_register_slice(p, "w", DCAST_DTYPE_BF16, 2, shape, off, ext, buf,
						DCAST_MEM_HOST), DCAST_ESHAPE);
	dcast_producer_close(&p);
}

int main(void)
{
	tp_broker b = {0};
	char dir[] = "/tmp/dcast-test-tiled-XXXXXX";

	tp_install();
	alarm(110);
	REQUIRE(mkdtemp(dir));
	snprintf(b.log, sizeof(b.log), "%s/broker.log", dir);
	REQUIRE(tp_broker_start(&b) == 0);
	check_register_errors(&b);
	run(&b, dir, 2, 4);
	run(&b, dir, 4, 2);
	h_broker_stop(&b);
	check_remove_dir(dir);
	return check_done("test_tiled");
}
