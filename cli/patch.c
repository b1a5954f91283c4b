/* Little-endian encoding of the patch file's fixed-size records. */
#include <string.h>

#include "patch.h"

static void put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const unsigned char *p)
{
	return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

void patch_header_put(unsigned char *p, const patch_header *h)
{
	memcpy(p, PATCH_MAGIC, 8);
	put32(p + 8, h->version);
	put32(p + 12, h->flags);
	put64(p + 16, h->tensor_count);
	put64(p + 24, h->chunk_count);
	put64(p + 32, h->new_header_bytes);
	put64(p + 40, h->new_data_bytes);
}

int patch_header_get(const unsigned char *p, patch_header *h)
{
	if (memcmp(p, PATCH_MAGIC, 8) != 0)
		return -1;
	h->version = get32(p + 8);
	h->flags = get32(p + 12);
	h->tensor_count = get64(p + 16);
	h->chunk_count = get64(p + 24);
	h->new_header_bytes = get64(p + 32);
	h->new_data_bytes = get64(p + 40);
	return 0;
}

void patch_tensor_put(unsigned char *p, const patch_tensor *t)
{
	put64(p, t->base_digest);
	put64(p + 8, t->new_digest);
	put32(p + 16, t->has_base);
	put32(p + 20, t->elem_size);
	put64(p + 24, t->count);
}

void patch_tensor_get(const unsigned char *p, patch_tensor *t)
{
	t->base_digest = get64(p);
	t->new_digest = get64(p + 8);
	t->has_base = get32(p + 16);
	t->elem_size = get32(p + 20);
	t->count = get64(p + 24);
}

void patch_chunk_put(unsigned char *p, const patch_chunk *c)
{
	put32(p, c->tensor_index);
	put32(p + 4, c->encoding);
	put64(p + 8, c->begin);
	put64(p + 16, c->count);
	put64(p + 24, c->changed);
	put64(p + 32, c->payload_bytes);
	put64(p + 40, c->checksum);
}

void patch_chunk_get(const unsigned char *p, patch_chunk *c)
{
	c->tensor_index = get32(p);
	c->encoding = get32(p + 4);
	c->begin = get64(p + 8);
	c->count = get64(p + 16);
	c->changed = get64(p + 24);
	c->payload_bytes = get64(p + 32);
	c->checksum = get64(p + 40);
}
