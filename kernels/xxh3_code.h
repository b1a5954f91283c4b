/* Private to digest.c and xxh3_avx512.c: one build of XXH3-64, its
 * one-shot hash and its streaming calls on a state laid out as
 * libxxhash's XXH3_state_t.  XXH3_CODE(sfx), expanded after xxhash.h,
 * defines code_##sfx with the XXH3 names in scope there: libxxhash's, or
 * a copy inlined for one instruction set (XXH_INLINE_ALL), built for
 * the target in force where it is expanded. */
#ifndef DCAST_XXH3_CODE_H
#define DCAST_XXH3_CODE_H

#include <stddef.h>
#include <stdint.h>

typedef struct xxh3_code {
	uint64_t (*hash)(const void *data, size_t len);
	void (*reset)(void *st); /* neither fails on a state that is there */
	void (*update)(void *st, const void *data, size_t len);
	uint64_t (*digest)(const void *st);
	size_t state_bytes;      /* sizeof(XXH3_state_t) as this build sees it */
} xxh3_code;

#define XXH3_CODE(sfx)                                                       \
	static uint64_t hash_##sfx(const void *data, size_t len)             \
	{                                                                    \
		return XXH3_64bits(data, len);                               \
	}                                                                    \
	static void reset_##sfx(void *st)                                    \
	{                                                                    \
		(void)XXH3_64bits_reset(st);                                 \
	}                                                                    \
	static void update_##sfx(void *st, const void *data, size_t len)     \
	{                                                                    \
		(void)XXH3_64bits_update(st, data, len);                     \
	}                                                                    \
	static uint64_t digest_##sfx(const void *st)                         \
	{                                                                    \
		return XXH3_64bits_digest(st);                               \
	}                                                                    \
	static const xxh3_code code_##sfx = {hash_##sfx, reset_##sfx, update_##sfx, digest_##sfx, \
					     sizeof(XXH3_state_t)};

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
/* The build inlined for AVX-512 (xxh3_avx512.c), a unit of its own: a
 * unit can inline xxhash.h only once.  Only for a CPU with AVX-512F; its
 * state 64-byte aligned. */
const xxh3_code *dcast_xxh3_avx512_code(void);
#endif

#endif
