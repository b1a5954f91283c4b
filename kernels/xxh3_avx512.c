/* XXH3-64 inlined for AVX-512 (digest.c picks it where the CPU has
 * AVX-512F): about a quarter faster than AVX2 on bytes in cache, which is
 * where a bulk anchor's pieces are hashed (dcast_landing.h).  A file of its
 * own because a translation unit can inline xxhash.h only once, and
 * digest.c inlines it for AVX2 (xxh3_code.h). */
#include <stddef.h>
#include <stdint.h>
#include "xxh3_code.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h> /* xxhash.h includes it only when built with -mavx512f */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f")
#endif
#define XXH_STATIC_LINKING_ONLY
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX512
#include <xxhash.h>

XXH3_CODE(avx512)

const xxh3_code *dcast_xxh3_avx512_code(void)
{
	return &code_avx512;
}
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
