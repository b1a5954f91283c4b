/* A port of XXH3-64 (xxHash 0.8, seed 0, default secret) written once for
 * the host and the device, so that dcast_cuda_digest() can hash blocks on
 * the GPU and the CPU tests can check the very same code against libxxhash.
 *
 * The long-input loop is expressed per accumulator lane: XXH3 updates its 8
 * accumulators independently, a 1 KiB block at a time (16 stripes of 64 bytes,
 * additive within a block, then a lane-wise scramble).  A GPU warp sums the
 * stripes of a block in parallel and applies the scramble per lane; the host
 * version below walks the same helpers in order. */
#ifndef DCAST_XXH3_HD_H
#define DCAST_XXH3_HD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DCAST_HD static inline __host__ __device__
#define DCAST_HD_CONST __constant__ __device__
#else
#define DCAST_HD static inline
#define DCAST_HD_CONST
#endif

#define DCAST_XXH_P32_1 0x9E3779B1u
#define DCAST_XXH_P32_2 0x85EBCA77u
#define DCAST_XXH_P32_3 0xC2B2AE3Du
#define DCAST_XXH_P64_1 0x9E3779B185EBCA87ull
#define DCAST_XXH_P64_2 0xC2B2AE3D27D4EB4Full
#define DCAST_XXH_P64_3 0x165667B19E3779F9ull
#define DCAST_XXH_P64_4 0x85EBCA77C2B2AE63ull
#define DCAST_XXH_P64_5 0x27D4EB2F165667C5ull
#define DCAST_XXH_STRIPE 64u
#define DCAST_XXH_BLOCK 1024u        /* 16 stripes per scramble */
#define DCAST_XXH_STRIPES_PER_BLOCK 16u
#define DCAST_XXH_SECRET_SIZE 192u

/* The default secret, indexed through a function so that host code reads
 * the host copy and device code the __constant__ copy. */
#define DCAST_XXH3_SECRET_BYTES \
	0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, \
	0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, \
	0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, \
	0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, \
	0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, \
	0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, \
	0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, \
	0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, \
	0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, \
	0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, \
	0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, \
	0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,

static const uint8_t dcast_xxh3_secret_host[DCAST_XXH_SECRET_SIZE] = { DCAST_XXH3_SECRET_BYTES };
#ifdef __CUDACC__
static __constant__ uint8_t dcast_xxh3_secret_dev[DCAST_XXH_SECRET_SIZE] = { DCAST_XXH3_SECRET_BYTES };
#endif

DCAST_HD const uint8_t *dcast_xxh3_secret(void)
{
#ifdef __CUDA_ARCH__
	return dcast_xxh3_secret_dev;
#else
	return dcast_xxh3_secret_host;
#endif
}

DCAST_HD uint32_t dcast_rd32le(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

DCAST_HD uint64_t dcast_rd64le(const uint8_t *p)
{
	return (uint64_t)dcast_rd32le(p) | (uint64_t)dcast_rd32le(p + 4) << 32;
}

DCAST_HD uint64_t dcast_xxh_mul128_fold64(uint64_t a, uint64_t b)
{
#ifdef __CUDA_ARCH__
	return (a * b) ^ __umul64hi(a, b);
#else
	unsigned __int128 p = (unsigned __int128)a * b;
	return (uint64_t)p ^ (uint64_t)(p >> 64);
#endif
}

DCAST_HD uint64_t dcast_xxh64_avalanche(uint64_t h)
{
	h ^= h >> 33;
	h *= DCAST_XXH_P64_2;
	h ^= h >> 29;
	h *= DCAST_XXH_P64_3;
	return h ^ (h >> 32);
}

DCAST_HD uint64_t dcast_xxh3_avalanche(uint64_t h)
{
	h ^= h >> 37;
	h *= 0x165667919E3779F9ull;
	return h ^ (h >> 32);
}

DCAST_HD uint64_t dcast_xxh_rotl64(uint64_t x, unsigned r)
{
	return (x << r) | (x >> (64 - r));
}

DCAST_HD uint64_t dcast_xxh3_rrmxmx(uint64_t h, uint64_t len)
{
	h ^= dcast_xxh_rotl64(h, 49) ^ dcast_xxh_rotl64(h, 24);
	h *= 0x9FB21C651E98DF25ull;
	h ^= (h >> 35) + len;
	h *= 0x9FB21C651E98DF25ull;
	return h ^ (h >> 28);
}

DCAST_HD uint64_t dcast_xxh3_len_0to16(const uint8_t *in, size_t len, const uint8_t *s)
{
	if (len > 8) {
		uint64_t lo = dcast_rd64le(in) ^ (dcast_rd64le(s + 24) ^ dcast_rd64le(s + 32));
		uint64_t hi = dcast_rd64le(in + len - 8) ^ (dcast_rd64le(s + 40) ^ dcast_rd64le(s + 48));
		uint64_t swapped = 0;
		for (int i = 0; i < 8; i++)
			swapped |= ((lo >> (8 * i)) & 0xff) << (56 - 8 * i);
		return dcast_xxh3_avalanche(len + swapped + hi + dcast_xxh_mul128_fold64(lo, hi));
	}
	if (len >= 4) {
		uint64_t in64 = dcast_rd32le(in + len - 4) + ((uint64_t)dcast_rd32le(in) << 32);
		uint64_t keyed = in64 ^ (dcast_rd64le(s + 8) ^ dcast_rd64le(s + 16));
		return dcast_xxh3_rrmxmx(keyed, len);
	}
	if (len) {
		uint32_t comb = ((uint32_t)in[0] << 16) | ((uint32_t)in[len >> 1] << 24) |
				(uint32_t)in[len - 1] | ((uint32_t)len << 8);
		uint64_t flip = (uint64_t)(dcast_rd32le(s) ^ dcast_rd32le(s + 4));
		return dcast_xxh64_avalanche((uint64_t)comb ^ flip);
	}
	return dcast_xxh64_avalanche(dcast_rd64le(s + 56) ^ dcast_rd64le(s + 64));
}

DCAST_HD uint64_t dcast_xxh3_mix16(const uint8_t *in, const uint8_t *s)
{
	return dcast_xxh_mul128_fold64(dcast_rd64le(in) ^ dcast_rd64le(s),
				       dcast_rd64le(in + 8) ^ dcast_rd64le(s + 8));
}

DCAST_HD uint64_t dcast_xxh3_len_17to128(const uint8_t *in, size_t len, const uint8_t *s)
{
	uint64_t acc = len * DCAST_XXH_P64_1;
	if (len > 32) {
		if (len > 64) {
			if (len > 96) {
				acc += dcast_xxh3_mix16(in + 48, s + 96);
				acc += dcast_xxh3_mix16(in + len - 64, s + 112);
			}
			acc += dcast_xxh3_mix16(in + 32, s + 64);
			acc += dcast_xxh3_mix16(in + len - 48, s + 80);
		}
		acc += dcast_xxh3_mix16(in + 16, s + 32);
		acc += dcast_xxh3_mix16(in + len - 32, s + 48);
	}
	acc += dcast_xxh3_mix16(in, s);
	acc += dcast_xxh3_mix16(in + len - 16, s + 16);
	return dcast_xxh3_avalanche(acc);
}

DCAST_HD uint64_t dcast_xxh3_len_129to240(const uint8_t *in, size_t len, const uint8_t *s)
{
	uint64_t acc = len * DCAST_XXH_P64_1;
	int rounds = (int)len / 16;
	for (int i = 0; i < 8; i++)
		acc += dcast_xxh3_mix16(in + 16 * i, s + 16 * i);
	acc = dcast_xxh3_avalanche(acc);
	for (int i = 8; i < rounds; i++)
		acc += dcast_xxh3_mix16(in + 16 * i, s + 16 * (i - 8) + 3);
	acc += dcast_xxh3_mix16(in + len - 16, s + 136 - 17);
	return dcast_xxh3_avalanche(acc);
}

/* Initial value of accumulator lane `lane` (0..7). */
DCAST_HD uint64_t dcast_xxh3_acc_init(unsigned lane)
{
	switch (lane) {
	case 0: return DCAST_XXH_P32_3;
	case 1: return DCAST_XXH_P64_1;
	case 2: return DCAST_XXH_P64_2;
	case 3: return DCAST_XXH_P64_3;
	case 4: return DCAST_XXH_P64_4;
	case 5: return DCAST_XXH_P32_2;
	case 6: return DCAST_XXH_P64_5;
	default: return DCAST_XXH_P32_1;
	}
}

/* What one 64-byte stripe adds to accumulator `lane`, keyed by `key`:
 * the lane's own keyed product plus the neighbour lane's raw word. */
DCAST_HD uint64_t dcast_xxh3_stripe_lane(const uint8_t *stripe, const uint8_t *key, unsigned lane)
{
	uint64_t data_key = dcast_rd64le(stripe + 8 * lane) ^ dcast_rd64le(key + 8 * lane);
	uint64_t swapped = dcast_rd64le(stripe + 8 * (lane ^ 1));
	return swapped + (data_key & 0xffffffffull) * (data_key >> 32);
}

DCAST_HD uint64_t dcast_xxh3_scramble_lane(uint64_t acc, unsigned lane, const uint8_t *s)
{
	acc ^= acc >> 47;
	acc ^= dcast_rd64le(s + DCAST_XXH_SECRET_SIZE - DCAST_XXH_STRIPE + 8 * lane);
	return acc * DCAST_XXH_P32_1;
}

/* Sum of stripes [first, first+nstripes) of a 1 KiB block for one lane. */
DCAST_HD uint64_t dcast_xxh3_block_lane(const uint8_t *block, unsigned first, unsigned nstripes,
					 unsigned step, unsigned lane, const uint8_t *s)
{
	uint64_t sum = 0;
	for (unsigned i = first; i < nstripes; i += step)
		sum += dcast_xxh3_stripe_lane(block + DCAST_XXH_STRIPE * i, s + 8 * i, lane);
	return sum;
}

/* Layout of a long (> 240 bytes) input: full 1 KiB blocks, then the
 * stripes of the last partial block, then the final overlapping stripe. */
DCAST_HD size_t dcast_xxh3_long_blocks(size_t len)
{
	return (len - 1) / DCAST_XXH_BLOCK;
}

DCAST_HD unsigned dcast_xxh3_long_tail_stripes(size_t len)
{
	return (unsigned)(((len - 1) - DCAST_XXH_BLOCK * dcast_xxh3_long_blocks(len)) / DCAST_XXH_STRIPE);
}

/* Lane update for the final overlapping stripe. */
DCAST_HD uint64_t dcast_xxh3_last_stripe_lane(const uint8_t *in, size_t len, unsigned lane,
					       const uint8_t *s)
{
	return dcast_xxh3_stripe_lane(in + len - DCAST_XXH_STRIPE,
				      s + DCAST_XXH_SECRET_SIZE - DCAST_XXH_STRIPE - 7, lane);
}

DCAST_HD uint64_t dcast_xxh3_merge(const uint64_t acc[8], size_t len, const uint8_t *s)
{
	uint64_t r = (uint64_t)len * DCAST_XXH_P64_1;
	for (int i = 0; i < 4; i++)
		r += dcast_xxh_mul128_fold64(acc[2 * i] ^ dcast_rd64le(s + 11 + 16 * i),
					     acc[2 * i + 1] ^ dcast_rd64le(s + 11 + 16 * i + 8));
	return dcast_xxh3_avalanche(r);
}

/* Long input, walked lane by lane exactly as the GPU warp does it. */
DCAST_HD uint64_t dcast_xxh3_long(const uint8_t *in, size_t len, const uint8_t *s)
{
	uint64_t acc[8];
	size_t nblocks = dcast_xxh3_long_blocks(len);
	for (unsigned l = 0; l < 8; l++)
		acc[l] = dcast_xxh3_acc_init(l);
	for (size_t b = 0; b < nblocks; b++) {
		const uint8_t *blk = in + b * DCAST_XXH_BLOCK;
		for (unsigned l = 0; l < 8; l++) {
			acc[l] += dcast_xxh3_block_lane(blk, 0, DCAST_XXH_STRIPES_PER_BLOCK, 1, l, s);
			acc[l] = dcast_xxh3_scramble_lane(acc[l], l, s);
		}
	}
	unsigned tail = dcast_xxh3_long_tail_stripes(len);
	for (unsigned l = 0; l < 8; l++) {
		acc[l] += dcast_xxh3_block_lane(in + nblocks * DCAST_XXH_BLOCK, 0, tail, 1, l, s);
		acc[l] += dcast_xxh3_last_stripe_lane(in, len, l, s);
	}
	return dcast_xxh3_merge(acc, len, s);
}

/* XXH3_64bits(in, len) with seed 0, for inputs of any length. */
DCAST_HD uint64_t dcast_xxh3_64(const void *data, size_t len)
{
	const uint8_t *in = (const uint8_t *)data;
	const uint8_t *s = dcast_xxh3_secret();
	if (len <= 16)
		return dcast_xxh3_len_0to16(in, len, s);
	if (len <= 128)
		return dcast_xxh3_len_17to128(in, len, s);
	if (len <= 240)
		return dcast_xxh3_len_129to240(in, len, s);
	return dcast_xxh3_long(in, len, s);
}

#endif
