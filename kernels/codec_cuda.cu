/* The delta codec on a CUDA device: the twins of codec.c and digest.c.
 * Bit-level logic comes from codec_shared.h / xxh3_hd.h (shared with the CPU,
 * which is the oracle); this file only distributes it over threads:
 * ordered compaction of changed elements (tile counts, scan, block scan),
 * per-element code lengths + prefix sum + atomicOr scatter for the compact
 * bitstream, per-block decoding from the block index, and a warp per 1 MiB
 * digest block.  Decisions (k, table, encoding) are made on the host from
 * device-computed stats with the same functions the CPU codec uses, so the
 * bytes are identical.  Apply checks everything on the device and only then
 * lets the write kernel (which reads the error word first) touch dst. */
#include <inttypes.h>
#include <pthread.h>
#include <cub/cub.cuh>
#include <cuda_runtime.h>
#include "codec_shared.h"
#include "batch_decode.h"
#include "deltacast/codec_cuda.h"
#include "deltacast/schema.h"
extern "C" {
#include "dcast_common.h"
}

#define TILE 4096u        /* elements per compaction tile */
#define TILE_THREADS 256u /* 16 elements per thread */
static_assert(TILE / TILE_THREADS == 16, "diff16 gives each thread 16 elements");
#define NO_ERROR 0xffffffffffffffffull

/* ---- error plumbing and scratch ---- */

static int cuda_fail(cudaError_t e, const char *what)
{
	return dcast_fail(DCAST_ECUDA, "%s: %s", what, cudaGetErrorString(e));
}

#define CU(call, what)                                        \
	do {                                                  \
		cudaError_t e_ = (call);                      \
		if (e_ != cudaSuccess) {                      \
			rc = cuda_fail(e_, what);             \
			goto out;                             \
		}                                             \
	} while (0)

/* Device scratch taken on the stream and given back together. */
struct scratch {
	void *p[24];
	unsigned n;
	cudaStream_t s;
};

/* The codec's own memory pool per device, which keeps up to
 * SCRATCH_KEEP_BYTES of freed scratch between calls: the default pool
 * gives freed memory back to the driver at every synchronization (its
 * release threshold is 0), so each call would map its scratch afresh.
 * Our own pool leaves the application's default pool as it set it.  NULL
 * (no pool: the default one is used) if it cannot be made. */
#define SCRATCH_KEEP_BYTES (128ull << 20)
#define SCRATCH_DEVICES 64

static cudaMemPool_t scratch_pool(void)
{
	static cudaMemPool_t pools[SCRATCH_DEVICES];
	static int tried[SCRATCH_DEVICES];
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	cudaMemPoolProps props = {};
	uint64_t keep = SCRATCH_KEEP_BYTES;
	cudaMemPool_t pool;
	int dev;

	if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= SCRATCH_DEVICES)
		return NULL;
	pthread_mutex_lock(&lock);
	if (!tried[dev]) {
		tried[dev] = 1;
		props.allocType = cudaMemAllocationTypePinned;
		props.handleTypes = cudaMemHandleTypeNone;
		props.location.type = cudaMemLocationTypeDevice;
		props.location.id = dev;
		if (cudaMemPoolCreate(&pools[dev], &props) != cudaSuccess)
			pools[dev] = NULL;
		else
			cudaMemPoolSetAttribute(pools[dev], cudaMemPoolAttrReleaseThreshold, &keep);
		cudaGetLastError(); /* a refused pool is not the caller's error */
	}
	pool = pools[dev];
	pthread_mutex_unlock(&lock);
	return pool;
}

static cudaError_t scratch_get(scratch *sc, void **p, size_t bytes)
{
	if (sc->n == sizeof(sc->p) / sizeof(sc->p[0]))
		return cudaErrorMemoryAllocation; /* a call holds at most 24 */
	cudaMemPool_t pool = scratch_pool();
	cudaError_t e = pool ? cudaMallocFromPoolAsync(p, bytes ? bytes : 8, pool, sc->s)
			     : cudaMallocAsync(p, bytes ? bytes : 8, sc->s);
	if (e == cudaSuccess)
		sc->p[sc->n++] = *p;
	return e;
}

static void scratch_put(scratch *sc)
{
	for (unsigned i = 0; i < sc->n; i++)
		cudaFreeAsync(sc->p[i], sc->s);
	sc->n = 0;
}

static unsigned grid_for(uint64_t n, unsigned threads)
{
	uint64_t g = (n + threads - 1) / threads;
	return (unsigned)(g ? (g < (1u << 30) ? g : (1u << 30)) : 1);
}

extern "C" int dcast_cuda_available(void)
{
	static int state = -1; /* -1 unknown, 0 none, 1 present */
	if (state >= 0)
		return state;
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n <= 0) {
		DCAST_LOG_I("no CUDA device: using CPU codec (%s)",
			    e != cudaSuccess ? cudaGetErrorString(e) : "device count 0");
		state = 0;
	} else {
		state = 1;
	}
	return state;
}

/* ---- element access ---- */

template <unsigned ES> __device__ __forceinline__ uint32_t ld(const void *p, uint64_t i)
{
	if (ES == 1)
		return ((const uint8_t *)p)[i];
	if (ES == 2)
		return ((const uint16_t *)p)[i];
	return ((const uint32_t *)p)[i];
}

template <unsigned ES> __device__ __forceinline__ void st(void *p, uint64_t i, uint32_t v)
{
	if (ES == 1)
		((uint8_t *)p)[i] = (uint8_t)v;
	else if (ES == 2)
		((uint16_t *)p)[i] = (uint16_t)v;
	else
		((uint32_t *)p)[i] = v;
}

__device__ __forceinline__ void st_bytes(uint8_t *p, uint32_t v, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* ---- encode: ordered compaction, over one range or many ---- */

/* Tiles never straddle a range: block b is tile b % tpr of range b / tpr
 * (rs[] in device memory), clipped to the range (its last tiles may be
 * empty).  Positions are relative to the range's first element. */
__device__ __forceinline__ const dcast_cuda_range *seg_tile(const dcast_cuda_range *rs, unsigned tpr,
							      uint64_t b, uint64_t *lo, uint64_t *hi)
{
	const dcast_cuda_range *r = rs + b / tpr;
	uint64_t l = b % tpr * TILE;
	*lo = l < r->count ? l : r->count;
	*hi = l + TILE < r->count ? l + TILE : r->count;
	return r;
}

struct max_op {
	__device__ unsigned operator()(unsigned a, unsigned b) const { return a > b ? a : b; }
};

/* Word q (of 4 * ES) of a thread's ES 16-byte vectors. */
__device__ __forceinline__ uint32_t word_of(const uint4 *c, unsigned q)
{
	const uint4 v = c[q >> 2];
	switch (q & 3) {
	case 0: return v.x;
	case 1: return v.y;
	case 2: return v.z;
	default: return v.w;
	}
}

__device__ __forceinline__ void word_set(uint4 *c, unsigned q, uint32_t w)
{
	uint4 &v = c[q >> 2];
	switch (q & 3) {
	case 0: v.x = w; break;
	case 1: v.y = w; break;
	case 2: v.z = w; break;
	default: v.w = w; break;
	}
}

/* Element j (of 16) of those vectors. */
template <unsigned ES> __device__ __forceinline__ uint32_t elem_of(const uint4 *c, unsigned j)
{
	uint32_t w = word_of(c, j * ES / 4);

	if (ES == 4)
		return w;
	return (w >> (j * ES % 4 * 8)) & (ES == 1 ? 0xffu : 0xffffu);
}

template <unsigned ES> __device__ __forceinline__ void elem_put(uint4 *c, unsigned j, uint32_t e)
{
	unsigned q = j * ES / 4, sh = j * ES % 4 * 8;
	uint32_t mask = ES == 4 ? 0xffffffffu : (ES == 1 ? 0xffu : 0xffffu) << sh;

	word_set(c, q, (word_of(c, q) & ~mask) | (e << sh));
}

/* A thread's 16 consecutive elements from `first` of range r (those at
 * or past hi read as 0): cur's into c, base's into b, packed as they lie
 * in memory (ES vectors of 16 bytes each, so a thread holds 8 * ES
 * registers of values), and a bit per element that differs.  16-byte
 * loads where both arrays are 16-byte aligned and all 16 lie in the
 * range, else one by one: each element is read once either way. */
template <unsigned ES>
__device__ __forceinline__ unsigned diff16(const dcast_cuda_range *r, uint64_t first, uint64_t hi, uint4 *c,
					   uint4 *b)
{
	unsigned m = 0;

	if (!(((uintptr_t)r->cur | (uintptr_t)r->base) & 15) && first + 16 <= hi) {
		const uint4 *pc = (const uint4 *)((const uint8_t *)r->cur + first * ES);
		const uint4 *pb = (const uint4 *)((const uint8_t *)r->base + first * ES);
#pragma unroll
		for (unsigned k = 0; k < ES; k++)
			c[k] = pc[k], b[k] = pb[k];
	} else {
#pragma unroll
		for (unsigned k = 0; k < ES; k++)
			c[k] = b[k] = make_uint4(0, 0, 0, 0);
#pragma unroll
		for (unsigned j = 0; j < 16; j++)
			if (first + j < hi) {
				elem_put<ES>(c, j, ld<ES>(r->cur, first + j));
				elem_put<ES>(b, j, ld<ES>(r->base, first + j));
			}
	}
#pragma unroll
	for (unsigned j = 0; j < 16; j++)
		m |= (unsigned)(elem_of<ES>(c, j) != elem_of<ES>(b, j)) << j;
	return m;
}

/* A thread's changes (the bits of m among its 16 elements from first)
 * added to its digest move and, with write, put at out.. of the arrays in
 * position order. */
template <unsigned ES>
__device__ __forceinline__ void put16(const uint4 *cv, const uint4 *bv, unsigned m, uint64_t first, uint64_t out,
				      bool write, dcast_ld_move *move, uint32_t *pos, uint32_t *newv, uint32_t *zz)
{
#pragma unroll
	for (unsigned j = 0; j < 16; j++) {
		uint32_t nv = elem_of<ES>(cv, j), ov = elem_of<ES>(bv, j);
		if (!(m >> j & 1))
			continue;
		dcast_ld_move_add(move, first + j, ov, nv);
		if (write) {
			pos[out] = (uint32_t)(first + j);
			newv[out] = nv;
			zz[out] = dcast_ulp_zz(ov, nv, 8 * ES);
		}
		out++;
	}
}

/* Per tile: its changes, and 1 + the last one's position (0: none).
 * Each thread takes 16 consecutive elements of the tile (diff16). */
template <unsigned ES>
__global__ void k_seg_count(const dcast_cuda_range *rs, unsigned tpr, unsigned *tile_n, unsigned *tile_last)
{
	typedef cub::BlockReduce<unsigned, TILE_THREADS> reduce;
	__shared__ typename reduce::TempStorage tmp;
	uint64_t lo, hi;
	const dcast_cuda_range *r = seg_tile(rs, tpr, blockIdx.x, &lo, &hi);
	uint64_t first = lo + (uint64_t)threadIdx.x * (TILE / TILE_THREADS);
	uint4 cv[ES], bv[ES];
	unsigned m = first < hi ? diff16<ES>(r, first, hi, cv, bv) : 0;
	unsigned c = __popc(m), last = m ? (unsigned)first + 32 - __clz(m) : 0;
	unsigned total = reduce(tmp).Sum(c);
	__syncthreads();
	unsigned mx = reduce(tmp).Reduce(last, max_op());
	if (threadIdx.x == 0) {
		tile_n[blockIdx.x] = total;
		tile_last[blockIdx.x] = mx;
	}
}

/* Each thread takes 16 consecutive elements of the tile (diff16), so a
 * block scan of the per-thread counts gives every change its rank in
 * position order.  Per tile also the additive digest's change: the sum
 * over its changes of the new element's dcast_ldigest term less the old
 * one's (element i of a range is element start + i of its tensor). */
/* At most 40 registers a thread for 1- and 2-byte elements (6 blocks of a
 * multiprocessor at once, 5 at the 47 it takes unbounded), none spilled:
 * the kernel reads at memory speed only with that many tiles in flight. */
template <unsigned ES>
__global__ void __launch_bounds__(TILE_THREADS, ES == 4 ? 4 : 6) k_seg_write(const dcast_cuda_range *rs, unsigned tpr, const unsigned *tile_off, uint32_t *pos,
			    uint32_t *newv, uint32_t *zz, unsigned long long *tile_move)
{
	typedef cub::BlockScan<unsigned, TILE_THREADS> scan;
	typedef cub::BlockReduce<unsigned long long, TILE_THREADS> reduce;
	__shared__ typename scan::TempStorage stmp;
	__shared__ typename reduce::TempStorage rtmp;
	uint64_t lo, hi;
	const dcast_cuda_range *r = seg_tile(rs, tpr, blockIdx.x, &lo, &hi);
	uint64_t first = lo + (uint64_t)threadIdx.x * (TILE / TILE_THREADS);
	uint4 cv[ES], bv[ES];
	unsigned m = first < hi ? diff16<ES>(r, first, hi, cv, bv) : 0, rank;
	dcast_ld_move move;
	dcast_ld_move_init(&move, r->tensor, r->start);
	scan(stmp).ExclusiveSum((unsigned)__popc(m), rank);
	put16<ES>(cv, bv, m, first, (uint64_t)tile_off[blockIdx.x] + rank, true, &move, pos, newv, zz);
	unsigned long long total = reduce(rtmp).Sum((unsigned long long)move.acc);
	if (threadIdx.x == 0 && tile_move)
		tile_move[blockIdx.x] = total;
}

/* Every range's baseline made equal to its cur (the elements that differ). */
template <unsigned ES>
__global__ void k_seg_base(const dcast_cuda_range *rs, unsigned tpr)
{
	uint64_t lo, hi;
	const dcast_cuda_range *r = seg_tile(rs, tpr, blockIdx.x, &lo, &hi);
	for (uint64_t i = lo + threadIdx.x; i < hi; i += TILE_THREADS) {
		uint32_t nv = ld<ES>(r->cur, i);
		if (nv != ld<ES>(r->base, i))
			st<ES>(r->base, i, nv);
	}
}

/* Symbol histogram and exact position bits under k. */
__global__ void k_stats(const uint32_t *pos, const uint32_t *zz, uint64_t n, unsigned k,
			unsigned long long *hist, unsigned long long *pos_bits)
{
	__shared__ unsigned long long sh[DCAST_CPT_NSYM_MAX];
	__shared__ unsigned long long sbits;
	for (unsigned i = threadIdx.x; i < DCAST_CPT_NSYM_MAX; i += blockDim.x)
		sh[i] = 0;
	if (threadIdx.x == 0)
		sbits = 0;
	__syncthreads();
	unsigned long long bits = 0;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint32_t prev_next = i ? pos[i - 1] + 1 : 0;
		atomicAdd(&sh[dcast_cpt_symbol(zz[i])], 1ull);
		bits += dcast_rice_len(pos[i] - prev_next, k);
	}
	atomicAdd(&sbits, bits);
	__syncthreads();
	for (unsigned i = threadIdx.x; i < DCAST_CPT_NSYM_MAX; i += blockDim.x)
		if (sh[i])
			atomicAdd(&hist[i], sh[i]);
	if (threadIdx.x == 0)
		atomicAdd(pos_bits, sbits);
}

/* ---- encode: emitters ---- */

template <unsigned ES>
__global__ void k_emit_idx32(const uint32_t *pos, const uint32_t *newv, uint64_t n, uint8_t *out)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		st_bytes(out + i * (4 + ES), pos[i], 4);
		st_bytes(out + i * (4 + ES) + 4, newv[i], ES);
	}
}

/* Mask bits first (atomicOr on words of the zeroed mask), values in a
 * second kernel: the last mask word may share bytes with the values. */
__global__ void k_emit_mask(const uint32_t *pos, uint64_t n, uint8_t *out)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		atomicOr((unsigned *)out + pos[i] / 32, 1u << (pos[i] % 32));
}

template <unsigned ES>
__global__ void k_emit_values(const uint32_t *newv, uint64_t n, uint8_t *out)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		st_bytes(out + i * ES, newv[i], ES);
}

/* Code length of change i (position + value) of a range's changes. */
__device__ __forceinline__ unsigned long long cpt_len_one(const uint32_t *pos, const uint32_t *newv,
							  const uint32_t *zz, uint64_t i, const dcast_cpt_plan *plan)
{
	uint32_t prev_next = i ? pos[i - 1] + 1 : 0;
	unsigned vl;
	dcast_cpt_value_bits(plan, zz[i], newv[i], &vl);
	return dcast_rice_len(pos[i] - prev_next, plan->k) + vl;
}

__global__ void k_cpt_len(const uint32_t *pos, const uint32_t *newv, const uint32_t *zz, uint64_t n,
			  dcast_cpt_plan plan, unsigned long long *len)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		len[i] = cpt_len_one(pos, newv, zz, i, &plan);
}

/* OR `len` (<= 57) bits of v into the zeroed stream at bit `at`. */
__device__ __forceinline__ void put_bits(unsigned long long *words, uint64_t at, uint64_t v, unsigned len)
{
	unsigned sh = (unsigned)(at & 63);
	atomicOr(&words[at >> 6], (unsigned long long)(v << sh));
	if (sh && sh + len > 64)
		atomicOr(&words[(at >> 6) + 1], (unsigned long long)(v >> (64 - sh)));
}

/* Change i of a range's changes into its stream at bit `at`, and its block
 * index entry where one starts (`at` relative to the stream's start). */
__device__ __forceinline__ void cpt_emit_one(const uint32_t *pos, const uint32_t *newv, const uint32_t *zz,
					     uint64_t i, const dcast_cpt_plan *plan, uint64_t at,
					     unsigned long long *words, uint8_t *index)
{
	uint32_t gap = pos[i] - (i ? pos[i - 1] + 1 : 0);
	unsigned rl = dcast_rice_len(gap, plan->k), vl;
	uint64_t vb = dcast_cpt_value_bits(plan, zz[i], newv[i], &vl);
	put_bits(words, at, dcast_rice_bits(gap, plan->k), rl);
	put_bits(words, at + rl, vb, vl);
	if (i && i % DCAST_CPT_BLOCK == 0) {
		uint8_t *e = index + (i / DCAST_CPT_BLOCK - 1) * DCAST_CPT_INDEX_ENTRY;
		st_bytes(e, (uint32_t)at, 4);
		st_bytes(e + 4, pos[i - 1], 4);
	}
}

__global__ void k_cpt_emit(const uint32_t *pos, const uint32_t *newv, const uint32_t *zz, uint64_t n,
			   dcast_cpt_plan plan, const unsigned long long *off,
			   unsigned long long *words, uint8_t *index)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		cpt_emit_one(pos, newv, zz, i, &plan, off[i], words, index);
}

template <unsigned ES>
__global__ void k_update_base(const uint32_t *pos, const uint32_t *newv, uint64_t n, void *base)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		st<ES>(base, pos[i], newv[i]);
}

/* ---- encode: host driver ---- */

struct changes_dev {
	uint64_t n;
	uint32_t *pos, *newv, *zz;
};

template <unsigned ES>
static int find_changes(const void *cur, const void *base, uint64_t count, scratch *sc,
			changes_dev *ch)
{
	int rc = DCAST_OK;
	uint64_t ntiles = (count + TILE - 1) / TILE;
	unsigned *tile_n = NULL, *tile_off = NULL, *tile_last = NULL, last[2] = { 0, 0 };
	dcast_cuda_range one = { cur, (void *)base, count, 0, 0 }, *dev_one = NULL;
	void *tmp = NULL;
	size_t tmp_bytes = 0;
	CU(scratch_get(sc, (void **)&dev_one, sizeof(one)), "cudaMallocAsync(range)");
	CU(scratch_get(sc, (void **)&tile_n, (ntiles + 1) * 4), "cudaMallocAsync(tile counts)");
	CU(scratch_get(sc, (void **)&tile_off, (ntiles + 1) * 4), "cudaMallocAsync(tile offsets)");
	CU(scratch_get(sc, (void **)&tile_last, (ntiles + 1) * 4), "cudaMallocAsync(tile ends)");
	CU(cudaMemcpyAsync(dev_one, &one, sizeof(one), cudaMemcpyHostToDevice, sc->s), "copy range");
	CU(cudaMemsetAsync(tile_n, 0, (ntiles + 1) * 4, sc->s), "cudaMemsetAsync");
	if (ntiles)
		k_seg_count<ES><<<(unsigned)ntiles, TILE_THREADS, 0, sc->s>>>(dev_one, (unsigned)ntiles, tile_n,
									      tile_last);
	CU(cudaGetLastError(), "k_seg_count");
	CU(cub::DeviceScan::ExclusiveSum(NULL, tmp_bytes, tile_n, tile_off, (int)(ntiles + 1), sc->s),
	   "cub scan size");
	CU(scratch_get(sc, &tmp, tmp_bytes), "cudaMallocAsync(scan)");
	CU(cub::DeviceScan::ExclusiveSum(tmp, tmp_bytes, tile_n, tile_off, (int)(ntiles + 1), sc->s),
	   "cub scan");
	CU(cudaMemcpyAsync(last, tile_off + ntiles, 4, cudaMemcpyDeviceToHost, sc->s), "copy count");
	CU(cudaStreamSynchronize(sc->s), "sync");
	ch->n = last[0];
	CU(scratch_get(sc, (void **)&ch->pos, ch->n * 4), "cudaMallocAsync(pos)");
	CU(scratch_get(sc, (void **)&ch->newv, ch->n * 4), "cudaMallocAsync(newv)");
	CU(scratch_get(sc, (void **)&ch->zz, ch->n * 4), "cudaMallocAsync(zz)");
	if (ntiles && ch->n)
		k_seg_write<ES><<<(unsigned)ntiles, TILE_THREADS, 0, sc->s>>>(dev_one, (unsigned)ntiles, tile_off,
									      ch->pos, ch->newv, ch->zz, NULL);
	CU(cudaGetLastError(), "k_seg_write");
out:
	return rc;
}

/* From stats the device made (h: k_stats' histogram, then the exact
 * position bits) of n changes among count elements: the compact plan,
 * exactly as the CPU makes it, every encoding's size, and the encoding
 * to use (force_encoding, else the smallest of 0..3: the device writes no
 * compact2, whose size is left at UINT64_MAX). */
static int plan_pick(uint64_t count, unsigned es, uint64_t n, uint64_t gap_sum, const unsigned long long *h,
		     int force, dcast_cpt_plan *plan, uint64_t sizes[DCAST_ENC_COUNT])
{
	dcast_cpt_stats st = {};
	st.changed = n;
	st.gap_sum = gap_sum;
	for (unsigned i = 0; i < DCAST_CPT_NSYM_MAX; i++)
		st.hist[i] = h[i];
	dcast_cpt_plan_make(&st, 8 * es, plan);
	plan->pos_bits = h[DCAST_CPT_NSYM_MAX];
	dcast_simple_sizes(count, es, n, sizes);
	sizes[DCAST_ENC_COMPACT] = dcast_cpt_bytes(plan);
	sizes[DCAST_ENC_COMPACT2] = UINT64_MAX;
	return force >= 0 ? force : dcast_pick_smallest(sizes);
}

/* The compact stats of one range's changes (into host, as plan_pick
 * takes them) and their gap sum. */
static int compact_stats(const changes_dev *ch, scratch *sc, uint64_t *gap_sum,
			 unsigned long long host[DCAST_CPT_NSYM_MAX + 1])
{
	int rc = DCAST_OK;
	unsigned long long *dev = NULL;
	uint32_t last = 0;
	*gap_sum = 0;
	if (ch->n) {
		CU(cudaMemcpyAsync(&last, ch->pos + ch->n - 1, 4, cudaMemcpyDeviceToHost, sc->s), "copy pos");
		CU(cudaStreamSynchronize(sc->s), "sync");
		*gap_sum = (uint64_t)last + 1 - ch->n;
	}
	CU(scratch_get(sc, (void **)&dev, (DCAST_CPT_NSYM_MAX + 1) * 8), "cudaMallocAsync(stats)");
	CU(cudaMemsetAsync(dev, 0, (DCAST_CPT_NSYM_MAX + 1) * 8, sc->s), "cudaMemsetAsync");
	if (ch->n)
		k_stats<<<grid_for(ch->n, 256) < 1024 ? grid_for(ch->n, 256) : 1024, 256, 0, sc->s>>>(
			ch->pos, ch->zz, ch->n, dcast_cpt_choose_k(ch->n, *gap_sum), dev, dev + DCAST_CPT_NSYM_MAX);
	CU(cudaGetLastError(), "k_stats");
	CU(cudaMemcpyAsync(host, dev, (DCAST_CPT_NSYM_MAX + 1) * 8, cudaMemcpyDeviceToHost, sc->s), "copy stats");
	CU(cudaStreamSynchronize(sc->s), "sync");
out:
	return rc;
}

static int emit_compact(const changes_dev *ch, const dcast_cpt_plan *plan, scratch *sc, uint8_t *dev_out)
{
	int rc = DCAST_OK;
	uint8_t hdr[32];
	unsigned hb = dcast_cpt_hdr_bytes(plan->mode, plan->w);
	uint64_t soff = dcast_cpt_stream_off(plan), sbytes = (plan->pos_bits + plan->val_bits + 7) / 8;
	unsigned long long *len = NULL, *off = NULL;
	void *tmp = NULL;
	size_t tmp_bytes = 0;
	dcast_cpt_hdr_write(plan, hdr);
	CU(cudaMemcpyAsync(dev_out, hdr, hb, cudaMemcpyHostToDevice, sc->s), "copy header");
	CU(cudaMemsetAsync(dev_out + soff, 0, (sbytes + 15) & ~7ull, sc->s), "cudaMemsetAsync");
	if (!ch->n)
		goto out;
	CU(scratch_get(sc, (void **)&len, ch->n * 8), "cudaMallocAsync(len)");
	CU(scratch_get(sc, (void **)&off, ch->n * 8), "cudaMallocAsync(off)");
	k_cpt_len<<<grid_for(ch->n, 256), 256, 0, sc->s>>>(ch->pos, ch->newv, ch->zz, ch->n, *plan, len);
	CU(cudaGetLastError(), "k_cpt_len");
	CU(cub::DeviceScan::ExclusiveSum(NULL, tmp_bytes, len, off, (int)ch->n, sc->s), "cub scan size");
	CU(scratch_get(sc, &tmp, tmp_bytes), "cudaMallocAsync(scan)");
	CU(cub::DeviceScan::ExclusiveSum(tmp, tmp_bytes, len, off, (int)ch->n, sc->s), "cub scan");
	k_cpt_emit<<<grid_for(ch->n, 256), 256, 0, sc->s>>>(ch->pos, ch->newv, ch->zz, ch->n, *plan, off,
							     (unsigned long long *)(dev_out + soff),
							     dev_out + hb);
	CU(cudaGetLastError(), "k_cpt_emit");
out:
	return rc;
}

template <unsigned ES>
static int emit_dev(int enc, const changes_dev *ch, const dcast_cpt_plan *plan, uint64_t count,
		    scratch *sc, uint8_t *dev_out)
{
	int rc = DCAST_OK;
	unsigned g = grid_for(ch->n, 256);
	uint64_t mb = dcast_bitmask_bytes(count);
	switch (enc) {
	case DCAST_ENC_IDX32:
		if (ch->n)
			k_emit_idx32<ES><<<g, 256, 0, sc->s>>>(ch->pos, ch->newv, ch->n, dev_out);
		break;
	case DCAST_ENC_BITMASK:
		CU(cudaMemsetAsync(dev_out, 0, (mb + 3) & ~3ull, sc->s), "cudaMemsetAsync");
		if (ch->n) {
			k_emit_mask<<<g, 256, 0, sc->s>>>(ch->pos, ch->n, dev_out);
			k_emit_values<ES><<<g, 256, 0, sc->s>>>(ch->newv, ch->n, dev_out + mb);
		}
		break;
	default:
		return emit_compact(ch, plan, sc, dev_out);
	}
	CU(cudaGetLastError(), "emit kernel");
out:
	return rc;
}

template <unsigned ES>
static int encode_delta(const void *cur, void *base, uint64_t count, int force, unsigned flags,
			void *out, dcast_chunk_info *info, scratch *sc)
{
	int rc;
	changes_dev ch = {};
	dcast_cpt_plan plan;
	uint64_t sizes[DCAST_ENC_COUNT], gap_sum;
	unsigned long long stats[DCAST_CPT_NSYM_MAX + 1];
	uint8_t *dev_out = NULL;
	if ((rc = find_changes<ES>(cur, base, count, sc, &ch)) || (rc = compact_stats(&ch, sc, &gap_sum, stats)))
		return rc;
	int enc = plan_pick(count, ES, ch.n, gap_sum, stats, force, &plan, sizes);
	if (enc == DCAST_ENC_DENSE) {
		CU(cudaMemcpyAsync(out, cur, count * ES, cudaMemcpyDefault, sc->s), "copy dense");
	} else {
		CU(scratch_get(sc, (void **)&dev_out, ((sizes[enc] + 64) & ~7ull)), "cudaMallocAsync(payload)");
		if ((rc = emit_dev<ES>(enc, &ch, &plan, count, sc, dev_out)))
			return rc;
		CU(cudaMemcpyAsync(out, dev_out, sizes[enc], cudaMemcpyDefault, sc->s), "copy payload");
	}
	if ((flags & DCAST_ENCODE_UPDATE_BASE) && ch.n)
		k_update_base<ES><<<grid_for(ch.n, 256), 256, 0, sc->s>>>(ch.pos, ch.newv, ch.n, base);
	CU(cudaGetLastError(), "k_update_base");
	CU(cudaStreamSynchronize(sc->s), "sync");
	*info = dcast_chunk_info{ (uint32_t)enc, ES, count, ch.n, sizes[enc] };
out:
	return rc;
}

static int check_aligned(const void *p, unsigned es, const char *what)
{
	if ((uintptr_t)p % es)
		return dcast_fail(DCAST_EINVAL, "%s: device pointer not aligned to elem_size %u", what, es);
	return DCAST_OK;
}

extern "C" int dcast_cuda_encode(const void *cur, void *base, uint64_t count, unsigned elem_size,
				 int force_encoding, unsigned flags, void *out, size_t out_cap,
				 dcast_chunk_info *info, void *stream)
{
	scratch sc = {};
	sc.s = (cudaStream_t)stream;
	int rc = dcast_codec_check_encode(count, elem_size, force_encoding, out_cap);
	if (!rc && force_encoding == DCAST_ENC_COMPACT2)
		return dcast_fail(DCAST_EINVAL, "dcast_cuda_encode: the device writes no compact2 (dcast_codec_encode does)");
	if (rc || (rc = check_aligned(cur, elem_size, "dcast_cuda_encode cur")) ||
	    (rc = check_aligned(base, elem_size, "dcast_cuda_encode base")))
		return rc;
	if (!dcast_cuda_available())
		return dcast_fail(DCAST_ENODEVICE, "dcast_cuda_encode: no CUDA device");
	if (!base) {
		if (force_encoding >= 0 && force_encoding != DCAST_ENC_DENSE)
			return dcast_fail(DCAST_EINVAL, "codec: an anchor (base NULL) is dense, not %s",
					  dcast_encoding_name(force_encoding));
		CU(cudaMemcpyAsync(out, cur, count * elem_size, cudaMemcpyDefault, sc.s), "copy anchor");
		CU(cudaStreamSynchronize(sc.s), "sync");
		*info = dcast_chunk_info{ DCAST_ENC_DENSE, elem_size, count, count, count * elem_size };
		return DCAST_OK;
	}
	switch (elem_size) {
	case 1: rc = encode_delta<1>(cur, base, count, force_encoding, flags, out, info, &sc); break;
	case 2: rc = encode_delta<2>(cur, base, count, force_encoding, flags, out, info, &sc); break;
	default: rc = encode_delta<4>(cur, base, count, force_encoding, flags, out, info, &sc); break;
	}
out:
	scratch_put(&sc);
	cudaStreamSynchronize(sc.s);
	return rc;
}

/* ---- encode: many ranges at once (a producer's chunks) ---- */

/* What the segmented kernels know of each range (device memory). */
struct seg_meta {
	uint64_t first;   /* its first change in the arrays of all changes */
	uint64_t out_off; /* its payload's offset in the output */
	unsigned k;       /* the compact Rice parameter */
	unsigned enc;     /* its encoding */
	dcast_cpt_plan plan;
};

/* The range of change c: the last one whose first change is at or before c. */
__device__ __forceinline__ const seg_meta *seg_of(const seg_meta *m, uint64_t nr, uint64_t c)
{
	uint64_t lo = 0, hi = nr - 1;
	while (lo < hi) {
		uint64_t mid = (lo + hi + 1) / 2;
		if (m[mid].first <= c)
			lo = mid;
		else
			hi = mid - 1;
	}
	return m + lo;
}

/* n of a warp's lanes add v to *a: one atomic per group of lanes with the
 * same address (mask: the lanes that call; sm_80 and later sum in the warp). */
__device__ __forceinline__ void warp_add(unsigned mask, unsigned long long *a, unsigned v)
{
#if __CUDA_ARCH__ >= 800
	unsigned same = __match_any_sync(mask, (unsigned long long)a);
	unsigned sum = __reduce_add_sync(same, v);
	if ((threadIdx.x & 31) == (unsigned)__ffs(same) - 1)
		atomicAdd(a, (unsigned long long)sum);
#else
	(void)mask;
	atomicAdd(a, (unsigned long long)v);
#endif
}

/* k_stats over the changes of all ranges, each under its range's k (the
 * first total; with total_at, *total_at of them, none when those pass
 * total: the arrays then hold only some).  A warp takes 32 consecutive
 * changes (mostly of one range, their symbols of a few values): its lanes
 * add into each counter at once. */
__global__ void k_seg_stats(const uint32_t *pos, const uint32_t *zz, uint64_t total, const seg_meta *m,
			    uint64_t nr, unsigned long long *hist, const unsigned *total_at)
{
	uint64_t stride = (uint64_t)gridDim.x * blockDim.x;

	if (total_at && *total_at > total)
		return; /* the pass before wrote only some of them: seg_write's stats count */
	if (total_at)
		total = *total_at;

	for (uint64_t c0 = (uint64_t)blockIdx.x * blockDim.x + (threadIdx.x & ~31u); c0 < total; c0 += stride) {
		uint64_t c = c0 + (threadIdx.x & 31);
		unsigned in = __ballot_sync(0xffffffffu, c < total);
		if (c >= total)
			continue;
		const seg_meta *r = seg_of(m, nr, c);
		unsigned long long *h = hist + (r - m) * (DCAST_CPT_NSYM_MAX + 1);
		uint32_t prev_next = c > r->first ? pos[c - 1] + 1 : 0;
		warp_add(in, &h[dcast_cpt_symbol(zz[c])], 1);
		warp_add(in, &h[DCAST_CPT_NSYM_MAX], (unsigned)dcast_rice_len(pos[c] - prev_next, r->k));
	}
}

/* k_cpt_len over all ranges (0 for changes of ranges not compact). */
__global__ void k_seg_cpt_len(const uint32_t *pos, const uint32_t *newv, const uint32_t *zz, uint64_t total,
			      const seg_meta *m, uint64_t nr, unsigned long long *len)
{
	for (uint64_t c = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; c < total;
	     c += (uint64_t)gridDim.x * blockDim.x) {
		const seg_meta *r = seg_of(m, nr, c);
		len[c] = r->enc != DCAST_ENC_COMPACT ? 0
			 : cpt_len_one(pos + r->first, newv + r->first, zz + r->first, c - r->first, &r->plan);
	}
}

/* k_cpt_emit over all compact ranges: off is the scan of every change's
 * length, so a range's stream starts at off[first]. */
__global__ void k_seg_cpt_emit(const uint32_t *pos, const uint32_t *newv, const uint32_t *zz, uint64_t total,
			       const seg_meta *m, uint64_t nr, const unsigned long long *off, uint8_t *out)
{
	for (uint64_t c = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; c < total;
	     c += (uint64_t)gridDim.x * blockDim.x) {
		const seg_meta *r = seg_of(m, nr, c);
		uint8_t *o = out + r->out_off;
		if (r->enc != DCAST_ENC_COMPACT)
			continue;
		cpt_emit_one(pos + r->first, newv + r->first, zz + r->first, c - r->first, &r->plan,
			     off[c] - off[r->first], (unsigned long long *)(o + dcast_cpt_stream_off(&r->plan)),
			     o + dcast_cpt_hdr_bytes(r->plan.mode, r->plan.w));
	}
}

/* One range's result on the host; its payload lies at host + meta.out_off. */
struct range_out {
	dcast_chunk_info info;
	uint64_t n, last1, move; /* changes, 1 + the last one's position, digest move */
};

struct dcast_cuda_ranges {
	uint64_t n;           /* ranges held by the last encode */
	range_out *r;         /* r_cap of them */
	uint64_t r_cap;
	unsigned char *stats; /* pinned: what goes to the device and comes back */
	size_t stats_cap;
	unsigned char *host;  /* pinned: the payloads */
	size_t host_cap;
	uint64_t used;        /* bytes of host the last encode filled */
	dcast_cuda_ranges *part; /* a group's results, when the ranges go in groups */
};

/* The pinned stats area, in this order, each 8-aligned. */
struct seg_layout {
	size_t desc, meta, tile_off, tile_last, moves, hist, end;
};

/* One encode's arguments and device arrays. */
struct seg_job {
	const dcast_cuda_range *ranges;
	unsigned es, flags, tpr;
	int force;
	uint64_t nr, ntiles, total, max_n;
	seg_layout at;
	dcast_cuda_ranges *o;
	scratch sc;
	dcast_cuda_range *desc;
	seg_meta *meta;
	unsigned *tile_n, *tile_off, *tile_last;
	unsigned long long *tile_move, *hist;
	changes_dev ch;
};

#define AT(j, field, type) ((type *)((j)->o->stats + (j)->at.field))

static size_t align8(size_t n)
{
	return (n + 7) & ~(size_t)7;
}

static void seg_lay_out(seg_job *j)
{
	seg_layout *l = &j->at;
	l->desc = 0;
	l->meta = align8(j->nr * sizeof(dcast_cuda_range));
	l->tile_off = l->meta + align8(j->nr * sizeof(seg_meta));
	l->tile_last = l->tile_off + align8((j->ntiles + 1) * 4);
	l->moves = l->tile_last + align8(j->ntiles * 4);
	l->hist = l->moves + j->ntiles * 8;
	l->end = l->hist + j->nr * (DCAST_CPT_NSYM_MAX + 1) * 8;
}

/* *p at least need bytes, its first keep bytes kept. */
static cudaError_t pinned_grow(unsigned char **p, size_t *cap, size_t need, size_t keep = 0)
{
	unsigned char *q = NULL;
	cudaError_t e;
	if (need <= *cap)
		return cudaSuccess;
	need = need < 2 * *cap ? 2 * *cap : need;
	if (!keep) { /* freed first: the old and the new are not held at once */
		cudaFreeHost(*p);
		*p = NULL;
		*cap = 0;
	}
	if ((e = cudaMallocHost((void **)&q, need)) != cudaSuccess)
		return e;
	if (keep) {
		memcpy(q, *p, keep);
		cudaFreeHost(*p);
	}
	*p = q;
	*cap = need;
	return cudaSuccess;
}

/* What both first passes (seg_count, seg_scan) start from: the pinned
 * stats area, the ranges copied to the device, the range meta and the tile
 * offsets and ends in device scratch. */
static int seg_tables(seg_job *j)
{
	int rc = DCAST_OK;
	CU(pinned_grow(&j->o->stats, &j->o->stats_cap, j->at.end), "cudaMallocHost(stats)");
	memcpy(j->o->stats + j->at.desc, j->ranges, j->nr * sizeof(dcast_cuda_range));
	CU(scratch_get(&j->sc, (void **)&j->desc, j->nr * sizeof(dcast_cuda_range)), "cudaMallocAsync(ranges)");
	CU(scratch_get(&j->sc, (void **)&j->meta, j->nr * sizeof(seg_meta)), "cudaMallocAsync(range meta)");
	CU(scratch_get(&j->sc, (void **)&j->tile_off, (j->ntiles + 1) * 4), "cudaMallocAsync(tile offsets)");
	CU(scratch_get(&j->sc, (void **)&j->tile_last, j->ntiles * 4), "cudaMallocAsync(tile ends)");
	CU(cudaMemcpyAsync(j->desc, j->o->stats + j->at.desc, j->nr * sizeof(dcast_cuda_range),
			   cudaMemcpyHostToDevice, j->sc.s), "copy ranges");
out:
	return rc;
}

/* The tile offsets (with the total after them) and ends to the host, on
 * the job's stream (not waited for). */
static cudaError_t tiles_back(seg_job *j)
{
	cudaError_t e = cudaMemcpyAsync(AT(j, tile_off, unsigned), j->tile_off, (j->ntiles + 1) * 4,
					cudaMemcpyDeviceToHost, j->sc.s);
	return e ? e : cudaMemcpyAsync(AT(j, tile_last, unsigned), j->tile_last, j->ntiles * 4,
				       cudaMemcpyDeviceToHost, j->sc.s);
}

/* Count the changes per tile (one synchronization). */
template <unsigned ES>
static int seg_count(seg_job *j)
{
	int rc = DCAST_OK;
	size_t tmp_bytes = 0;
	void *tmp = NULL;
	if ((rc = seg_tables(j)))
		return rc;
	CU(scratch_get(&j->sc, (void **)&j->tile_n, (j->ntiles + 1) * 4), "cudaMallocAsync(tile counts)");
	CU(cudaMemsetAsync(j->tile_n, 0, (j->ntiles + 1) * 4, j->sc.s), "cudaMemsetAsync");
	k_seg_count<ES><<<(unsigned)j->ntiles, TILE_THREADS, 0, j->sc.s>>>(j->desc, j->tpr, j->tile_n, j->tile_last);
	CU(cudaGetLastError(), "k_seg_count");
	CU(cub::DeviceScan::ExclusiveSum(NULL, tmp_bytes, j->tile_n, j->tile_off, (int)(j->ntiles + 1), j->sc.s),
	   "cub scan size");
	CU(scratch_get(&j->sc, &tmp, tmp_bytes), "cudaMallocAsync(scan)");
	CU(cub::DeviceScan::ExclusiveSum(tmp, tmp_bytes, j->tile_n, j->tile_off, (int)(j->ntiles + 1), j->sc.s),
	   "cub scan");
	CU(tiles_back(j), "copy tile offsets and ends");
	CU(cudaStreamSynchronize(j->sc.s), "sync");
out:
	return rc;
}

/* Each range's share of the changes and its k, from the tile counts. */
static void seg_ranges(seg_job *j)
{
	const unsigned *off = AT(j, tile_off, unsigned), *last = AT(j, tile_last, unsigned);
	seg_meta *m = AT(j, meta, seg_meta);
	j->max_n = 0;
	j->total = off[j->ntiles];
	for (uint64_t r = 0; r < j->nr; r++) {
		range_out *x = &j->o->r[r];
		uint64_t t0 = r * j->tpr, t1 = t0 + j->tpr;
		m[r].first = off[t0];
		x->n = off[t1] - off[t0];
		x->last1 = 0;
		for (uint64_t t = t0; t < t1; t++)
			x->last1 = last[t] > x->last1 ? last[t] : x->last1;
		m[r].k = dcast_cpt_choose_k(x->n, x->last1 - x->n);
		j->max_n = x->n > j->max_n ? x->n : j->max_n;
	}
}

/* The tiles' digest moves and the ranges' stats back to the host (one
 * synchronization). */
static int stats_back(seg_job *j, size_t hbytes)
{
	int rc = DCAST_OK;
	CU(cudaMemcpyAsync(AT(j, moves, unsigned long long), j->tile_move, j->ntiles * 8, cudaMemcpyDeviceToHost,
			   j->sc.s), "copy tile moves");
	CU(cudaMemcpyAsync(AT(j, hist, unsigned long long), j->hist, hbytes, cudaMemcpyDeviceToHost, j->sc.s),
	   "copy stats");
	CU(cudaStreamSynchronize(j->sc.s), "sync");
out:
	return rc;
}

/* The changes written out; per range the compact stats under its k, per
 * tile the digest's change (one synchronization). */
template <unsigned ES>
static int seg_write(seg_job *j)
{
	int rc = DCAST_OK;
	size_t hbytes = j->nr * (DCAST_CPT_NSYM_MAX + 1) * 8;
	unsigned g = grid_for(j->total, 256);
	CU(scratch_get(&j->sc, (void **)&j->tile_move, j->ntiles * 8), "cudaMallocAsync(tile moves)");
	CU(scratch_get(&j->sc, (void **)&j->hist, hbytes), "cudaMallocAsync(stats)");
	CU(scratch_get(&j->sc, (void **)&j->ch.pos, j->total * 4), "cudaMallocAsync(pos)");
	CU(scratch_get(&j->sc, (void **)&j->ch.newv, j->total * 4), "cudaMallocAsync(newv)");
	CU(scratch_get(&j->sc, (void **)&j->ch.zz, j->total * 4), "cudaMallocAsync(zz)");
	CU(cudaMemcpyAsync(j->meta, AT(j, meta, seg_meta), j->nr * sizeof(seg_meta), cudaMemcpyHostToDevice,
			   j->sc.s), "copy range meta");
	CU(cudaMemsetAsync(j->hist, 0, hbytes, j->sc.s), "cudaMemsetAsync");
	k_seg_write<ES><<<(unsigned)j->ntiles, TILE_THREADS, 0, j->sc.s>>>(j->desc, j->tpr, j->tile_off, j->ch.pos,
									    j->ch.newv, j->ch.zz, j->tile_move);
	CU(cudaGetLastError(), "k_seg_write");
	if (j->total)
		k_seg_stats<<<g < 4096 ? g : 4096, 256, 0, j->sc.s>>>(j->ch.pos, j->ch.zz, j->total, j->meta, j->nr,
								     j->hist, NULL);
	CU(cudaGetLastError(), "k_seg_stats");
	return stats_back(j, hbytes);
out:
	return rc;
}

/* ---- one pass: every change found, ranked and written at once ---- */

typedef cub::ScanTileState<unsigned> tile_state;
typedef cub::TilePrefixCallbackOp<unsigned, ::cuda::std::plus<unsigned>, tile_state> tile_prefix;

__global__ void k_tile_init(tile_state ts, int n)
{
	ts.InitializeStatus(n);
}

/* Tile blockIdx.x's changes ranked among all tiles' at once: the block's
 * scan takes the tiles before it from their published sums (a decoupled
 * look-back, as cub's single-pass scan), so the changes are written where
 * they go without a counting pass.  Per tile its first change's rank
 * (tile_off, with the total after the last tile), 1 + its last one's
 * position and its digest move, as k_seg_count and k_seg_write give them;
 * the changes themselves only where all of the tile's fit in cap. */
template <unsigned ES>
__global__ void __launch_bounds__(TILE_THREADS, ES == 4 ? 4 : 6)
	k_seg_scan(const dcast_cuda_range *rs, unsigned tpr, tile_state ts, unsigned *tile_off, unsigned *tile_last,
		   unsigned long long *tile_move, uint32_t *pos, uint32_t *newv, uint32_t *zz, uint64_t cap)
{
	typedef cub::BlockScan<unsigned, TILE_THREADS> scan;
	typedef cub::BlockReduce<unsigned long long, TILE_THREADS> reduce;
	typedef cub::BlockReduce<unsigned, TILE_THREADS> reduce32;
	__shared__ union {
		typename scan::TempStorage s;
		typename reduce::TempStorage r;
		typename reduce32::TempStorage r32;
	} tmp;
	__shared__ typename tile_prefix::TempStorage ptmp;
	__shared__ unsigned sh_end;
	uint64_t lo, hi;
	const dcast_cuda_range *r = seg_tile(rs, tpr, blockIdx.x, &lo, &hi);
	uint64_t first = lo + (uint64_t)threadIdx.x * (TILE / TILE_THREADS);
	uint4 cv[ES], bv[ES];
	unsigned m = first < hi ? diff16<ES>(r, first, hi, cv, bv) : 0, rank, agg;
	dcast_ld_move move;
	dcast_ld_move_init(&move, r->tensor, r->start);
	if (blockIdx.x == 0) {
		scan(tmp.s).ExclusiveSum((unsigned)__popc(m), rank, agg);
		if (threadIdx.x == 0) {
			ts.SetInclusive(0, agg);
			tile_off[0] = 0;
			sh_end = agg;
		}
	} else {
		tile_prefix op(ts, ptmp, ::cuda::std::plus<unsigned>(), (int)blockIdx.x);
		scan(tmp.s).ExclusiveSum((unsigned)__popc(m), rank, op);
		if (threadIdx.x == 0) {
			tile_off[blockIdx.x] = op.GetExclusivePrefix();
			sh_end = op.GetInclusivePrefix();
		}
	}
	__syncthreads();
	if (threadIdx.x == 0 && blockIdx.x == gridDim.x - 1)
		tile_off[gridDim.x] = sh_end;
	put16<ES>(cv, bv, m, first, rank, sh_end <= cap, &move, pos, newv, zz);
	unsigned long long total = reduce(tmp.r).Sum((unsigned long long)move.acc);
	__syncthreads();
	unsigned last = reduce32(tmp.r32).Reduce(m ? (unsigned)first + 32 - __clz(m) : 0u, max_op());
	if (threadIdx.x == 0) {
		tile_move[blockIdx.x] = total;
		tile_last[blockIdx.x] = last;
	}
}

/* Each range's first change and k on the device (as seg_ranges makes
 * them on the host, from the same tile sums), for k_seg_stats. */
__global__ void k_seg_meta(const unsigned *tile_off, const unsigned *tile_last, unsigned tpr, uint64_t nr,
			   seg_meta *m)
{
	uint64_t r = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x, t0 = r * tpr;
	unsigned last1 = 0;

	if (r >= nr)
		return;
	for (uint64_t t = t0; t < t0 + tpr; t++)
		last1 = tile_last[t] > last1 ? tile_last[t] : last1;
	uint64_t n = tile_off[t0 + tpr] - tile_off[t0];
	m[r].first = tile_off[t0];
	m[r].k = dcast_cpt_choose_k(n, last1 - n);
}

/* Changes the one pass writes at most (beyond: seg_write after it): a
 * 32nd of the elements, within max_bytes' 28 bytes a change. */
static uint64_t seg_cap(const seg_job *j, size_t max_bytes)
{
	uint64_t c = j->ntiles * TILE / 32 + TILE;

	return c < max_bytes / 28 ? c : max_bytes / 28;
}

/* seg_count and seg_write in one pass (k_seg_scan), with the ranges' k
 * and the stats made on the device: tile offsets, ends, moves and stats
 * back (one synchronization).  The changes are written when they fit
 * cap; j->total says how many there are. */
template <unsigned ES>
static int seg_scan(seg_job *j, uint64_t cap)
{
	int rc = DCAST_OK;
	size_t hbytes = j->nr * (DCAST_CPT_NSYM_MAX + 1) * 8, ts_bytes = 0;
	unsigned g = grid_for(cap, 256);
	void *ts_mem = NULL;
	tile_state ts;
	if ((rc = seg_tables(j)))
		return rc;
	CU(scratch_get(&j->sc, (void **)&j->tile_move, j->ntiles * 8), "cudaMallocAsync(tile moves)");
	CU(scratch_get(&j->sc, (void **)&j->hist, hbytes), "cudaMallocAsync(stats)");
	CU(scratch_get(&j->sc, (void **)&j->ch.pos, cap * 4 + 4), "cudaMallocAsync(pos)");
	CU(scratch_get(&j->sc, (void **)&j->ch.newv, cap * 4 + 4), "cudaMallocAsync(newv)");
	CU(scratch_get(&j->sc, (void **)&j->ch.zz, cap * 4 + 4), "cudaMallocAsync(zz)");
	CU(tile_state::AllocationSize((int)j->ntiles, ts_bytes), "tile state size");
	CU(scratch_get(&j->sc, &ts_mem, ts_bytes), "cudaMallocAsync(tile state)");
	CU(ts.Init((int)j->ntiles, ts_mem, ts_bytes), "tile state");
	CU(cudaMemsetAsync(j->hist, 0, hbytes, j->sc.s), "cudaMemsetAsync");
	k_tile_init<<<grid_for(j->ntiles, 128), 128, 0, j->sc.s>>>(ts, (int)j->ntiles);
	k_seg_scan<ES><<<(unsigned)j->ntiles, TILE_THREADS, 0, j->sc.s>>>(
		j->desc, j->tpr, ts, j->tile_off, j->tile_last, j->tile_move, j->ch.pos, j->ch.newv, j->ch.zz, cap);
	k_seg_meta<<<grid_for(j->nr, 128), 128, 0, j->sc.s>>>(j->tile_off, j->tile_last, j->tpr, j->nr, j->meta);
	k_seg_stats<<<g < 4096 ? g : 4096, 256, 0, j->sc.s>>>(j->ch.pos, j->ch.zz, cap, j->meta, j->nr, j->hist,
							     j->tile_off + j->ntiles);
	CU(cudaGetLastError(), "k_seg_scan");
	CU(tiles_back(j), "copy tile offsets and ends");
	return stats_back(j, hbytes);
out:
	return rc;
}

/* DELTACAST_CUDA_ONE_PASS=1 in the environment: the ranges' encode finds
 * and writes the changes in one pass (seg_scan) instead of counting them
 * first (seg_count, then seg_write).  Opt-in: measured on an H200 at 0.1
 * and 1% density (docs/benchmarks.md), not yet over its cap since its
 * stats were fixed there. */
static int one_pass(void)
{
	static int v = -1;
	if (v < 0) {
		const char *e = getenv("DELTACAST_CUDA_ONE_PASS");
		v = e && !strcmp(e, "1");
	}
	return v;
}

/* Range r's plan, encoding and info from its stats; its payload bytes. */
static uint64_t seg_plan_one(seg_job *j, uint64_t r)
{
	const unsigned long long *h = AT(j, hist, unsigned long long) + r * (DCAST_CPT_NSYM_MAX + 1);
	seg_meta *m = AT(j, meta, seg_meta) + r;
	range_out *x = &j->o->r[r];
	uint64_t sizes[DCAST_ENC_COUNT], cnt = j->ranges[r].count;
	m->enc = (unsigned)plan_pick(cnt, j->es, x->n, x->last1 - x->n, h, j->force, &m->plan, sizes);
	x->info = dcast_chunk_info{ m->enc, j->es, cnt, x->n, sizes[m->enc] };
	return sizes[m->enc];
}

/* Every range's plan, payload place and digest move; the payload bytes. */
static uint64_t seg_plan(seg_job *j)
{
	const unsigned long long *move = AT(j, moves, unsigned long long);
	seg_meta *m = AT(j, meta, seg_meta);
	uint64_t at = 0;
	for (uint64_t r = 0; r < j->nr; r++) {
		range_out *x = &j->o->r[r];
		m[r].out_off = at;
		at += (seg_plan_one(j, r) + 64 + 255) & ~255ull;
		x->move = 0;
		for (uint64_t t = r * j->tpr; t < (r + 1) * j->tpr; t++)
			x->move += move[t];
	}
	return at;
}

/* The compact payloads of all ranges at once, the others range by range. */
template <unsigned ES>
static int seg_emit_dev(seg_job *j, uint8_t *dev_out)
{
	int rc = DCAST_OK;
	const seg_meta *m = AT(j, meta, seg_meta);
	unsigned long long *len = NULL, *off = NULL;
	unsigned g = grid_for(j->total, 256);
	size_t tmp_bytes = 0;
	void *tmp = NULL;
	CU(scratch_get(&j->sc, (void **)&len, j->total * 8), "cudaMallocAsync(len)");
	CU(scratch_get(&j->sc, (void **)&off, j->total * 8), "cudaMallocAsync(off)");
	CU(cub::DeviceScan::ExclusiveSum(NULL, tmp_bytes, len, off, (int)j->total, j->sc.s), "cub scan size");
	CU(scratch_get(&j->sc, &tmp, tmp_bytes), "cudaMallocAsync(scan)");
	if (j->total) {
		k_seg_cpt_len<<<g, 256, 0, j->sc.s>>>(j->ch.pos, j->ch.newv, j->ch.zz, j->total, j->meta, j->nr, len);
		CU(cub::DeviceScan::ExclusiveSum(tmp, tmp_bytes, len, off, (int)j->total, j->sc.s), "cub scan");
		k_seg_cpt_emit<<<g, 256, 0, j->sc.s>>>(j->ch.pos, j->ch.newv, j->ch.zz, j->total, j->meta, j->nr, off,
						      dev_out);
	}
	CU(cudaGetLastError(), "k_seg_cpt");
	for (uint64_t r = 0; r < j->nr && !rc; r++) {
		changes_dev sub = { j->o->r[r].n, j->ch.pos + m[r].first, j->ch.newv + m[r].first,
				    j->ch.zz + m[r].first };
		if (m[r].enc != DCAST_ENC_COMPACT && m[r].enc != DCAST_ENC_DENSE)
			rc = emit_dev<ES>((int)m[r].enc, &sub, &m[r].plan, j->ranges[r].count, &j->sc,
					  dev_out + m[r].out_off);
	}
out:
	return rc;
}

/* Every payload into the pinned host buffer, then the baselines moved to
 * cur (one synchronization); the compact headers written on the host. */
template <unsigned ES>
static int seg_emit(seg_job *j, uint64_t bytes)
{
	int rc = DCAST_OK;
	const seg_meta *m = AT(j, meta, seg_meta);
	uint8_t *dev_out = NULL;
	CU(pinned_grow(&j->o->host, &j->o->host_cap, bytes), "cudaMallocHost(payloads)");
	CU(scratch_get(&j->sc, (void **)&dev_out, bytes), "cudaMallocAsync(payloads)");
	CU(cudaMemsetAsync(dev_out, 0, bytes, j->sc.s), "cudaMemsetAsync");
	CU(cudaMemcpyAsync(j->meta, m, j->nr * sizeof(seg_meta), cudaMemcpyHostToDevice, j->sc.s), "copy plans");
	if ((rc = seg_emit_dev<ES>(j, dev_out)))
		goto out;
	CU(cudaMemcpyAsync(j->o->host, dev_out, bytes, cudaMemcpyDeviceToHost, j->sc.s), "copy payloads");
	for (uint64_t r = 0; r < j->nr; r++)
		if (m[r].enc == DCAST_ENC_DENSE)
			CU(cudaMemcpyAsync(j->o->host + m[r].out_off, j->ranges[r].cur, j->ranges[r].count * ES,
					   cudaMemcpyDefault, j->sc.s), "copy dense");
	if ((j->flags & DCAST_ENCODE_UPDATE_BASE) && j->total)
		k_seg_base<ES><<<(unsigned)j->ntiles, TILE_THREADS, 0, j->sc.s>>>(j->desc, j->tpr);
	CU(cudaGetLastError(), "k_seg_base");
	CU(cudaStreamSynchronize(j->sc.s), "sync");
	for (uint64_t r = 0; r < j->nr; r++)
		if (m[r].enc == DCAST_ENC_COMPACT)
			dcast_cpt_hdr_write(&m[r].plan, j->o->host + m[r].out_off);
out:
	return rc;
}

template <unsigned ES> static int seg_encode_split(seg_job *j, size_t max_bytes, int *held);

/* The whole encode for one element size; *held = 0 when it gave up
 * before a baseline moved (more than max_bytes of changes or payload). */
template <unsigned ES>
static int seg_encode(seg_job *j, size_t max_bytes, int *held)
{
	int rc;
	uint64_t bytes, cap = one_pass() ? seg_cap(j, max_bytes) : 0;
	if ((rc = cap ? seg_scan<ES>(j, cap) : seg_count<ES>(j)))
		return rc;
	seg_ranges(j);
	if (j->total * 28 > max_bytes) /* pos, newv, zz, len, off */
		return seg_encode_split<ES>(j, max_bytes, held);
	if ((!cap || j->total > cap) && (rc = seg_write<ES>(j)))
		return rc;
	if ((bytes = seg_plan(j)) > max_bytes)
		return DCAST_OK;
	if ((rc = seg_emit<ES>(j, bytes)))
		return rc;
	j->o->n = j->nr;
	j->o->used = bytes;
	*held = 1;
	return DCAST_OK;
}

/* The results of group p (encoded into o->part) as o's ranges r0.. and
 * their payloads after the *at bytes o holds (*at moved past them). */
static int seg_take(seg_job *j, uint64_t r0, uint64_t *at)
{
	dcast_cuda_ranges *o = j->o, *p = o->part;
	const seg_meta *pm = (const seg_meta *)(p->stats + align8(p->n * sizeof(dcast_cuda_range)));
	seg_meta *m = AT(j, meta, seg_meta);
	cudaError_t e = pinned_grow(&o->host, &o->host_cap, *at + p->used, *at);

	if (e != cudaSuccess)
		return cuda_fail(e, "cudaMallocHost(payloads)");
	memcpy(o->host + *at, p->host, p->used);
	for (uint64_t i = 0; i < p->n; i++) {
		o->r[r0 + i] = p->r[i];
		m[r0 + i] = pm[i];
		m[r0 + i].out_off += *at;
	}
	*at += p->used;
	return DCAST_OK;
}

/* The ranges from r0 whose changes fit max_bytes together (seg_ranges
 * counted each one's): one past the last; r0 when r0's alone do not. */
static uint64_t seg_group_end(const seg_job *j, uint64_t r0, size_t max_bytes)
{
	uint64_t n = 0, r1 = r0;

	for (; r1 < j->nr && (n + j->o->r[r1].n) * 28 <= max_bytes; r1++)
		n += j->o->r[r1].n;
	return r1;
}

static int seg_setup(seg_job *j);

/* Group [r0, r1) encoded whole into o->part, its baselines left; *held. */
template <unsigned ES>
static int seg_encode_group(const seg_job *j, uint64_t r0, uint64_t r1, size_t max_bytes, int *held)
{
	seg_job g = {};
	int rc;

	g.ranges = j->ranges + r0, g.nr = r1 - r0, g.es = j->es, g.force = j->force;
	g.flags = j->flags & ~DCAST_ENCODE_UPDATE_BASE;
	g.o = j->o->part, g.sc.s = j->sc.s;
	*held = 0;
	if (!(rc = seg_setup(&g)))
		rc = seg_encode<ES>(&g, max_bytes, held);
	scratch_put(&g.sc);
	return rc;
}

/* Ranges whose changes pass max_bytes together, in groups that fit, one
 * after another (each group counted again), into o; then every baseline
 * moved in one launch.  *held = 0, no baseline moved, when one range's
 * changes alone pass max_bytes, or a group's payloads. */
template <unsigned ES>
static int seg_encode_split(seg_job *j, size_t max_bytes, int *held)
{
	uint64_t at = 0, r1;
	int rc = DCAST_OK, gh = 1;

	if (!j->o->part && !(j->o->part = dcast_cuda_ranges_new()))
		return dcast_fail(DCAST_ENOMEM, "dcast_cuda_ranges_encode: %" PRIu64 " ranges", j->nr);
	for (uint64_t r0 = 0; r0 < j->nr && !rc && gh; r0 = r1) {
		if ((r1 = seg_group_end(j, r0, max_bytes)) == r0)
			return DCAST_OK;
		if (!(rc = seg_encode_group<ES>(j, r0, r1, max_bytes, &gh)) && gh)
			rc = seg_take(j, r0, &at);
	}
	if (rc || !gh)
		return rc;
	if (j->flags & DCAST_ENCODE_UPDATE_BASE) {
		k_seg_base<ES><<<(unsigned)j->ntiles, TILE_THREADS, 0, j->sc.s>>>(j->desc, j->tpr);
		cudaError_t e = cudaGetLastError();
		if (e == cudaSuccess)
			e = cudaStreamSynchronize(j->sc.s);
		if (e != cudaSuccess)
			return cuda_fail(e, "k_seg_base");
	}
	j->o->n = j->nr;
	j->o->used = at;
	*held = 1;
	return DCAST_OK;
}

static int ranges_check(const dcast_cuda_ranges *o, const dcast_cuda_range *rs, uint64_t n, unsigned es,
			int force)
{
	int rc;
	if (!o || (n && !rs))
		return dcast_fail(DCAST_EINVAL, "dcast_cuda_ranges_encode: %s is NULL", o ? "ranges" : "the result");
	if (es != 1 && es != 2 && es != 4)
		return dcast_fail(DCAST_EINVAL, "dcast_cuda_ranges_encode: elem_size %u (1, 2 or 4)", es);
	if (force < -1 || force >= DCAST_ENC_COMPACT2)
		return dcast_fail(DCAST_EINVAL, "dcast_cuda_ranges_encode: force_encoding %d%s", force,
				  force == DCAST_ENC_COMPACT2 ? " (the device writes no compact2)" : "");
	for (uint64_t r = 0; r < n; r++) {
		if (rs[r].count > DCAST_MAX_RANGE_ELEMS || (rs[r].count && (!rs[r].cur || !rs[r].base)))
			return dcast_fail(DCAST_EINVAL, "dcast_cuda_ranges_encode: range %" PRIu64 ": %s", r,
					  rs[r].count > DCAST_MAX_RANGE_ELEMS ? "count past DCAST_MAX_RANGE_ELEMS"
									      : "NULL pointer");
		if ((rc = check_aligned(rs[r].cur, es, "dcast_cuda_ranges_encode cur")) ||
		    (rc = check_aligned(rs[r].base, es, "dcast_cuda_ranges_encode base")))
			return rc;
	}
	if (!dcast_cuda_available())
		return dcast_fail(DCAST_ENODEVICE, "dcast_cuda_ranges_encode: no CUDA device");
	return DCAST_OK;
}

/* Tiles per range (the longest's) and in all; room for the results. */
static int seg_setup(seg_job *j)
{
	uint64_t longest = 1;
	range_out *r;
	for (uint64_t k = 0; k < j->nr; k++)
		longest = j->ranges[k].count > longest ? j->ranges[k].count : longest;
	j->tpr = (unsigned)((longest + TILE - 1) / TILE);
	j->ntiles = j->nr * j->tpr;
	if (j->ntiles >= (1ull << 31))
		return dcast_fail(DCAST_ETOO_LARGE, "dcast_cuda_ranges_encode: %" PRIu64 " ranges make too many "
				  "tiles", j->nr);
	seg_lay_out(j);
	if (j->nr <= j->o->r_cap)
		return DCAST_OK;
	if (!(r = (range_out *)realloc(j->o->r, j->nr * sizeof(*r))))
		return dcast_fail(DCAST_ENOMEM, "dcast_cuda_ranges_encode: %" PRIu64 " ranges", j->nr);
	j->o->r = r;
	j->o->r_cap = j->nr;
	return DCAST_OK;
}

extern "C" dcast_cuda_ranges *dcast_cuda_ranges_new(void)
{
	return (dcast_cuda_ranges *)calloc(1, sizeof(dcast_cuda_ranges));
}

extern "C" void dcast_cuda_ranges_free(dcast_cuda_ranges *o)
{
	if (!o)
		return;
	dcast_cuda_ranges_free(o->part);
	cudaFreeHost(o->stats);
	cudaFreeHost(o->host);
	free(o->r);
	free(o);
}

extern "C" int dcast_cuda_ranges_encode(dcast_cuda_ranges *o, const dcast_cuda_range *ranges, uint64_t n,
					unsigned elem_size, int force_encoding, unsigned flags, size_t max_bytes,
					int *held, void *stream)
{
	seg_job j = {};
	int rc;
	*held = 0;
	if (o)
		o->n = 0;
	if ((rc = ranges_check(o, ranges, n, elem_size, force_encoding)))
		return rc;
	j.ranges = ranges, j.nr = n, j.es = elem_size, j.flags = flags, j.force = force_encoding;
	j.o = o, j.sc.s = (cudaStream_t)stream;
	if (!n) {
		*held = 1;
		return DCAST_OK;
	}
	if ((rc = seg_setup(&j)))
		return rc;
	switch (elem_size) {
	case 1: rc = seg_encode<1>(&j, max_bytes, held); break;
	case 2: rc = seg_encode<2>(&j, max_bytes, held); break;
	default: rc = seg_encode<4>(&j, max_bytes, held); break;
	}
	scratch_put(&j.sc);
	cudaStreamSynchronize(j.sc.s);
	return rc;
}

extern "C" int dcast_cuda_ranges_get(const dcast_cuda_ranges *o, uint64_t k, dcast_chunk_info *info,
				     const void **payload, uint64_t *digest_move)
{
	if (!o || k >= o->n)
		return dcast_fail(DCAST_EINVAL, "dcast_cuda_ranges_get: range %" PRIu64 " of %" PRIu64, k,
				  o ? o->n : 0);
	const seg_meta *m = (const seg_meta *)(o->stats + align8(o->n * sizeof(dcast_cuda_range)));
	*info = o->r[k].info;
	*payload = o->host + m[k].out_off;
	*digest_move = o->r[k].move;
	return DCAST_OK;
}

/* ---- apply ---- */

/* First failing element (atomicMin) and what failed, for the detail. */
struct apply_err {
	unsigned long long elem;
	unsigned code;
};

template <unsigned ES>
__global__ void k_idx32_check(const uint8_t *pl, uint64_t n, uint64_t count, apply_err *err)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint32_t p = dcast_rd32le(pl + i * (4 + ES));
		bool bad = p >= count || (i && p <= dcast_rd32le(pl + (i - 1) * (4 + ES)));
		if (bad)
			atomicMin(&err->elem, (unsigned long long)i);
	}
}

__device__ __forceinline__ uint32_t rd_le(const uint8_t *p, unsigned n)
{
	uint32_t v = 0;
	for (unsigned i = 0; i < n; i++)
		v |= (uint32_t)p[i] << (8 * i);
	return v;
}

template <unsigned ES>
__global__ void k_idx32_apply(const uint8_t *pl, uint64_t n, void *dst, void *old_out,
			      const apply_err *err)
{
	if (err->elem != NO_ERROR)
		return;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		const uint8_t *r = pl + i * (4 + ES);
		uint32_t p = dcast_rd32le(r);
		if (old_out)
			st<ES>(old_out, i, ld<ES>(dst, p));
		st<ES>(dst, p, rd_le(r + 4, ES));
	}
}

__global__ void k_byte_pop(const uint8_t *mask, uint64_t mb, unsigned *pop)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < mb;
	     i += (uint64_t)gridDim.x * blockDim.x)
		pop[i] = __popc(mask[i]);
}

__global__ void k_bitmask_check(const uint8_t *mask, uint64_t mb, uint64_t count, uint64_t changed,
				const unsigned *rank, const unsigned *pop, apply_err *err)
{
	uint64_t ones = mb ? (uint64_t)rank[mb - 1] + pop[mb - 1] : 0;
	if ((count & 7) && (mask[mb - 1] >> (count & 7)))
		err->elem = count, err->code = 1;
	else if (ones != changed)
		err->elem = ones, err->code = 2;
}

template <unsigned ES>
__global__ void k_bitmask_apply(const uint8_t *pl, uint64_t mb, const unsigned *rank, void *dst,
				void *old_out, const apply_err *err)
{
	if (err->elem != NO_ERROR)
		return;
	for (uint64_t b = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; b < mb;
	     b += (uint64_t)gridDim.x * blockDim.x) {
		unsigned r = rank[b];
		for (unsigned bits = pl[b]; bits; bits &= bits - 1, r++) {
			uint64_t p = b * 8 + (__ffs(bits) - 1);
			if (old_out)
				st<ES>(old_out, r, ld<ES>(dst, p));
			st<ES>(dst, p, rd_le(pl + mb + (uint64_t)r * ES, ES));
		}
	}
}

/* One thread per index block: decode it from where the index says. */
struct block_end {
	unsigned long long bit, next;
	int status;
};

__global__ void k_cpt_decode(dcast_cpt_dec d, const uint16_t *lut_dev, const uint8_t *index,
			     uint64_t changed, uint32_t *pos, uint32_t *val, block_end *ends)
{
	__shared__ uint16_t lut[DCAST_CPT_LUT_SIZE];
	for (unsigned i = threadIdx.x; i < DCAST_CPT_LUT_SIZE; i += blockDim.x)
		lut[i] = lut_dev[i];
	__syncthreads();
	d.lut = lut;
	uint64_t b = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	uint64_t nb = dcast_cpt_nblocks(changed);
	if (b >= nb)
		return;
	uint64_t first = b * DCAST_CPT_BLOCK, n = changed - first < DCAST_CPT_BLOCK ? changed - first : DCAST_CPT_BLOCK;
	uint64_t bit = b ? dcast_rd32le(index + (b - 1) * 8) : 0;
	uint64_t next = b ? (uint64_t)dcast_rd32le(index + (b - 1) * 8 + 4) + 1 : 0;
	ends[b].status = dcast_cpt_decode_run(&d, &bit, &next, n, pos + first, val + first);
	ends[b].bit = bit;
	ends[b].next = next;
}

/* Chain the blocks: each must end where the next one's index entry starts. */
__global__ void k_cpt_chain(dcast_cpt_dec d, const uint8_t *index, uint64_t changed,
			    const block_end *ends, apply_err *err)
{
	uint64_t nb = dcast_cpt_nblocks(changed);
	for (uint64_t b = 0; b < nb; b++) {
		int e = ends[b].status;
		if (!e && b + 1 < nb &&
		    (ends[b].bit != dcast_rd32le(index + b * 8) ||
		     ends[b].next != (uint64_t)dcast_rd32le(index + b * 8 + 4) + 1))
			e = DCAST_CPT_EINDEX;
		if (!e && b + 1 == nb)
			e = dcast_cpt_check_trail(&d, ends[b].bit);
		if (e) {
			err->elem = b * DCAST_CPT_BLOCK;
			err->code = (unsigned)e;
			return;
		}
	}
}

template <unsigned ES>
__global__ void k_cpt_apply(const uint32_t *pos, const uint32_t *val, uint64_t n, unsigned mode,
			    void *dst, void *old_out, const apply_err *err)
{
	if (err->elem != NO_ERROR)
		return;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint32_t old = ld<ES>(dst, pos[i]);
		if (old_out)
			st<ES>(old_out, i, old);
		st<ES>(dst, pos[i], mode == DCAST_CPT_RAW ? val[i] : dcast_ulp_apply(old, val[i], 8 * ES));
	}
}

struct apply_ctx {
	const dcast_chunk_info *info;
	const uint8_t *pl;
	void *dst, *old_out;
	apply_err *err;
	scratch *sc;
};

template <unsigned ES> static int apply_idx32(apply_ctx *a)
{
	int rc = dcast_codec_check_size(a->info, a->info->changed * (4 + ES));
	uint64_t n = a->info->changed;
	if (rc || !n)
		return rc;
	k_idx32_check<ES><<<grid_for(n, 256), 256, 0, a->sc->s>>>(a->pl, n, a->info->count, a->err);
	k_idx32_apply<ES><<<grid_for(n, 256), 256, 0, a->sc->s>>>(a->pl, n, a->dst, a->old_out, a->err);
	return DCAST_OK;
}

template <unsigned ES> static int apply_bitmask(apply_ctx *a)
{
	uint64_t mb = dcast_bitmask_bytes(a->info->count);
	int rc = dcast_codec_check_size(a->info, mb + a->info->changed * ES);
	unsigned *pop = NULL, *rank = NULL;
	void *tmp = NULL;
	size_t tmp_bytes = 0;
	if (rc || !mb)
		return rc;
	CU(scratch_get(a->sc, (void **)&pop, mb * 4), "cudaMallocAsync(pop)");
	CU(scratch_get(a->sc, (void **)&rank, mb * 4), "cudaMallocAsync(rank)");
	k_byte_pop<<<grid_for(mb, 256), 256, 0, a->sc->s>>>(a->pl, mb, pop);
	CU(cub::DeviceScan::ExclusiveSum(NULL, tmp_bytes, pop, rank, (int)mb, a->sc->s), "cub scan size");
	CU(scratch_get(a->sc, &tmp, tmp_bytes), "cudaMallocAsync(scan)");
	CU(cub::DeviceScan::ExclusiveSum(tmp, tmp_bytes, pop, rank, (int)mb, a->sc->s), "cub scan");
	k_bitmask_check<<<1, 1, 0, a->sc->s>>>(a->pl, mb, a->info->count, a->info->changed, rank, pop, a->err);
	k_bitmask_apply<ES><<<grid_for(mb, 256), 256, 0, a->sc->s>>>(a->pl, mb, rank, a->dst, a->old_out, a->err);
out:
	return rc;
}

/* Header on the host (it is tiny), everything else on the device. */
template <unsigned ES> static int apply_compact(apply_ctx *a)
{
	int rc = DCAST_OK;
	uint8_t hdr[32] = { 0 };
	uint16_t lut[DCAST_CPT_LUT_SIZE];
	dcast_cpt_dec d;
	dcast_cpt_table t;
	uint64_t n = a->info->changed, nb = dcast_cpt_nblocks(n), hbytes = a->info->payload_bytes;
	uint32_t *pos = NULL, *val = NULL;
	uint16_t *lut_dev = NULL;
	block_end *ends = NULL;
	if (n > hbytes * 4) /* first, as on the CPU */
		return dcast_fail(DCAST_ECORRUPT, "compact payload: %llu bytes cannot hold %llu changes",
				  (unsigned long long)hbytes, (unsigned long long)n);
	CU(cudaMemcpy(hdr, a->pl, hbytes < sizeof(hdr) ? hbytes : sizeof(hdr), cudaMemcpyDefault), "copy header");
	if (const char *bad = dcast_cpt_hdr_parse(hdr, hbytes, 8 * ES, &d, &t))
		return dcast_fail(DCAST_ECORRUPT, "compact payload: %s", bad);
	{
		uint64_t off = dcast_cpt_hdr_bytes(d.mode, d.w) + dcast_cpt_index_bytes(n);
		if (off > hbytes)
			return dcast_fail(DCAST_EPAYLOAD_SIZE, "compact payload: %llu bytes, header and block index need %llu",
					  (unsigned long long)hbytes, (unsigned long long)off);
		d.stream = a->pl + off;
		d.stream_bytes = hbytes - off;
		d.count = a->info->count;
		d.lut = NULL;
		if (!n)
			return d.stream_bytes ? dcast_fail(DCAST_ECORRUPT, "compact payload, element 0: %s",
							   dcast_cpt_errstr(DCAST_CPT_ETRAIL))
					      : DCAST_OK;
	}
	if (d.mode == DCAST_CPT_CODED)
		dcast_cpt_lut_fill(&t, dcast_cpt_nsym(d.w), lut, 0, 1);
	CU(scratch_get(a->sc, (void **)&lut_dev, sizeof(lut)), "cudaMallocAsync(lut)");
	CU(scratch_get(a->sc, (void **)&pos, n * 4), "cudaMallocAsync(pos)");
	CU(scratch_get(a->sc, (void **)&val, n * 4), "cudaMallocAsync(val)");
	CU(scratch_get(a->sc, (void **)&ends, nb * sizeof(block_end)), "cudaMallocAsync(ends)");
	CU(cudaMemcpyAsync(lut_dev, lut, sizeof(lut), cudaMemcpyHostToDevice, a->sc->s), "copy lut");
	k_cpt_decode<<<grid_for(nb, 64), 64, 0, a->sc->s>>>(d, lut_dev, a->pl + dcast_cpt_hdr_bytes(d.mode, d.w), n,
							  pos, val, ends);
	k_cpt_chain<<<1, 1, 0, a->sc->s>>>(d, a->pl + dcast_cpt_hdr_bytes(d.mode, d.w), n, ends, a->err);
	k_cpt_apply<ES><<<grid_for(n, 256), 256, 0, a->sc->s>>>(pos, val, n, d.mode, a->dst, a->old_out, a->err);
	CU(cudaStreamSynchronize(a->sc->s), "sync");
out:
	return rc;
}

/* A compact2 payload as a batch of one chunk (its header checked and
 * its payload placed on the host, as the consumer's device batch does),
 * decoded by the batch's kernels (a warp a block, batch.cu); the verdict
 * read back, then the values applied as compact's are. */
static int cpt2_batch(apply_ctx *a, dcast_batch_dec *x, void **dev, uint32_t **pos, uint32_t **val)
{
	int rc = DCAST_OK;
	dcast_batch_ddims dd;
	uint64_t at = 0, n = a->info->changed, bytes, err = DCAST_BATCH_NO_ERR;
	uint8_t *pl = (uint8_t *)malloc(a->info->payload_bytes + 1), *host = NULL;

	dcast_batch_ddims_for(a->info, 1, &dd);
	bytes = dcast_batch_dbytes(&dd);
	if (!pl || !(host = (uint8_t *)malloc(bytes))) {
		rc = dcast_fail(DCAST_ENOMEM, "compact2 payload: no host memory for its batch");
		goto out;
	}
	CU(cudaMemcpy(pl, a->pl, a->info->payload_bytes, cudaMemcpyDefault), "copy payload");
	dcast_batch_dmap(x, host, &dd);
	if ((rc = dcast_batch_dput(x, 0, a->info, pl, &at, 0)))
		goto out;
	dcast_batch_blk_up(x);
	CU(scratch_get(a->sc, dev, bytes), "cudaMallocAsync(batch)");
	CU(scratch_get(a->sc, (void **)pos, n * 4 + 4), "cudaMallocAsync(pos)");
	CU(scratch_get(a->sc, (void **)val, n * 4 + 4), "cudaMallocAsync(val)");
	CU(cudaMemcpyAsync(*dev, host, bytes, cudaMemcpyHostToDevice, a->sc->s), "copy batch");
	if ((rc = dcast_cuda_batch_decode(*dev, x, *pos, *val, a->sc->s)))
		goto out;
	CU(cudaMemcpyAsync(&err, &((dcast_batch_cpt *)*dev)->err, 8, cudaMemcpyDeviceToHost, a->sc->s), "copy verdict");
	CU(cudaStreamSynchronize(a->sc->s), "sync");
	x->cpt[0].err = err;
	rc = dcast_batch_cpt_report(&x->cpt[0]);
out:
	free(pl);
	free(host);
	return rc;
}

template <unsigned ES> static int apply_compact2(apply_ctx *a)
{
	int rc = DCAST_OK;
	dcast_batch_dec x;
	void *dev = NULL;
	uint32_t *pos = NULL, *val = NULL;
	uint64_t n = a->info->changed;
	if ((rc = cpt2_batch(a, &x, &dev, &pos, &val)) || !n)
		return rc;
	k_cpt_apply<ES><<<grid_for(n, 256), 256, 0, a->sc->s>>>(pos, val, n, x.cpt[0].mode, a->dst, a->old_out,
								 a->err);
	CU(cudaStreamSynchronize(a->sc->s), "sync");
out:
	return rc;
}

static int apply_dense(apply_ctx *a)
{
	int rc = dcast_codec_check_size(a->info, a->info->count * a->info->elem_size);
	uint64_t bytes = a->info->payload_bytes;
	if (rc || !bytes)
		return rc;
	if (a->old_out)
		CU(cudaMemcpyAsync(a->old_out, a->dst, bytes, cudaMemcpyDeviceToDevice, a->sc->s), "save old");
	CU(cudaMemcpyAsync(a->dst, a->pl, bytes, cudaMemcpyDefault, a->sc->s), "copy dense");
out:
	return rc;
}

template <unsigned ES> static int apply_es(apply_ctx *a)
{
	switch (a->info->encoding) {
	case DCAST_ENC_DENSE: return apply_dense(a);
	case DCAST_ENC_IDX32: return apply_idx32<ES>(a);
	case DCAST_ENC_BITMASK: return apply_bitmask<ES>(a);
	case DCAST_ENC_COMPACT2: return apply_compact2<ES>(a);
	default: return apply_compact<ES>(a);
	}
}

static int apply_report(const dcast_chunk_info *info, const apply_err *e)
{
	if (e->elem == NO_ERROR)
		return DCAST_OK;
	switch (info->encoding) {
	case DCAST_ENC_IDX32:
		return dcast_fail(DCAST_ECORRUPT, "idx32 payload: element %llu position out of range or not increasing",
				  e->elem);
	case DCAST_ENC_BITMASK:
		if (e->code == 1)
			return dcast_fail(DCAST_ECORRUPT, "bitmask payload: bits past count %llu are set", e->elem);
		return dcast_fail(DCAST_ECORRUPT, "bitmask payload: %llu bits set, changed says %llu", e->elem,
				  (unsigned long long)info->changed);
	default:
		return dcast_fail(DCAST_ECORRUPT, "compact payload, element %llu: %s", e->elem,
				  dcast_cpt_errstr((int)e->code));
	}
}

/* Can the kernels read p where it is: device or managed memory, or host
 * memory registered with the same address on the device? */
static int device_readable(const void *p)
{
	cudaPointerAttributes at;
	if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
		cudaGetLastError(); /* not a CUDA error to keep: plain host memory */
		return 0;
	}
	return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged ||
	       (at.type == cudaMemoryTypeHost && at.devicePointer == p);
}

/* A sparse payload the kernels cannot read in place (pageable host memory)
 * is copied to device scratch first; a dense one is one cudaMemcpy anyway. */
static int stage_payload(apply_ctx *a)
{
	int rc = DCAST_OK;
	void *d = NULL;
	if (a->info->encoding == DCAST_ENC_DENSE || !a->info->payload_bytes || device_readable(a->pl))
		return DCAST_OK;
	CU(scratch_get(a->sc, &d, a->info->payload_bytes), "cudaMallocAsync(payload)");
	CU(cudaMemcpyAsync(d, a->pl, a->info->payload_bytes, cudaMemcpyHostToDevice, a->sc->s), "copy payload");
	a->pl = (const uint8_t *)d;
out:
	return rc;
}

extern "C" int dcast_cuda_apply(const dcast_chunk_info *info, const void *payload, void *dst,
				void *old_out, void *stream)
{
	scratch sc = {};
	sc.s = (cudaStream_t)stream;
	apply_err *err = NULL, host_err = { NO_ERROR, 0 };
	apply_ctx a = { info, (const uint8_t *)payload, dst, old_out, NULL, &sc };
	int rc = dcast_codec_check_info(info, payload, dst);
	if (rc || (rc = check_aligned(dst, info->elem_size, "dcast_cuda_apply dst")))
		return rc;
	if (!dcast_cuda_available())
		return dcast_fail(DCAST_ENODEVICE, "dcast_cuda_apply: no CUDA device");
	CU(scratch_get(&sc, (void **)&err, sizeof(*err)), "cudaMallocAsync(err)");
	CU(cudaMemcpyAsync(err, &host_err, sizeof(host_err), cudaMemcpyHostToDevice, sc.s), "init err");
	a.err = err;
	if ((rc = stage_payload(&a)))
		goto out;
	switch (info->elem_size) {
	case 1: rc = apply_es<1>(&a); break;
	case 2: rc = apply_es<2>(&a); break;
	default: rc = apply_es<4>(&a); break;
	}
	if (rc)
		goto out;
	CU(cudaGetLastError(), "apply kernels");
	CU(cudaMemcpyAsync(&host_err, err, sizeof(host_err), cudaMemcpyDeviceToHost, sc.s), "copy err");
	CU(cudaStreamSynchronize(sc.s), "sync");
	rc = apply_report(info, &host_err);
out:
	scratch_put(&sc);
	cudaStreamSynchronize(sc.s);
	return rc;
}

/* ---- digest ---- */

/* One warp per 1 MiB block: thread t owns accumulator lane t%8 and every
 * fourth stripe (group t/8) of each 1 KiB XXH3 block; the group sums meet
 * by shuffles before each lane-wise scramble. */
__global__ void k_digest_blocks(const uint8_t *data, size_t len, uint64_t nblk, uint64_t *hashes)
{
	__shared__ uint8_t secret[DCAST_XXH_SECRET_SIZE];
	for (unsigned i = threadIdx.x; i < DCAST_XXH_SECRET_SIZE; i += blockDim.x)
		secret[i] = dcast_xxh3_secret()[i];
	__syncthreads();
	uint64_t blk = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
	unsigned t = threadIdx.x % 32, lane = t % 8, g = t / 8;
	if (blk >= nblk)
		return;
	const uint8_t *in = data + blk * DCAST_DIGEST_BLOCK;
	size_t n = len - blk * DCAST_DIGEST_BLOCK < DCAST_DIGEST_BLOCK ? len - blk * DCAST_DIGEST_BLOCK
									 : DCAST_DIGEST_BLOCK;
	if (n <= 240) {
		if (t == 0)
			hashes[blk] = dcast_xxh3_64(in, n);
		return;
	}
	uint64_t acc = dcast_xxh3_acc_init(lane), nb = dcast_xxh3_long_blocks(n);
	for (uint64_t b = 0; b < nb; b++) {
		uint64_t part = dcast_xxh3_block_lane(in + b * DCAST_XXH_BLOCK, g, DCAST_XXH_STRIPES_PER_BLOCK,
						      4, lane, secret);
		part += __shfl_xor_sync(0xffffffffu, part, 8);
		part += __shfl_xor_sync(0xffffffffu, part, 16);
		acc = dcast_xxh3_scramble_lane(acc + part, lane, secret);
	}
	uint64_t part = dcast_xxh3_block_lane(in + nb * DCAST_XXH_BLOCK, g, dcast_xxh3_long_tail_stripes(n),
					      4, lane, secret);
	part += __shfl_xor_sync(0xffffffffu, part, 8);
	part += __shfl_xor_sync(0xffffffffu, part, 16);
	acc += part + dcast_xxh3_last_stripe_lane(in, n, lane, secret);
	uint64_t all[8];
	for (unsigned l = 0; l < 8; l++)
		all[l] = __shfl_sync(0xffffffffu, acc, l);
	if (t == 0)
		hashes[blk] = dcast_xxh3_merge(all, n, secret);
}

extern "C" int dcast_cuda_digest(const void *data, size_t len, uint64_t *digest, void *stream)
{
	scratch sc = {};
	sc.s = (cudaStream_t)stream;
	int rc = DCAST_OK;
	uint64_t nblk = (len + DCAST_DIGEST_BLOCK - 1) / DCAST_DIGEST_BLOCK, *dev = NULL, *host = NULL;
	if (!dcast_cuda_available())
		return dcast_fail(DCAST_ENODEVICE, "dcast_cuda_digest: no CUDA device");
	host = (uint64_t *)malloc(nblk ? nblk * 8 : 8);
	if (!host)
		return dcast_fail(DCAST_ENOMEM, "dcast_cuda_digest: no memory for %llu block hashes",
				  (unsigned long long)nblk);
	if (nblk) {
		CU(scratch_get(&sc, (void **)&dev, nblk * 8), "cudaMallocAsync(hashes)");
		k_digest_blocks<<<grid_for(nblk * 32, 128), 128, 0, sc.s>>>((const uint8_t *)data, len, nblk, dev);
		CU(cudaGetLastError(), "k_digest_blocks");
		CU(cudaMemcpyAsync(host, dev, nblk * 8, cudaMemcpyDeviceToHost, sc.s), "copy hashes");
		CU(cudaStreamSynchronize(sc.s), "sync");
	}
	*digest = dcast_xxh3_64(host, nblk * 8); /* little-endian hosts: the array is the LE bytes */
out:
	scratch_put(&sc);
	cudaStreamSynchronize(sc.s);
	free(host);
	return rc;
}

/* ---- additive digest (dcast_ldigest's twin) ---- */

template <unsigned ES>
__device__ uint32_t load_bits(const uint8_t *p, uint64_t j)
{
	if (ES == 1)
		return p[j];
	if (ES == 2)
		return ((const uint16_t *)p)[j];
	return ((const uint32_t *)p)[j];
}

/* Grid-stride partial sums, a warp reduction, one atomicAdd per warp: the
 * sum mod 2^64 is the same in any order. */
template <unsigned ES>
__global__ void k_ldigest(const uint8_t *p, uint64_t count, uint32_t tensor, uint64_t start, unsigned long long *out)
{
	uint64_t acc = 0, seg = ~0ull, seed = 0;
	for (uint64_t j = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; j < count;
	     j += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t i = start + j;
		if (i >> 32 != seg) {
			seg = i >> 32;
			seed = dcast_ld_seed(tensor, seg);
		}
		acc += dcast_ld_term_seeded(seed, i, load_bits<ES>(p, j));
	}
	for (unsigned d = 16; d; d >>= 1)
		acc += __shfl_xor_sync(0xffffffffu, acc, d);
	if ((threadIdx.x & 31) == 0 && acc)
		atomicAdd(out, (unsigned long long)acc);
}

static void launch_ldigest(uint32_t tensor, uint64_t start, const void *data, uint64_t count, unsigned es,
			   unsigned long long *dev, cudaStream_t s)
{
	unsigned g = grid_for(count, 256) < 4096 ? grid_for(count, 256) : 4096;
	const uint8_t *p = (const uint8_t *)data;
	if (es == 1)
		k_ldigest<1><<<g, 256, 0, s>>>(p, count, tensor, start, dev);
	else if (es == 2)
		k_ldigest<2><<<g, 256, 0, s>>>(p, count, tensor, start, dev);
	else
		k_ldigest<4><<<g, 256, 0, s>>>(p, count, tensor, start, dev);
}

extern "C" int dcast_cuda_ldigest(uint32_t tensor, uint64_t start, const void *data, uint64_t count,
				  unsigned elem_size, uint64_t *digest, void *stream)
{
	scratch sc = {};
	sc.s = (cudaStream_t)stream;
	int rc = DCAST_OK;
	unsigned long long *dev = NULL, host = 0;
	if (elem_size != 1 && elem_size != 2 && elem_size != 4)
		return dcast_fail(DCAST_EINVAL, "dcast_cuda_ldigest: elem_size %u (1, 2 or 4)", elem_size);
	if ((count && !data) || start + count < start)
		return dcast_fail(DCAST_EINVAL, "dcast_cuda_ldigest: %s",
				  count && !data ? "data is NULL" : "start + count past 2^64");
	if (!dcast_cuda_available())
		return dcast_fail(DCAST_ENODEVICE, "dcast_cuda_ldigest: no CUDA device");
	if (count) {
		CU(scratch_get(&sc, (void **)&dev, sizeof(*dev)), "cudaMallocAsync(sum)");
		CU(cudaMemsetAsync(dev, 0, sizeof(*dev), sc.s), "cudaMemsetAsync(sum)");
		launch_ldigest(tensor, start, data, count, elem_size, dev, sc.s);
		CU(cudaGetLastError(), "k_ldigest");
		CU(cudaMemcpyAsync(&host, dev, sizeof(host), cudaMemcpyDeviceToHost, sc.s), "copy sum");
		CU(cudaStreamSynchronize(sc.s), "sync");
	}
	*digest = host;
out:
	scratch_put(&sc);
	cudaStreamSynchronize(sc.s);
	return rc;
}
