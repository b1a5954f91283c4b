/* Digest and the XXH3 port: dcast_digest() equals its definition in
 * docs/protocol.md computed here with libxxhash; the host+device XXH3-64 port
 * (kernels/xxh3_hd.h) equals libxxhash on every length 0..3000 and on block
 * sizes, both walked in order and split four ways as the GPU warp does. */
#include <xxhash.h>
#include "check.h"
#include "codec_impl.h"
#include "dcast_common.h"

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

int main(void)
{
	uint8_t *p = random_bytes(4 * MIB + 4096);
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
	for (size_t n = 0; n <= 3000; n += 7) /* short, mid and long (AVX2) paths */
		CHECK(dcast_checksum(p + 5, n) == XXH3_64bits(p + 5, n));
	CHECK(dcast_checksum(p, 2 * MIB + 3) == XXH3_64bits(p, 2 * MIB + 3));
	free(p);
	return check_done("test_digest");
}
