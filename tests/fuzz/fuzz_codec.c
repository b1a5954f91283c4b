/* libFuzzer target for every codec decoder: the first 6 bytes give the
 * chunk info (encoding, element size, count, changed), the rest is the
 * payload.  dcast_codec_apply runs on a patterned destination; on error the
 * destination must be untouched, on success dcast_codec_revert with the
 * saved old values must restore it exactly.  Seeds: tests/fuzz/seeds/
 * fuzz_codec (valid payloads of every encoding, same 6-byte prefix). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "deltacast/codec.h"

#define PREFIX 6

static void fill(uint8_t *p, size_t n, const uint8_t *seed, size_t seed_len)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 131 + (seed_len ? seed[i % seed_len] : 0));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const unsigned sizes[] = { 1, 2, 4 };
	if (size < PREFIX)
		return 0;
	dcast_chunk_info info = {
		.encoding = data[0] % 5, /* 4: an unknown encoding */
		.elem_size = sizes[data[1] % 3],
		.count = (uint64_t)(data[2] | data[3] << 8) % 5000,
		.changed = (uint64_t)(data[4] | data[5] << 8),
		.payload_bytes = size - PREFIX,
	};
	size_t bytes = info.count * info.elem_size;
	uint8_t *payload = malloc(info.payload_bytes + 1), *dst = malloc(bytes + 1),
		*want = malloc(bytes + 1), *old = malloc(bytes + 1);
	memcpy(payload, data + PREFIX, info.payload_bytes);
	fill(dst, bytes, data + PREFIX, info.payload_bytes < 16 ? info.payload_bytes : 16);
	memcpy(want, dst, bytes);
	int rc = dcast_codec_apply(&info, payload, dst, old);
	if (rc) {
		if (memcmp(dst, want, bytes))
			abort(); /* a rejected payload wrote to dst */
	} else {
		if (dcast_codec_revert(&info, payload, dst, old) || memcmp(dst, want, bytes))
			abort(); /* revert did not restore the base */
	}
	free(payload);
	free(dst);
	free(want);
	free(old);
	return 0;
}
