/* The batch kernels (dcast_batch.h): a version's resolved changes to the
 * tensors of one device gathered (old values, new values, digest moves)
 * and scattered, each in one launch over every segment.  A block takes a
 * tile of up to DCAST_BATCH_TILE changes of one segment (the tile table
 * names it, so no thread searches), its threads stride through the tile,
 * and blocks stride over the tiles.  batch.c holds the CPU twin the tests
 * compare them with. */
#include <inttypes.h>
#include <cuda_runtime.h>
#include "codec_shared.h"
#include "batch_decode.h"
#include "dcast_batch.h"
extern "C" {
#include "dcast_common.h"
}

#define BATCH_THREADS 256u
#define BATCH_MAX_BLOCKS 65535u

static int batch_fail(cudaError_t e, const char *what)
{
	return dcast_fail(DCAST_ECUDA, "batch %s: %s", what, cudaGetErrorString(e));
}

static unsigned blocks_for(uint64_t tiles)
{
	return (unsigned)(tiles < BATCH_MAX_BLOCKS ? (tiles ? tiles : 1) : BATCH_MAX_BLOCKS);
}

template <typename T>
__device__ static void scatter_tile(const dcast_batch b, const dcast_batch_seg &s, uint32_t at, uint32_t n,
				    const unsigned char *src_all, unsigned char *save_all)
{
	T *range = (T *)(uintptr_t)s.dst;
	const T *src = (const T *)(src_all + s.val_off) + at;
	T *save = (T *)(save_all + s.val_off) + at;
	const uint32_t *pos = b.pos + s.first + at;

	for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
		T *e = range + pos[i];
		save[i] = *e;
		*e = src[i];
	}
}

__global__ static void k_batch_scatter(const dcast_batch b, uint64_t t_lo, uint64_t t_hi, int undo)
{
	const unsigned char *src = undo ? b.old_vals : b.new_vals;
	unsigned char *save = undo ? b.new_vals : b.old_vals;

	for (uint64_t t = t_lo + blockIdx.x; t < t_hi; t += gridDim.x) {
		const dcast_batch_tile tile = b.tile[t];
		const dcast_batch_seg s = b.seg[tile.seg];
		uint32_t n = min(DCAST_BATCH_TILE, s.count - tile.at);
		switch (s.elem_size) {
		case 1: scatter_tile<uint8_t>(b, s, tile.at, n, src, save); break;
		case 2: scatter_tile<uint16_t>(b, s, tile.at, n, src, save); break;
		case 4: scatter_tile<uint32_t>(b, s, tile.at, n, src, save); break;
		default: scatter_tile<uint64_t>(b, s, tile.at, n, src, save); break;
		}
	}
}

template <typename T>
__device__ static uint64_t resolve_tile(const dcast_batch b, const dcast_batch_seg &s, uint32_t at, uint32_t n)
{
	const T *range = (const T *)(uintptr_t)s.dst;
	T *old = (T *)(b.old_vals + s.val_off) + at, *nv = (T *)(b.new_vals + s.val_off) + at;
	const uint32_t *pos = b.pos + s.first + at, *code = b.code + s.first + at;
	unsigned w = 8 * sizeof(T);
	uint64_t acc = 0;

	for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
		uint32_t o = range[pos[i]], c = code[i];
		uint32_t v = s.mode == DCAST_BATCH_ULP ? dcast_ulp_apply(o, c, w) : c;
		uint64_t idx = s.start + pos[i], seed = dcast_ld_seed(s.tensor, idx >> 32);
		old[i] = (T)o;
		nv[i] = (T)v;
		acc += dcast_ld_term_seeded(seed, idx, v) - dcast_ld_term_seeded(seed, idx, o);
	}
	return acc;
}

/* The block's sum of v into *out (one atomic a block: a sum mod 2^64 does
 * not depend on order). */
__device__ static void block_add(uint64_t v, unsigned long long *out)
{
	__shared__ uint64_t warp_sums[BATCH_THREADS / 32];

	for (int d = 16; d; d >>= 1)
		v += __shfl_down_sync(0xffffffffu, v, d);
	if ((threadIdx.x & 31) == 0)
		warp_sums[threadIdx.x >> 5] = v;
	__syncthreads();
	if (threadIdx.x == 0) {
		uint64_t sum = 0;
		for (unsigned w = 0; w < blockDim.x / 32; w++)
			sum += warp_sums[w];
		atomicAdd(out, (unsigned long long)sum);
	}
	__syncthreads();
}

__global__ static void k_batch_resolve(const dcast_batch b)
{
	for (uint64_t t = blockIdx.x; t < b.d.n_tile; t += gridDim.x) {
		const dcast_batch_tile tile = b.tile[t];
		const dcast_batch_seg s = b.seg[tile.seg];
		uint32_t n = min(DCAST_BATCH_TILE, s.count - tile.at);
		uint64_t acc;
		switch (s.elem_size) {
		case 1: acc = resolve_tile<uint8_t>(b, s, tile.at, n); break;
		case 2: acc = resolve_tile<uint16_t>(b, s, tile.at, n); break;
		default: acc = resolve_tile<uint32_t>(b, s, tile.at, n); break;
		}
		block_add(acc, (unsigned long long *)&b.seg[tile.seg].move);
	}
}

extern "C" int dcast_cuda_batch_resolve(void *dev, const dcast_batch *host, void *stream)
{
	const dcast_batch_dims *d = &host->d;
	dcast_batch b;
	cudaError_t e;

	dcast_batch_map(&b, dev, d); /* addresses only: nothing is read here */
	if (!d->n_tile)
		return DCAST_OK;
	k_batch_resolve<<<blocks_for(d->n_tile), BATCH_THREADS, 0, (cudaStream_t)stream>>>(b);
	e = cudaGetLastError();
	return e == cudaSuccess ? DCAST_OK : batch_fail(e, "resolve launch");
}

extern "C" int dcast_cuda_batch_scatter(void *dev, const dcast_batch *host, int undo, uint64_t seg_lo,
					uint64_t seg_hi, void *stream)
{
	uint64_t t_lo, t_hi;
	dcast_batch b;
	cudaError_t e;

	dcast_batch_map(&b, dev, &host->d);
	dcast_batch_tile_range(host, seg_lo, seg_hi, &t_lo, &t_hi);
	if (t_lo >= t_hi)
		return DCAST_OK;
	k_batch_scatter<<<blocks_for(t_hi - t_lo), BATCH_THREADS, 0, (cudaStream_t)stream>>>(b, t_lo, t_hi, undo);
	e = cudaGetLastError();
	return e == cudaSuccess ? DCAST_OK : batch_fail(e, "scatter launch");
}

/* ---- compact payloads decoded on the device (batch_decode.h) ---- */

#define DECODE_THREADS 128u

__global__ static void k_batch_decode(const dcast_batch_dec x, uint32_t *pos, uint32_t *code)
{
	for (uint64_t g = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; g < x.d.n_blk;
	     g += (uint64_t)gridDim.x * blockDim.x)
		dcast_batch_decode_blk(&x, g, pos, code);
}

/* The v2 chunks' code lookups from their headers: a block a chunk. */
__global__ static void k_batch_lut(const dcast_batch_dec x)
{
	for (uint64_t c = blockIdx.x; c < x.d.n_cpt; c += gridDim.x)
		dcast_batch_lut_fill(&x, c, threadIdx.x, blockDim.x);
}

#define FULL_MASK 0xffffffffu

/* One refill point of the warp (codec_cpt2.h, dcast_cpt2_refill): in
 * passes, the lanes still short each take a word, in lane order. */
__device__ static int warp_refill(const dcast_cpt_dec *d, dcast_cpt2_lane *l, bool act, int val, uint64_t *at,
				  uint64_t nwords, unsigned lane)
{
	for (;;) {
		bool need = act && dcast_cpt2_needs(d, l, val);
		unsigned m = __ballot_sync(FULL_MASK, need);
		uint64_t mine = *at + __popc(m & ((1u << lane) - 1u));
		if (!m)
			return DCAST_CPT_OK;
		*at += __popc(m);
		if (*at > nwords)
			return DCAST_CPT_EOVERRUN;
		if (need)
			dcast_cpt2_take(l, dcast_cpt2_word(d->stream, mine));
	}
}

/* The round's positions: an inclusive scan of gap + 1 across the lanes
 * from *next; DCAST_CPT_EPOS when one reaches count. */
__device__ static int warp_positions(const dcast_cpt_dec *d, dcast_cpt2_lane *l, bool act, unsigned lane,
				     uint64_t *next, uint32_t *pos)
{
	uint32_t s = act ? dcast_cpt2_gap(l, d->k) + 1 : 0;
	for (unsigned o = 1; o < 32; o <<= 1) {
		uint32_t t = __shfl_up_sync(FULL_MASK, s, o);
		if (lane >= o)
			s += t;
	}
	uint64_t mine = *next + s - 1;
	*next += __shfl_sync(FULL_MASK, s, 31);
	if (__any_sync(FULL_MASK, act && mine >= d->count))
		return DCAST_CPT_EPOS;
	if (act)
		*pos = (uint32_t)mine;
	return DCAST_CPT_OK;
}

/* One round of the warp; lane `lane` codes change r0 + lane when active. */
__device__ static int warp_round(const dcast_cpt_dec *d, dcast_cpt2_lane *l, bool act, unsigned lane,
				 uint64_t *at, uint64_t nwords, uint64_t *next, uint32_t *pos, uint32_t *code)
{
	uint32_t v = 0;
	int e = warp_refill(d, l, act, 0, at, nwords, lane);
	if (e || (e = warp_positions(d, l, act, lane, next, pos)) || (e = warp_refill(d, l, act, 1, at, nwords, lane)))
		return e;
	e = act ? dcast_cpt2_value(d, l, &v) : DCAST_CPT_OK;
	if (__any_sync(FULL_MASK, e))
		return DCAST_CPT_ECODE;
	if (act)
		*code = v;
	return DCAST_CPT_OK;
}

/* v2 block g by one warp: dcast_batch_decode_blk2's result. */
__device__ static void warp_blk(const dcast_batch_dec *x, uint64_t g, unsigned lane, uint32_t *pos, uint32_t *code)
{
	dcast_batch_blk k = x->blk[g];
	const dcast_batch_cpt *p = &x->cpt[k.cpt];
	uint64_t first = p->first + (uint64_t)k.b * DCAST_CPT2_BLOCK, at, next, nwords = p->stream_bytes / 2;
	uint32_t n = dcast_cpt2_blk_changes(p->changed, k.b);
	dcast_cpt2_lane l = { 0, 0, 0 };
	dcast_cpt_dec d;
	int e = DCAST_CPT_OK;

	dcast_batch_cpt_dec(x, p, &d);
	dcast_cpt2_blk_start(x->payload + p->payload_off + p->index_off, k.b, &at, &next);
	for (uint32_t r0 = 0; r0 < n && !e; r0 += 32)
		e = warp_round(&d, &l, r0 + lane < n, lane, &at, nwords, &next, pos + first + r0 + lane,
			       code + first + r0 + lane);
	if (!e && __any_sync(FULL_MASK, l.buf != 0))
		e = DCAST_CPT_ETRAIL;
	if (lane == 0) {
		x->end[g].status = e;
		x->end[g].bit = at;
		x->end[g].next = next;
	}
}

/* The v2 blocks, a warp each (the v1 ones are left to k_batch_decode). */
__global__ static void k_batch_decode2(const dcast_batch_dec x, uint32_t *pos, uint32_t *code)
{
	uint64_t w = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32, nw = (uint64_t)gridDim.x * blockDim.x / 32;

	for (uint64_t g = w; g < x.d.n_blk; g += nw) {
		const dcast_batch_cpt *p = &x.cpt[x.blk[g].cpt];
		if (p->enc == DCAST_ENC_COMPACT2 && p->mode != DCAST_BATCH_SKIP)
			warp_blk(&x, g, threadIdx.x & 31, pos, code);
	}
}

__global__ static void k_batch_chain(const dcast_batch_dec x)
{
	for (uint64_t g = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; g < x.d.n_blk;
	     g += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t key = dcast_batch_chain_blk(&x, g);
		if (key != DCAST_BATCH_NO_ERR)
			atomicMin((unsigned long long *)&x.cpt[x.blk[g].cpt].err, (unsigned long long)key);
	}
}

extern "C" int dcast_cuda_batch_decode(void *dev, const dcast_batch_dec *host, uint32_t *pos, uint32_t *code,
				       void *stream)
{
	uint64_t blocks = (host->d.n_blk + DECODE_THREADS - 1) / DECODE_THREADS;
	unsigned grid = (unsigned)(blocks < BATCH_MAX_BLOCKS ? (blocks ? blocks : 1) : BATCH_MAX_BLOCKS);
	dcast_batch_dec x;
	cudaError_t e;

	dcast_batch_dmap(&x, dev, &host->d); /* addresses only */
	if (!host->d.n_blk)
		return DCAST_OK;
	k_batch_lut<<<blocks_for(host->d.n_cpt), DECODE_THREADS, 0, (cudaStream_t)stream>>>(x);
	k_batch_decode<<<grid, DECODE_THREADS, 0, (cudaStream_t)stream>>>(x, pos, code);
	k_batch_decode2<<<blocks_for((host->d.n_blk + DECODE_THREADS / 32 - 1) / (DECODE_THREADS / 32)), DECODE_THREADS,
			  0, (cudaStream_t)stream>>>(x, pos, code);
	k_batch_chain<<<grid, DECODE_THREADS, 0, (cudaStream_t)stream>>>(x);
	e = cudaGetLastError();
	return e == cudaSuccess ? DCAST_OK : batch_fail(e, "decode launch");
}

extern "C" int dcast_cuda_batch_copy(void *dst, const void *src, uint64_t bytes, int wait, void *stream)
{
	cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream);

	if (!e && wait)
		e = cudaStreamSynchronize((cudaStream_t)stream);
	return e == cudaSuccess ? DCAST_OK : batch_fail(e, "copy");
}

extern "C" int dcast_cuda_batch_sync(void *stream)
{
	cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);

	return e == cudaSuccess ? DCAST_OK : batch_fail(e, "synchronize");
}

extern "C" int dcast_cuda_batch_event(void **event)
{
	cudaError_t e = cudaEventCreateWithFlags((cudaEvent_t *)event, cudaEventDisableTiming);

	if (e)
		*event = NULL;
	return e == cudaSuccess ? DCAST_OK : batch_fail(e, "cudaEventCreateWithFlags");
}

extern "C" void dcast_cuda_batch_event_free(void *event)
{
	if (event)
		cudaEventDestroy((cudaEvent_t)event);
}

extern "C" int dcast_cuda_batch_record(void *event, void *stream)
{
	cudaError_t e = cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream);

	return e == cudaSuccess ? DCAST_OK : batch_fail(e, "cudaEventRecord");
}

extern "C" int dcast_cuda_batch_wait(void *stream, void *event)
{
	cudaError_t e = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0);

	return e == cudaSuccess ? DCAST_OK : batch_fail(e, "cudaStreamWaitEvent");
}

extern "C" int dcast_cuda_batch_event_sync(void *event)
{
	cudaError_t e = cudaEventSynchronize((cudaEvent_t)event);

	return e == cudaSuccess ? DCAST_OK : batch_fail(e, "cudaEventSynchronize");
}

extern "C" int dcast_cuda_batch_device_of(const void *ptr, int *device)
{
	cudaPointerAttributes a;
	cudaError_t e = cudaPointerGetAttributes(&a, ptr);

	if (e)
		return batch_fail(e, "cudaPointerGetAttributes");
	if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
		return dcast_fail(DCAST_EINVAL, "batch: a segment's range is not device memory");
	*device = a.device;
	return DCAST_OK;
}

extern "C" int dcast_cuda_batch_enter(int device, int *prev)
{
	cudaError_t e = cudaGetDevice(prev);

	if (!e && *prev != device)
		e = cudaSetDevice(device);
	return e == cudaSuccess ? DCAST_OK : batch_fail(e, "cudaSetDevice");
}

extern "C" void dcast_cuda_batch_leave(int prev)
{
	cudaSetDevice(prev);
}

extern "C" int dcast_cuda_batch_stream(void **stream)
{
	cudaError_t e = cudaStreamCreateWithFlags((cudaStream_t *)stream, cudaStreamNonBlocking);

	if (e)
		*stream = NULL;
	return e == cudaSuccess ? DCAST_OK : batch_fail(e, "cudaStreamCreateWithFlags");
}

extern "C" void dcast_cuda_batch_stream_free(void *stream)
{
	if (stream)
		cudaStreamDestroy((cudaStream_t)stream);
}

extern "C" int dcast_cuda_batch_reserve(void **dev, uint64_t *cap, uint64_t bytes)
{
	uint64_t want = bytes + bytes / 4;
	cudaError_t e;

	if (*dev && *cap >= bytes)
		return DCAST_OK;
	dcast_cuda_batch_free(dev, cap);
	if ((e = cudaMalloc(dev, want ? want : 1)) != cudaSuccess) {
		*dev = NULL;
		return dcast_fail(DCAST_ENOMEM, "batch: cudaMalloc of %" PRIu64 " bytes: %s", want,
				  cudaGetErrorString(e));
	}
	*cap = want;
	return DCAST_OK;
}

extern "C" void dcast_cuda_batch_free(void **dev, uint64_t *cap)
{
	if (*dev)
		cudaFree(*dev);
	*dev = NULL;
	*cap = 0;
}
