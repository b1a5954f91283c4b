/* Little-endian integers in byte buffers: the one home of the fixed-size
 * fields in files and records the project writes (the record log, the
 * safetensors header length, the patch format).  Byte by byte, so any
 * alignment and any host order work; compilers turn each into one load or
 * store on little-endian hosts. */
#ifndef DCAST_BYTES_H
#define DCAST_BYTES_H

#include <stdint.h>

static inline void dcast_put_le32(void *dst, uint32_t v)
{
	unsigned char *p = dst;

	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static inline void dcast_put_le64(void *dst, uint64_t v)
{
	unsigned char *p = dst;

	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint32_t dcast_get_le32(const void *src)
{
	const unsigned char *p = src;

	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t dcast_get_le64(const void *src)
{
	const unsigned char *p = src;

	return (uint64_t)dcast_get_le32(p) | (uint64_t)dcast_get_le32(p + 4) << 32;
}

#endif
