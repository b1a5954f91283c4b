/* Little-endian encoding of the patch file's fixed-size records. */
#include <string.h>

#include "patch.h"

static void put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

void patch_put_le64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint64_t patch_get_le64(const unsigned char *p)
{
	return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

void patch_header_put(unsigned char *p, const patch_header *h)
{
	memcpy(p, PATCH_MAGIC, 8);
	put32(p + 8, h->version);
	put32(p + 12, h->flags);
	patch_put_le64(p + 16, h->tensor_count);
	patch_put_le64(p + 24, h->chunk_count);
	patch_put_le64(p + 32, h->new_header_bytes);
	patch_put_le64(p + 40, h->new_data_bytes);
}

int patch_header_get(const unsigned char *p, patch_header *h)
{
	if (memcmp(p, PATCH_MAGIC, 8) != 0)
		return -1;
	h->version = get32(p + 8);
	h->flags = get32(p + 12);
	h->tensor_count = patch_get_le64(p + 16);
	h->chunk_count = patch_get_le64(p + 24);
	h->new_header_bytes = patch_get_le64(p + 32);
	h->new_data_bytes = patch_get_le64(p + 40);
	return 0;
}

void patch_tensor_put(unsigned char *p, const patch_tensor *t)
{
	patch_put_le64(p, t->base_digest);
	patch_put_le64(p + 8, t->new_digest);
	put32(p + 16, t->has_base);
	put32(p + 20, t->elem_size);
	patch_put_le64(p + 24, t->count);
}

void patch_tensor_get(const unsigned char *p, patch_tensor *t)
{
	t->base_digest = patch_get_le64(p);
	t->new_digest = patch_get_le64(p + 8);
	t->has_base = get32(p + 16);
	t->elem_size = get32(p + 20);
	t->count = patch_get_le64(p + 24);
}

void patch_chunk_put(unsigned char *p, const patch_chunk *c)
{
	put32(p, c->tensor_index);
	put32(p + 4, c->encoding);
	patch_put_le64(p + 8, c->begin);
	patch_put_le64(p + 16, c->count);
	patch_put_le64(p + 24, c->changed);
	patch_put_le64(p + 32, c->payload_bytes);
	patch_put_le64(p + 40, c->checksum);
}

void patch_chunk_get(const unsigned char *p, patch_chunk *c)
{
	c->tensor_index = get32(p);
	c->encoding = get32(p + 4);
	c->begin = patch_get_le64(p + 8);
	c->count = patch_get_le64(p + 16);
	c->changed = patch_get_le64(p + 24);
	c->payload_bytes = patch_get_le64(p + 32);
	c->checksum = patch_get_le64(p + 40);
}
