/* The sum a MANIFEST carries: XXH3-64 of a canonical form of its content
 * (docs/protocol.md, MANIFEST).  A header frame has no payload checksum;
 * this one makes a MANIFEST damaged on the way, a tensor name included,
 * fail its check as a damaged chunk does. */
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <string.h>
#include <xxhash.h>
#include "schema_impl.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the canonical form is little-endian");

/* One tensor's canonical bytes at most: name and dtype name with their
 * lengths, dims, a u64 and a u32 per dimension. */
#define TENSOR_FORM_MAX (4 + DCAST_MAX_NAME + 4 + 16 + 4 + 12 * DCAST_MAX_DIMS)

static size_t put_u32(uint8_t *p, uint32_t v)
{
	memcpy(p, &v, sizeof(v));
	return sizeof(v);
}

static size_t put_u64(uint8_t *p, uint64_t v)
{
	memcpy(p, &v, sizeof(v));
	return sizeof(v);
}

static size_t put_str(uint8_t *p, const char *s, size_t max)
{
	size_t n = strnlen(s, max);

	put_u32(p, (uint32_t)n);
	memcpy(p + 4, s, n);
	return 4 + n;
}

static size_t tensor_form(uint8_t *p, const dcast_tensor_desc *t)
{
	uint32_t ndim = t->ndim < DCAST_MAX_DIMS ? t->ndim : DCAST_MAX_DIMS;
	size_t n = put_str(p, t->name, DCAST_MAX_NAME);

	n += put_str(p + n, dcast_dtype_name((int)t->dtype), 16);
	n += put_u32(p + n, ndim);
	for (uint32_t i = 0; i < ndim; i++)
		n += put_u64(p + n, t->shape[i]);
	for (uint32_t i = 0; i < ndim; i++)
		n += put_u32(p + n, t->grid[i] ? t->grid[i] : 1);
	return n;
}

uint64_t dcast_manifest_sum(const dcast_manifest *m)
{
	uint8_t form[TENSOR_FORM_MAX];
	XXH3_state_t st;
	size_t n;

	XXH3_64bits_reset(&st);
	n = put_str(form, m->model, DCAST_MAX_NAME);
	n += put_u32(form + n, m->n_tensors);
	XXH3_64bits_update(&st, form, n);
	for (uint32_t i = 0; i < m->n_tensors && m->tensors; i++)
		XXH3_64bits_update(&st, form, tensor_form(form, &m->tensors[i]));
	return XXH3_64bits_digest(&st);
}
