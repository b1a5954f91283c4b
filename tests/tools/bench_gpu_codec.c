/* bench_gpu_codec: CUDA codec throughput on RL-like bf16 updates, for
 * `make bench-gpu`: encode, apply and digest, each as GB/s of the range's
 * bytes and as a ratio to a device-to-device cudaMemcpy of the same bytes
 * timed in the same run.  Also says whether the GPU payloads equal the CPU's.
 * Then a consumer's device path for the same payloads
 * (kernels/dcast_batch.h): decode-ahead with the host's decode (every
 * chunk decoded on the host, the batch copied to the device once, old
 * values gathered, new ones and digest moves made in one launch), the
 * same with the compact payloads decoded on the device (every block of
 * every chunk in one launch: what the consumer runs), and the pause (one
 * scatter launch of the whole batch, old values kept), in GB/s of range
 * bytes and against the copy.  The last line, for scripts (D: the
 * device's decode when every chunk is compact):
 *   gpu_pause_gbps P decode_ahead_gbps D encode_gbps E copy_gbps C
 * at 1% density.  Exits 77 ("skip: no CUDA device") without a device. */
#include <inttypes.h>
#include <stdio.h>
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

#define REPS 5
#define CHUNK (1u << 24)

static void need(int ok, const char *what)
{
	if (!ok) {
		fprintf(stderr, "bench_gpu_codec: %s failed: %s\n", what, dcast_last_error());
		exit(1);
	}
}

typedef struct gpu_bufs {
	uint64_t n, nchunks;
	size_t slot;
	void *cur, *base, *dst, *copy, *payloads_dev;
	uint8_t *payloads; /* pinned */
	dcast_chunk_info *info;
	dcast_batch batch;   /* the consumer's batch of the payloads: host (pinned) */
	void *batch_dev;     /* and its device copy */
	uint64_t batch_cap;
	dcast_batch_dec dec; /* the payloads to decode on the device: host (pinned) */
	void *dec_dev;       /* and its device copy */
	uint64_t dec_cap;
} gpu_bufs;

static double best_of(double (*fn)(gpu_bufs *), gpu_bufs *g)
{
	double best = 1e30;
	for (int r = 0; r < REPS; r++) {
		double t = fn(g);
		best = t < best ? t : best;
	}
	return best;
}

static double run_copy(gpu_bufs *g)
{
	double t = now_s();
	need(cudaMemcpy(g->copy, g->cur, g->n * 2, cudaMemcpyDeviceToDevice) == cudaSuccess, "cudaMemcpy");
	need(cudaDeviceSynchronize() == cudaSuccess, "sync");
	return now_s() - t;
}

static double run_encode(gpu_bufs *g)
{
	double t = now_s();
	for (uint64_t k = 0; k < g->nchunks; k++) {
		uint64_t off = k * CHUNK, n = g->n - off < CHUNK ? g->n - off : CHUNK;
		need(dcast_cuda_encode((uint16_t *)g->cur + off, (uint16_t *)g->base + off, n, 2, -1, 0,
				       g->payloads + k * g->slot, g->slot, &g->info[k], NULL) == DCAST_OK, "encode");
	}
	return now_s() - t;
}

static double run_apply(gpu_bufs *g)
{
	need(cudaMemcpy(g->dst, g->base, g->n * 2, cudaMemcpyDeviceToDevice) == cudaSuccess, "reset");
	double t = now_s();
	for (uint64_t k = 0; k < g->nchunks; k++)
		need(dcast_cuda_apply(&g->info[k], (uint8_t *)g->payloads_dev + k * g->slot,
				      (uint16_t *)g->dst + k * CHUNK, NULL, NULL) == DCAST_OK, "apply");
	return now_s() - t;
}

static double run_digest(gpu_bufs *g)
{
	uint64_t d;
	double t = now_s();
	need(dcast_cuda_digest(g->cur, g->n * 2, &d, NULL) == DCAST_OK, "digest");
	return now_s() - t;
}

/* The batch of every chunk's payload: its layout in pinned memory and on
 * the device (grown as the density needs), segments pointing into dst. */
static void batch_layout(gpu_bufs *g)
{
	static uint64_t host_cap;
	static void *host;
	dcast_batch_dims d = { g->nchunks, 0, 0, 0 };

	for (uint64_t k = 0; k < g->nchunks; k++) {
		d.n_tile += dcast_batch_tiles(g->info[k].changed);
		d.n += g->info[k].changed;
		d.val_bytes += dcast_batch_val_bytes(g->info[k].changed, 2);
	}
	if (dcast_batch_bytes(&d) > host_cap) {
		cudaFreeHost(host);
		host_cap = dcast_batch_bytes(&d);
		need(cudaMallocHost(&host, host_cap) == cudaSuccess, "pinned batch");
	}
	need(dcast_cuda_batch_reserve(&g->batch_dev, &g->batch_cap, dcast_batch_bytes(&d)) == DCAST_OK, "device batch");
	dcast_batch_map(&g->batch, host, &d);
	for (uint64_t k = 0, first = 0, val = 0; k < g->nchunks; k++) {
		g->batch.seg[k] = (dcast_batch_seg){ .dst = (uintptr_t)((uint16_t *)g->dst + k * CHUNK), .start = k * CHUNK,
						     .first = first, .val_off = val, .count = (uint32_t)g->info[k].changed,
						     .elem_size = 2 };
		first += g->info[k].changed;
		val += dcast_batch_val_bytes(g->info[k].changed, 2);
	}
	dcast_batch_tile_up(&g->batch);
}

/* Decode-ahead: every payload decoded on the host into the batch, one
 * copy to the device, one launch (old values from dst, new ones, moves),
 * the segment table (the moves) back. */
static double run_ahead(gpu_bufs *g)
{
	dcast_batch *b = &g->batch;
	double t = now_s();
	for (uint64_t k = 0; k < g->nchunks; k++) {
		unsigned mode;
		need(dcast_batch_decode(&g->info[k], g->payloads + k * g->slot, b->pos + b->seg[k].first,
					b->code + b->seg[k].first, &mode) == DCAST_OK, "decode");
		b->seg[k].mode = mode, b->seg[k].move = 0;
	}
	need(dcast_cuda_batch_copy(g->batch_dev, b->base, dcast_batch_bytes(&b->d), 0, NULL) == DCAST_OK &&
		     dcast_cuda_batch_resolve(g->batch_dev, b, NULL) == DCAST_OK &&
		     dcast_cuda_batch_copy(b->seg, g->batch_dev, b->d.n_seg * sizeof(*b->seg), 1, NULL) == DCAST_OK,
	     "resolve");
	return now_s() - t;
}

/* Decode-ahead with the decode on the device: headers parsed and payloads
 * gathered on the host, the batch's tables and the payloads copied, one
 * launch decoding every block, one chaining them, one resolving, the
 * segment table and the chunks' verdicts back. */
static double run_ahead_dev(gpu_bufs *g)
{
	static void *host;
	static uint64_t host_cap;
	dcast_batch *b = &g->batch;
	dcast_batch_ddims d;
	dcast_batch dv;
	uint64_t at = 0;
	double t = now_s();

	dcast_batch_ddims_for(g->info, g->nchunks, &d);
	if (dcast_batch_dbytes(&d) > host_cap) {
		cudaFreeHost(host);
		host_cap = dcast_batch_dbytes(&d);
		need(cudaMallocHost(&host, host_cap) == cudaSuccess, "pinned decode buffer");
	}
	need(dcast_cuda_batch_reserve(&g->dec_dev, &g->dec_cap, dcast_batch_dbytes(&d)) == DCAST_OK, "device decode");
	dcast_batch_dmap(&g->dec, host, &d);
	for (uint64_t k = 0; k < g->nchunks; k++) {
		need(dcast_batch_dput(&g->dec, k, &g->info[k], g->payloads + k * g->slot, &at, b->seg[k].first) == 0,
		     "decode put");
		b->seg[k].mode = g->dec.cpt[k].mode == DCAST_CPT_RAW ? DCAST_BATCH_RAW : DCAST_BATCH_ULP;
		b->seg[k].move = 0;
	}
	dcast_batch_blk_up(&g->dec);
	dcast_batch_map(&dv, g->batch_dev, &b->d);
	need(dcast_cuda_batch_copy(g->batch_dev, b->base, (uint64_t)((unsigned char *)b->pos - b->base), 0, NULL) == 0 &&
		     dcast_cuda_batch_copy(g->dec_dev, host, dcast_batch_dbytes(&d), 0, NULL) == 0 &&
		     dcast_cuda_batch_decode(g->dec_dev, &g->dec, dv.pos, dv.code, NULL) == 0 &&
		     dcast_cuda_batch_resolve(g->batch_dev, b, NULL) == 0 &&
		     dcast_cuda_batch_copy(b->seg, g->batch_dev, b->d.n_seg * sizeof(*b->seg), 0, NULL) == 0 &&
		     dcast_cuda_batch_copy(g->dec.cpt, g->dec_dev, d.n_cpt * sizeof(*g->dec.cpt), 1, NULL) == 0,
	     "device decode-ahead");
	for (uint64_t k = 0; k < g->nchunks; k++)
		need(dcast_batch_cpt_report(&g->dec.cpt[k]) == 0, "device decode verdict");
	return now_s() - t;
}

/* The pause: the whole batch scattered into dst in one launch (timed),
 * then undone (not timed) so that the next run starts from the base. */
static double run_pause(gpu_bufs *g)
{
	double t = now_s(), dt;
	need(dcast_cuda_batch_scatter(g->batch_dev, &g->batch, 0, 0, g->nchunks, NULL) == DCAST_OK &&
		     dcast_cuda_batch_sync(NULL) == DCAST_OK, "scatter");
	dt = now_s() - t;
	need(dcast_cuda_batch_scatter(g->batch_dev, &g->batch, 1, 0, g->nchunks, NULL) == DCAST_OK &&
		     dcast_cuda_batch_sync(NULL) == DCAST_OK, "undo");
	return dt;
}

/* The batch applied once more: dst equals cur, bit for bit? */
static int batch_exact(const workload *w, gpu_bufs *g)
{
	uint16_t *back = malloc(g->n * 2);
	need(dcast_cuda_batch_scatter(g->batch_dev, &g->batch, 0, 0, g->nchunks, NULL) == DCAST_OK &&
		     cudaMemcpy(back, g->dst, g->n * 2, cudaMemcpyDeviceToHost) == cudaSuccess, "batch check");
	int same = !memcmp(back, w->cur, g->n * 2);
	free(back);
	return same;
}

static void print_rate(double bytes, double t, double tc)
{
	if (t > 0)
		printf("%.1f | %.3fx | ", bytes / t / 1e9, tc / t);
	else
		printf("n/a | n/a | ");
}

/* The consumer's device path for this density's payloads: decode-ahead
 * with the host's decode (every chunk sparse) and with the device's
 * (every chunk compact), and the pause; a time stays 0 where it does not
 * apply.  Returns whether the batch wrote cur's bytes. */
static int bench_batch(const workload *w, gpu_bufs *g, double *tah, double *tad, double *tp)
{
	double bytes = (double)g->n * 2, tc = best_of(run_copy, g);
	int sparse = 1, compact = 1, ok = 1;

	for (uint64_t k = 0; k < g->nchunks; k++) {
		sparse &= g->info[k].encoding != DCAST_ENC_DENSE;
		compact &= g->info[k].encoding == DCAST_ENC_COMPACT || g->info[k].encoding == DCAST_ENC_COMPACT2;
	}
	need(cudaMemcpy(g->dst, g->base, g->n * 2, cudaMemcpyDeviceToDevice) == cudaSuccess, "reset");
	batch_layout(g);
	if (sparse) {
		*tah = best_of(run_ahead, g);
		*tp = best_of(run_pause, g);
		ok = batch_exact(w, g);
		need(cudaMemcpy(g->dst, g->base, g->n * 2, cudaMemcpyDeviceToDevice) == cudaSuccess, "reset");
	}
	if (compact) {
		*tad = best_of(run_ahead_dev, g);
		ok &= batch_exact(w, g); /* the device's decode gives the same bytes */
	}
	print_rate(bytes, *tah, tc), print_rate(bytes, *tad, tc), print_rate(bytes, *tp, tc);
	return ok;
}

/* This run's numbers at 1% density, for the last line. */
static double last_pause, last_ahead, last_encode, last_copy;

static int same_as_cpu(const workload *w, const gpu_bufs *g)
{
	uint8_t *out = malloc(g->slot);
	dcast_chunk_info ci;
	uint64_t n = w->n < CHUNK ? w->n : CHUNK;
	need(dcast_codec_encode(w->cur, w->base, n, 2, -1, 0, out, g->slot, &ci) == DCAST_OK, "cpu encode");
	int same = !memcmp(&ci, &g->info[0], sizeof(ci)) && !memcmp(out, g->payloads, ci.payload_bytes);
	free(out);
	return same;
}

/* BENCH_GPU_COMPACT2=1: the batch's payloads are the CPU encoder's with
 * DCAST_ENCODE_COMPACT2 (compact v2 wherever a producer with
 * DELTACAST_COMPACT2=1 writes it), so that decode-ahead measures v2's
 * warp-per-block decode. */
static void payloads_v2(const workload *w, gpu_bufs *g)
{
	const char *e = getenv("BENCH_GPU_COMPACT2");

	if (!e || strcmp(e, "1"))
		return;
	for (uint64_t k = 0; k < g->nchunks; k++) {
		uint64_t off = k * CHUNK, n = g->n - off < CHUNK ? g->n - off : CHUNK;
		need(dcast_codec_encode(w->cur + off, w->base + off, n, 2, -1, DCAST_ENCODE_COMPACT2,
					g->payloads + k * g->slot, g->slot, &g->info[k]) == DCAST_OK, "v2 encode");
	}
}

static void bench_density(workload *w, gpu_bufs *g, double density)
{
	double bytes = (double)g->n * 2;
	workload_step(w, find_lr(w, density), w->n);
	need(cudaMemcpy(g->cur, w->cur, g->n * 2, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
	double tc = best_of(run_copy, g), te = best_of(run_encode, g);
	for (uint64_t k = 0; k < g->nchunks; k++)
		need(cudaMemcpy((uint8_t *)g->payloads_dev + k * g->slot, g->payloads + k * g->slot,
				g->info[k].payload_bytes, cudaMemcpyHostToDevice) == cudaSuccess, "payload upload");
	double ta = best_of(run_apply, g), td = best_of(run_digest, g);
	int exact = 1;
	uint16_t *back = malloc(g->n * 2);
	need(cudaMemcpy(back, g->dst, g->n * 2, cudaMemcpyDeviceToHost) == cudaSuccess, "download");
	exact = !memcmp(back, w->cur, g->n * 2);
	free(back);
	printf("| %.1f%% | %.1f | %.1f | %.2fx | %.1f | %.2fx | %.1f | %.2fx | ", 100 * density, bytes / tc / 1e9,
	       bytes / te / 1e9, tc / te, bytes / ta / 1e9, tc / ta, bytes / td / 1e9, tc / td);
	double tah = 0, tad = 0, tp = 0;
	int same = same_as_cpu(w, g), batch_ok;
	payloads_v2(w, g);
	batch_ok = bench_batch(w, g, &tah, &tad, &tp);
	printf("%s | %s |\n", same ? "yes" : "NO", exact && batch_ok ? "yes" : "NO");
	if (density == 0.01 && tp > 0) /* decode-ahead as the consumer runs it: compact decoded on the device */
		last_pause = bytes / tp / 1e9, last_ahead = bytes / (tad > 0 ? tad : tah) / 1e9,
		last_encode = bytes / te / 1e9, last_copy = bytes / tc / 1e9;
}

int main(void)
{
	static const double dens[] = { 0.001, 0.01, 0.05, 0.30 };
	if (!dcast_cuda_available()) {
		printf("skip: no CUDA device\n");
		return 77;
	}
	workload w;
	workload_init(&w, 1u << 26);
	gpu_bufs g = { .n = w.n, .nchunks = (w.n + CHUNK - 1) / CHUNK, .slot = dcast_codec_bound(CHUNK, 2) };
	need(cudaMalloc(&g.cur, g.n * 2) == cudaSuccess && cudaMalloc(&g.base, g.n * 2) == cudaSuccess &&
		     cudaMalloc(&g.dst, g.n * 2) == cudaSuccess && cudaMalloc(&g.copy, g.n * 2) == cudaSuccess &&
		     cudaMalloc(&g.payloads_dev, g.nchunks * g.slot) == cudaSuccess &&
		     cudaMallocHost((void **)&g.payloads, g.nchunks * g.slot) == cudaSuccess,
	     "device allocation");
	g.info = calloc(g.nchunks, sizeof(*g.info));
	need(cudaMemcpy(g.base, w.base, g.n * 2, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
	printf("RL-like bf16, %" PRIu64 " elements in chunks of %u, best of %d; GB/s of the range's bytes.\n\n",
	       g.n, CHUNK, REPS);
	printf("| density | D2D copy | encode | encode/copy | apply | apply/copy | digest | digest/copy "
	       "| decode-ahead (host decode) | ahead/copy | decode-ahead (device decode) | ahead/copy "
	       "| pause (batch scatter) | pause/copy | payload = CPU | exact |\n"
	       "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
	for (int i = 0; i < 4; i++)
		bench_density(&w, &g, dens[i]);
	printf("\ngpu_pause_gbps %.1f decode_ahead_gbps %.1f encode_gbps %.1f copy_gbps %.1f\n", last_pause,
	       last_ahead, last_encode, last_copy);
	return 0;
}
#endif
