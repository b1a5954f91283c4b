/* bench_gpu_model: the device path on a generated 7B-shaped model, for
 * `make bench-gpu`.  Llama-7B's tensor shapes in bf16 (6,738,415,616
 * elements, 13.48 GB) in the producer's chunk ranges of 1M elements; the
 * values an RL-like AdamW step of a 64M-element workload (rl_workload.h)
 * repeated over the model.  Per density (0.1, 1, 5, 30%):
 *   encode        the producer's device encode: the ranges in batches of
 *                 up to 128M elements (DELTACAST_DEVICE_BATCH_ELEMS, as
 *                 the producer reads it), one dcast_cuda_ranges_encode
 *                 each with the producer's 256 MB cap (a batch it does
 *                 not hold goes range by range with dcast_cuda_encode, as
 *                 the producer does);
 *   decode-ahead  the consumer's check ahead of a device-bound version:
 *                 each chunk's header checked and its payload gathered on
 *                 the host (16 threads), the batch's tables and payloads
 *                 copied, every block of every compact chunk decoded, old
 *                 values read from the live weights, new values and digest
 *                 moves made, the verdicts back: for the encoder's own
 *                 choice of payloads (compact v1 where compact) and again
 *                 with compact v2 (the CPU encoder, DCAST_ENCODE_COMPACT2);
 *   pause         the scatter of the checked version: one launch over every
 *                 chunk, the old values kept, and the stream's end waited;
 * in GB/s of the model's bytes and against a device-to-device copy of the
 * same bytes timed in the same run, the whole pause in ms, and whether the
 * batch wrote the new model bit for bit (digest) and its undo gave the old
 * one back.  Best of 3.  The last line, for scripts (1% density):
 *   gpu_pause_gbps P decode_ahead_gbps D encode_gbps E copy_gbps C
 * BENCH_GPU_MODEL_LAYERS=L: L of the 32 layers (a quick run);
 * BENCH_GPU_MODEL_DENSITIES="0.01 ...": those densities only.  Exits 77
 * ("skip: no CUDA device") without a device. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include "deltacast/codec.h"
#include "deltacast/codec_cuda.h"
#include "batch_decode.h"
#include "dcast_batch.h"
#include "rl_workload.h"

#ifndef DCAST_HAVE_CUDA
int main(void)
{
	printf("skip: no CUDA device (built without CUDA)\n");
	return 77;
}
#else
#include <cuda_runtime.h>

#define REPS 3
#define RANGE ((uint64_t)1 << 20)       /* the producer's default range_elems */
#define WORK ((uint64_t)1 << 26)        /* the workload, repeated over the model */
#define BATCH_ELEMS ((uint64_t)128 << 20) /* the producer's device batches */
#define BATCH_MAX_BYTES ((size_t)256 << 20)

static void need(int ok, const char *what)
{
	if (!ok) {
		fprintf(stderr, "bench_gpu_model: %s failed: %s (%s)\n", what, dcast_last_error(),
			cudaGetErrorString(cudaGetLastError()));
		exit(1);
	}
}

/* ---- the model: tensors cut into ranges ---- */

typedef struct chunk {
	uint64_t off;   /* first element in the model */
	uint64_t start; /* and in its tensor */
	uint64_t count;
	uint32_t tensor;
} chunk;

typedef struct model {
	uint64_t n, n_chunks, n_tensors;
	chunk *chunks;
} model;

static void add_tensor(model *m, uint64_t count)
{
	for (uint64_t s = 0; s < count; s += RANGE) {
		m->chunks = realloc(m->chunks, (m->n_chunks + 1) * sizeof(*m->chunks));
		need(m->chunks != NULL, "chunk table");
		m->chunks[m->n_chunks++] = (chunk){ m->n + s, s, count - s < RANGE ? count - s : RANGE,
						    (uint32_t)m->n_tensors };
	}
	m->n += count;
	m->n_tensors++;
}

/* Llama-7B: embeddings, 32 layers (q, k, v, o, gate, up, down, two norms),
 * the final norm, the output head; `layers` of the 32. */
static void llama7b(model *m, unsigned layers)
{
	const uint64_t h = 4096, ff = 11008, vocab = 32000;

	add_tensor(m, vocab * h);
	for (unsigned l = 0; l < layers; l++) {
		for (int k = 0; k < 4; k++)
			add_tensor(m, h * h);
		for (int k = 0; k < 3; k++)
			add_tensor(m, ff * h);
		add_tensor(m, h);
		add_tensor(m, h);
	}
	add_tensor(m, h);
	add_tensor(m, vocab * h);
}

/* ---- the run's state ---- */

typedef struct payloads {
	dcast_chunk_info *info;
	const void **pl;     /* each chunk's payload */
	void **own;          /* those this run allocated (freed at the next fill) */
} payloads;

typedef struct bench {
	model m;
	workload w;
	uint16_t *hbase, *hcur;     /* the workload, its first RANGE repeated after its end */
	void *base, *cur, *dst;     /* device: the model three times */
	dcast_cuda_ranges **ranges; /* one per encode batch, as the producer keeps them */
	dcast_cuda_range *rdesc;
	uint64_t n_batches, *batch_first, *batch_n;
	payloads v1, v2;
	void *slot;                 /* pinned, dcast_codec_bound(RANGE) */
	unsigned threads;
	/* the consumer's batch: host tables (pageable) and the device copy */
	unsigned char *hbatch, *hdec;
	uint64_t hbatch_cap, hdec_cap;
	void *dbatch, *ddec;
	uint64_t dbatch_cap, ddec_cap;
	dcast_batch b;
	dcast_batch_dec x;
	uint32_t *cpt_of; /* chunk -> its entry in x.cpt (UINT32_MAX: none) */
	int64_t *seg_of;  /* chunk -> its segment (-1: not batched) */
	uint64_t dense;
} bench;

static uint16_t *host_of(const bench *g, uint16_t *h, uint64_t k)
{
	return h + g->m.chunks[k].off % WORK;
}

static void upload(const bench *g, void *dev, const uint16_t *h)
{
	for (uint64_t off = 0; off < g->m.n; off += WORK) {
		uint64_t n = g->m.n - off < WORK ? g->m.n - off : WORK;
		need(cudaMemcpy((uint16_t *)dev + off, h, n * 2, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
	}
}

/* ---- a parallel for on the host ---- */

typedef struct par {
	void (*fn)(bench *, uint64_t, void *);
	bench *g;
	void *arg;
	uint64_t n;
	uint64_t next;
} par;

static void *par_thread(void *a)
{
	par *p = a;
	uint64_t k;

	while ((k = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED)) < p->n)
		p->fn(p->g, k, p->arg);
	return NULL;
}

static void par_for(bench *g, uint64_t n, void (*fn)(bench *, uint64_t, void *), void *arg)
{
	par p = { fn, g, arg, n, 0 };
	pthread_t t[64];

	for (unsigned i = 0; i < g->threads; i++)
		need(!pthread_create(&t[i], NULL, par_thread, &p), "pthread_create");
	for (unsigned i = 0; i < g->threads; i++)
		pthread_join(t[i], NULL);
}

/* ---- encode, as the producer does ---- */

/* The producer's batch size: DELTACAST_DEVICE_BATCH_ELEMS, else its default. */
static uint64_t batch_elems(void)
{
	const char *e = getenv("DELTACAST_DEVICE_BATCH_ELEMS");
	unsigned long long n = e ? strtoull(e, NULL, 10) : 0;

	return n ? (uint64_t)n : BATCH_ELEMS;
}

static void batches(bench *g)
{
	uint64_t max = batch_elems();

	g->rdesc = calloc(g->m.n_chunks, sizeof(*g->rdesc));
	g->batch_first = calloc(g->m.n_chunks, sizeof(uint64_t));
	g->batch_n = calloc(g->m.n_chunks, sizeof(uint64_t));
	need(g->rdesc && g->batch_first && g->batch_n, "batch tables");
	for (uint64_t k = 0, elems = 0; k < g->m.n_chunks; k++) {
		const chunk *c = &g->m.chunks[k];
		if (!g->n_batches || elems + c->count > max) {
			g->batch_first[g->n_batches++] = k;
			elems = 0;
		}
		g->batch_n[g->n_batches - 1]++;
		elems += c->count;
		g->rdesc[k] = (dcast_cuda_range){ (uint16_t *)g->cur + c->off, (uint16_t *)g->base + c->off, c->count,
						  c->start, c->tensor };
	}
	g->ranges = calloc(g->n_batches, sizeof(*g->ranges));
	for (uint64_t i = 0; i < g->n_batches; i++)
		need((g->ranges[i] = dcast_cuda_ranges_new()) != NULL, "dcast_cuda_ranges_new");
}

static void own(payloads *p, uint64_t k, const void *src, uint64_t bytes)
{
	free(p->own[k]);
	p->own[k] = malloc(bytes ? bytes : 1);
	need(p->own[k] != NULL, "payload copy");
	memcpy(p->own[k], src, bytes);
	p->pl[k] = p->own[k];
}

/* Batch i range by range (its scratch would pass the producer's cap). */
static double encode_one_by_one(bench *g, uint64_t i)
{
	double t = 0;

	for (uint64_t k = g->batch_first[i]; k < g->batch_first[i] + g->batch_n[i]; k++) {
		const chunk *c = &g->m.chunks[k];
		double t0 = now_s();
		need(dcast_cuda_encode((uint16_t *)g->cur + c->off, (uint16_t *)g->base + c->off, c->count, 2, -1, 0,
				       g->slot, dcast_codec_bound(RANGE, 2), &g->v1.info[k], NULL) == DCAST_OK,
		     "dcast_cuda_encode");
		t += now_s() - t0;
		own(&g->v1, k, g->slot, g->v1.info[k].payload_bytes);
	}
	return t;
}

/* One encode of the version; the time of the encode calls (the payloads'
 * copies out of a batch that went range by range not counted). */
static double encode_pass(bench *g, const payloads *unused)
{
	double t = 0;

	(void)unused;
	for (uint64_t i = 0; i < g->n_batches; i++) {
		uint64_t k0 = g->batch_first[i];
		int held = 0;
		double t0 = now_s();
		need(dcast_cuda_ranges_encode(g->ranges[i], &g->rdesc[k0], g->batch_n[i], 2, -1, 0, BATCH_MAX_BYTES,
					      &held, NULL) == DCAST_OK,
		     "dcast_cuda_ranges_encode");
		t += now_s() - t0;
		if (!held) {
			t += encode_one_by_one(g, i);
			continue;
		}
		for (uint64_t k = k0; k < k0 + g->batch_n[i]; k++) {
			uint64_t move;
			free(g->v1.own[k]);
			g->v1.own[k] = NULL;
			need(dcast_cuda_ranges_get(g->ranges[i], k - k0, &g->v1.info[k], &g->v1.pl[k], &move) == DCAST_OK,
			     "dcast_cuda_ranges_get");
		}
	}
	return t;
}

/* Chunks 0 and n/2 as the CPU encodes them: the same info and bytes? */
static int same_as_cpu(bench *g)
{
	int same = 1;

	for (uint64_t k = 0; k < g->m.n_chunks; k += g->m.n_chunks / 2 + 1) {
		dcast_chunk_info ci;
		const chunk *c = &g->m.chunks[k];
		need(dcast_codec_encode(host_of(g, g->hcur, k), host_of(g, g->hbase, k), c->count, 2, -1, 0, g->slot,
					dcast_codec_bound(RANGE, 2), &ci) == DCAST_OK,
		     "CPU encode");
		same &= !memcmp(&ci, &g->v1.info[k], sizeof(ci)) && !memcmp(g->slot, g->v1.pl[k], ci.payload_bytes);
	}
	return same;
}

/* Compact v2 payloads, by the CPU encoder on every thread. */
static void v2_one(bench *g, uint64_t k, void *arg)
{
	const chunk *c = &g->m.chunks[k];
	size_t cap = dcast_codec_bound(RANGE, 2);
	void *out = malloc(cap);

	(void)arg;
	need(out && dcast_codec_encode(host_of(g, g->hcur, k), host_of(g, g->hbase, k), c->count, 2, -1,
				       DCAST_ENCODE_COMPACT2, out, cap, &g->v2.info[k]) == DCAST_OK,
	     "v2 encode");
	free(g->v2.own[k]);
	g->v2.own[k] = realloc(out, g->v2.info[k].payload_bytes ? g->v2.info[k].payload_bytes : 1);
	g->v2.pl[k] = g->v2.own[k];
}

/* ---- decode-ahead, as the consumer's check ahead does it ---- */

static void grow_host(unsigned char **p, uint64_t *cap, uint64_t bytes, int pinned)
{
	if (bytes <= *cap)
		return;
	if (pinned) {
		cudaFreeHost(*p);
		need(cudaMallocHost((void **)p, bytes) == cudaSuccess, "pinned buffer");
	} else {
		free(*p);
		need((*p = malloc(bytes)) != NULL, "host buffer");
	}
	*cap = bytes;
}

/* The batch's layout for payloads p: segments of the sparse chunks, the
 * compact ones' entries in the decode tables. */
static void layout(bench *g, const payloads *p)
{
	dcast_batch_dims d = { 0 };
	dcast_batch_ddims dd = { 0 };
	uint64_t s = 0, first = 0, val = 0, cpt = 0, pl = 0;

	g->dense = 0;
	for (uint64_t k = 0; k < g->m.n_chunks; k++) {
		const dcast_chunk_info *i = &p->info[k];
		if (i->encoding == DCAST_ENC_DENSE || !i->changed)
			continue;
		d.n_seg++, d.n_tile += dcast_batch_tiles(i->changed), d.n += i->changed;
		d.val_bytes += dcast_batch_val_bytes(i->changed, 2);
		if (dcast_batch_is_cpt(i->encoding))
			dcast_batch_ddims_add(&dd, i);
	}
	grow_host(&g->hbatch, &g->hbatch_cap, dcast_batch_bytes(&d), 0);
	grow_host(&g->hdec, &g->hdec_cap, dcast_batch_dbytes(&dd), 1);
	dcast_batch_map(&g->b, g->hbatch, &d);
	dcast_batch_dmap(&g->x, g->hdec, &dd);
	for (uint64_t k = 0; k < g->m.n_chunks; k++) {
		const dcast_chunk_info *i = &p->info[k];
		const chunk *c = &g->m.chunks[k];
		g->seg_of[k] = -1, g->cpt_of[k] = UINT32_MAX;
		if (i->encoding == DCAST_ENC_DENSE || !i->changed) {
			g->dense += i->encoding == DCAST_ENC_DENSE;
			continue;
		}
		g->seg_of[k] = (int64_t)s;
		g->b.seg[s++] = (dcast_batch_seg){ .dst = (uintptr_t)((uint16_t *)g->dst + c->off), .start = c->start,
						   .first = first, .val_off = val, .count = (uint32_t)i->changed,
						   .tensor = c->tensor, .elem_size = 2, .cpt = (uint32_t)cpt };
		if (dcast_batch_is_cpt(i->encoding)) {
			g->cpt_of[k] = (uint32_t)cpt;
			g->x.cpt[cpt++] = (dcast_batch_cpt){ .payload_off = pl, .first = first };
			pl += (i->payload_bytes + 7) & ~(uint64_t)7;
		}
		first += i->changed;
		val += dcast_batch_val_bytes(i->changed, 2);
	}
	dcast_batch_tile_up(&g->b);
}

/* Chunk k's payload checked and put: compact ones for the device's
 * decode, other sparse ones decoded here. */
static void put_one(bench *g, uint64_t k, void *arg)
{
	const payloads *p = arg;
	dcast_batch_seg *s;
	unsigned mode;

	if (g->seg_of[k] < 0)
		return;
	s = &g->b.seg[g->seg_of[k]];
	if (g->cpt_of[k] != UINT32_MAX) {
		uint64_t off = g->x.cpt[g->cpt_of[k]].payload_off;
		need(dcast_batch_dput(&g->x, g->cpt_of[k], &p->info[k], p->pl[k], &off, s->first) == DCAST_OK, "dput");
		s->mode = g->x.cpt[g->cpt_of[k]].mode == DCAST_CPT_RAW ? DCAST_BATCH_RAW : DCAST_BATCH_ULP;
		return;
	}
	need(dcast_batch_decode(&p->info[k], p->pl[k], g->b.pos + s->first, g->b.code + s->first, &mode) == DCAST_OK,
	     "host decode");
	s->mode = mode;
}

/* The device's part: the tables (and the host-decoded changes, when a
 * chunk is not compact) and the payloads copied, decode, resolve, the
 * segments and verdicts back. */
static void ahead_device(bench *g)
{
	dcast_batch *b = &g->b;
	uint64_t bytes = dcast_batch_bytes(&b->d), upto = dcast_batch_host_bytes(b, g->x.d.n_cpt);
	dcast_batch dv;

	need(dcast_cuda_batch_reserve(&g->dbatch, &g->dbatch_cap, bytes) == DCAST_OK &&
		     dcast_cuda_batch_reserve(&g->ddec, &g->ddec_cap, dcast_batch_dbytes(&g->x.d)) == DCAST_OK,
	     "device batch");
	dcast_batch_map(&dv, g->dbatch, &b->d);
	need(dcast_cuda_batch_copy(g->dbatch, b->base, upto, 0, NULL) == DCAST_OK &&
		     dcast_cuda_batch_copy(g->ddec, g->x.base, dcast_batch_dbytes(&g->x.d), 0, NULL) == DCAST_OK &&
		     dcast_cuda_batch_decode(g->ddec, &g->x, dv.pos, dv.code, NULL) == DCAST_OK &&
		     dcast_cuda_batch_resolve(g->dbatch, b, NULL) == DCAST_OK &&
		     dcast_cuda_batch_copy(b->seg, g->dbatch, b->d.n_seg * sizeof(*b->seg), 0, NULL) == DCAST_OK &&
		     dcast_cuda_batch_copy(g->x.cpt, g->ddec, g->x.d.n_cpt * sizeof(*g->x.cpt), 1, NULL) == DCAST_OK,
	     "device decode-ahead");
	for (uint64_t c = 0; c < g->x.d.n_cpt; c++)
		need(dcast_batch_cpt_report(&g->x.cpt[c]) == DCAST_OK, "a chunk's verdict");
}

static double ahead_pass(bench *g, const payloads *p)
{
	double t = now_s();

	layout(g, p);
	par_for(g, g->m.n_chunks, put_one, (void *)p);
	dcast_batch_blk_up(&g->x);
	ahead_device(g);
	return now_s() - t;
}

/* ---- the pause, and its check ---- */

static double scatter(bench *g, int undo)
{
	double t = now_s();

	need(dcast_cuda_batch_scatter(g->dbatch, &g->b, undo, 0, g->b.d.n_seg, NULL) == DCAST_OK &&
		     dcast_cuda_batch_sync(NULL) == DCAST_OK,
	     undo ? "undo" : "scatter");
	return now_s() - t;
}

static double pause_pass(bench *g, const payloads *unused)
{
	double t = scatter(g, 0);

	(void)unused;
	scatter(g, 1);
	return t;
}

static uint64_t digest(const void *dev, uint64_t n)
{
	uint64_t d;

	need(dcast_cuda_digest(dev, n * 2, &d, NULL) == DCAST_OK, "digest");
	return d;
}

/* The batch applied (the dense chunks copied, as their apply would): the
 * new model bit for bit; then undone: the old one. */
static int batch_exact(bench *g, const payloads *p)
{
	int ok;

	scatter(g, 0);
	for (uint64_t k = 0; k < g->m.n_chunks; k++)
		if (p->info[k].encoding == DCAST_ENC_DENSE)
			need(cudaMemcpy((uint16_t *)g->dst + g->m.chunks[k].off, (uint16_t *)g->cur + g->m.chunks[k].off,
					g->m.chunks[k].count * 2, cudaMemcpyDeviceToDevice) == cudaSuccess,
			     "dense copy");
	ok = digest(g->dst, g->m.n) == digest(g->cur, g->m.n);
	scatter(g, 1);
	for (uint64_t k = 0; k < g->m.n_chunks; k++)
		if (p->info[k].encoding == DCAST_ENC_DENSE)
			need(cudaMemcpy((uint16_t *)g->dst + g->m.chunks[k].off, (uint16_t *)g->base + g->m.chunks[k].off,
					g->m.chunks[k].count * 2, cudaMemcpyDeviceToDevice) == cudaSuccess,
			     "dense copy back");
	return ok && digest(g->dst, g->m.n) == digest(g->base, g->m.n);
}

/* ---- a density ---- */

/* The best of REPS runs of fn (p: the payloads, for those that take them). */
static double best(double (*fn)(bench *, const payloads *), bench *g, const payloads *p)
{
	double b = 1e30;

	for (int r = 0; r < REPS; r++) {
		double t = fn(g, p);
		b = t < b ? t : b;
	}
	return b;
}

static double copy_pass(bench *g, const payloads *unused)
{
	(void)unused;
	double t = now_s();

	need(cudaMemcpy(g->dst, g->cur, g->m.n * 2, cudaMemcpyDeviceToDevice) == cudaSuccess &&
		     cudaDeviceSynchronize() == cudaSuccess,
	     "copy");
	return now_s() - t;
}

static uint64_t wire_bytes(const bench *g, const payloads *p)
{
	uint64_t s = 0;

	for (uint64_t k = 0; k < g->m.n_chunks; k++)
		s += p->info[k].payload_bytes;
	return s;
}

static void rate(double bytes, double t, double tc)
{
	printf("%.1f | %.3fx | ", bytes / t / 1e9, tc / t);
}

static double last_pause, last_ahead, last_encode, last_copy;

static void density(bench *g, double dens)
{
	double bytes = (double)g->m.n * 2, tc, te, ta1, ta2, tp, real;
	int same, ex1, ex2;

	real = workload_step(&g->w, find_lr(&g->w, dens), WORK);
	memcpy(g->hcur, g->w.cur, WORK * 2);
	memcpy(g->hcur + WORK, g->w.cur, RANGE * 2);
	upload(g, g->cur, g->hcur);
	need(cudaMemcpy(g->dst, g->base, g->m.n * 2, cudaMemcpyDeviceToDevice) == cudaSuccess, "reset");
	tc = best(copy_pass, g, NULL);
	need(cudaMemcpy(g->dst, g->base, g->m.n * 2, cudaMemcpyDeviceToDevice) == cudaSuccess, "reset");
	te = best(encode_pass, g, NULL);
	same = same_as_cpu(g);
	ta1 = best(ahead_pass, g, &g->v1);
	tp = best(pause_pass, g, NULL);
	ex1 = batch_exact(g, &g->v1);
	par_for(g, g->m.n_chunks, v2_one, NULL);
	ta2 = best(ahead_pass, g, &g->v2);
	ex2 = batch_exact(g, &g->v2);
	printf("| %.2f%% | %.1f | ", 100 * real, bytes / tc / 1e9);
	rate(bytes, te, tc), rate(bytes, ta1, tc), rate(bytes, ta2, tc), rate(bytes, tp, tc);
	printf("%.2f | %" PRIu64 " | %" PRIu64 " | %" PRIu64 " | %s | %s |\n", tp * 1e3, wire_bytes(g, &g->v1),
	       wire_bytes(g, &g->v2), g->dense, same ? "yes" : "NO", ex1 && ex2 ? "yes" : "NO");
	fflush(stdout);
	if (dens == 0.01)
		last_pause = bytes / tp / 1e9, last_ahead = bytes / ta1 / 1e9, last_encode = bytes / te / 1e9,
		last_copy = bytes / tc / 1e9;
}

static void payloads_init(payloads *p, uint64_t n)
{
	p->info = calloc(n, sizeof(*p->info));
	p->pl = calloc(n, sizeof(*p->pl));
	p->own = calloc(n, sizeof(*p->own));
	need(p->info && p->pl && p->own, "payload tables");
}

static void setup(bench *g)
{
	const char *e = getenv("BENCH_GPU_MODEL_LAYERS");
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);

	llama7b(&g->m, e && atoi(e) > 0 && atoi(e) < 32 ? (unsigned)atoi(e) : 32);
	g->threads = cpus < 1 ? 1 : cpus > 16 ? 16 : (unsigned)cpus;
	workload_init(&g->w, WORK);
	g->hbase = malloc((WORK + RANGE) * 2);
	g->hcur = malloc((WORK + RANGE) * 2);
	need(g->hbase && g->hcur, "host model");
	memcpy(g->hbase, g->w.base, WORK * 2);
	memcpy(g->hbase + WORK, g->w.base, RANGE * 2);
	need(cudaMalloc(&g->base, g->m.n * 2) == cudaSuccess && cudaMalloc(&g->cur, g->m.n * 2) == cudaSuccess &&
		     cudaMalloc(&g->dst, g->m.n * 2) == cudaSuccess &&
		     cudaMallocHost(&g->slot, dcast_codec_bound(RANGE, 2)) == cudaSuccess,
	     "device model");
	upload(g, g->base, g->hbase);
	payloads_init(&g->v1, g->m.n_chunks);
	payloads_init(&g->v2, g->m.n_chunks);
	g->cpt_of = calloc(g->m.n_chunks, sizeof(*g->cpt_of));
	g->seg_of = calloc(g->m.n_chunks, sizeof(*g->seg_of));
	need(g->cpt_of && g->seg_of, "chunk maps");
	batches(g);
}

/* BENCH_GPU_MODEL_DENSITIES="0.01 0.05": those (at most 4), else all four. */
static int densities(double d[4])
{
	const char *e = getenv("BENCH_GPU_MODEL_DENSITIES");
	char *end;
	int n = 0;

	while (e && n < 4) {
		double v = strtod(e, &end);
		if (end == e || v <= 0 || v >= 1)
			break;
		d[n++] = v;
		e = end;
	}
	return n ? n : 4;
}

int main(void)
{
	static double dens[] = { 0.001, 0.01, 0.05, 0.30 };
	static bench g;
	int n_dens = densities(dens);

	if (!dcast_cuda_available()) {
		printf("skip: no CUDA device\n");
		return 77;
	}
	setup(&g);
	printf("7B-shaped bf16 model: %" PRIu64 " tensors, %" PRIu64 " elements (%.2f GB), %" PRIu64
	       " chunks of up to %" PRIu64 " elements, %" PRIu64 " encode batches; %u host threads; best of %d.\n"
	       "GB/s of the model's bytes; /copy: against a device-to-device copy of them.\n\n",
	       g.m.n_tensors, g.m.n, g.m.n * 2 / 1e9, g.m.n_chunks, RANGE, g.n_batches, g.threads, REPS);
	printf("| density | copy GB/s | encode | /copy | decode-ahead | /copy | decode-ahead, v2 | /copy "
	       "| pause | /copy | pause ms | wire bytes | wire bytes, v2 | dense chunks | payload = CPU | exact, undone |\n"
	       "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
	for (int i = 0; i < n_dens; i++)
		density(&g, dens[i]);
	printf("\ngpu_pause_gbps %.1f decode_ahead_gbps %.1f encode_gbps %.1f copy_gbps %.1f\n", last_pause,
	       last_ahead, last_encode, last_copy);
	return 0;
}
#endif
