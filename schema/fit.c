/* A message's tensor references against the manifest of its model
 * (dcast_fit.h): the tensor index, then the element range, then for a
 * CHUNK the element size; and a CHUNK's checksum (deltacast/schema.h), so
 * that "is this chunk sound and does it fit" is one call,
 * dcast_chunk_sound. */
#include <inttypes.h>
#include "deltacast/codec.h"
#include "dcast_common.h"
#include "dcast_fit.h"

dcast_desc_array dcast_manifest_descs(const dcast_manifest *m)
{
	return (dcast_desc_array){m->tensors, sizeof(*m->tensors), m->n_tensors};
}

/* Descriptor `tensor` of d, or NULL when d has no such entry. */
static const dcast_tensor_desc *desc_at(dcast_desc_array d, uint32_t tensor)
{
	DCAST_ASSERT(d.stride >= sizeof(dcast_tensor_desc) && (d.first || !d.n));
	if (tensor >= d.n)
		return NULL;
	return (const dcast_tensor_desc *)((const char *)d.first + (size_t)tensor * d.stride);
}

/* The name of the message part under check: "CHUNK", "COMMIT.digests[3]"
 * (index < 0: none).  Formatted only for an error. */
static const char *part_name(char *buf, size_t cap, const char *what, int64_t index)
{
	if (index < 0)
		return what;
	snprintf(buf, cap, "%s[%" PRId64 "]", what, index);
	return buf;
}

/* Is `tensor` (of the message part what[index]) one of d's, and
 * [start, start + count) inside its elements?  *t: its descriptor. */
static int range_fits(const char *what, int64_t index, uint32_t tensor, uint64_t start,
		      uint64_t count, dcast_desc_array d, const dcast_tensor_desc **t)
{
	char buf[48];
	uint64_t elems;

	if (!(*t = desc_at(d, tensor)))
		return dcast_fail(DCAST_EFIELD_RANGE, "%s.tensor: %u outside the manifest's %u tensors",
				  part_name(buf, sizeof(buf), what, index), tensor, d.n);
	elems = dcast_tensor_elems(*t);
	if (start > elems || count > elems - start)
		return dcast_fail(DCAST_ESHAPE, "%s: range [%" PRIu64 ", +%" PRIu64 ") outside tensor %s "
				  "of %" PRIu64 " elements", part_name(buf, sizeof(buf), what, index),
				  start, count, (*t)->name, elems);
	return 0;
}

int dcast_chunk_fits(const dcast_chunk *c, dcast_desc_array d)
{
	const dcast_tensor_desc *t;
	int rc = range_fits("CHUNK", -1, c->tensor, c->start, c->count, d, &t);

	if (rc || c->elem_size == dcast_dtype_size((int)t->dtype))
		return rc;
	return dcast_fail(DCAST_ESHAPE, "CHUNK.elem_size: %u, tensor %s is %s of %u-byte elements",
			  c->elem_size, t->name, dcast_dtype_name((int)t->dtype),
			  dcast_dtype_size((int)t->dtype));
}

int dcast_chunk_dense_at(const dcast_chunk *c, dcast_desc_array d, uint64_t *byte_off)
{
	if (c->encoding != DCAST_ENC_DENSE || dcast_chunk_fits(c, d) || c->payload_bytes != c->count * c->elem_size)
		return 0;
	*byte_off = c->start * c->elem_size;
	return 1;
}

int dcast_digest_fits(const dcast_range_digest *e, uint32_t i, dcast_desc_array d)
{
	const dcast_tensor_desc *t;

	return range_fits("COMMIT.digests", i, e->tensor, e->start, e->count, d, &t);
}

static const dcast_range_digest *cover_at(const dcast_digest_cover *cv, uint64_t i)
{
	return (const dcast_range_digest *)((const char *)cv->first + (size_t)i * cv->stride);
}

/* e ends before element `start` of `tensor`, or is another tensor's before it. */
static int range_before(const dcast_range_digest *e, uint32_t tensor, uint64_t start)
{
	return e->tensor < tensor || (e->tensor == tensor && e->start + e->count <= start);
}

int dcast_digests_hold(dcast_digest_cover *cv, dcast_desc_array d, uint32_t tensor, uint64_t start,
		       uint64_t count)
{
	const dcast_tensor_desc *t = desc_at(d, tensor);
	uint64_t pos = start, end = start + count;

	DCAST_ASSERT(cv->stride >= sizeof(dcast_range_digest) && (cv->first || !cv->n));
	while (cv->at < cv->n && range_before(cover_at(cv, cv->at), tensor, start))
		cv->at++;
	for (uint64_t i = cv->at; pos < end && i < cv->n; i++) {
		const dcast_range_digest *e = cover_at(cv, i);
		if (e->tensor != tensor || e->start > pos)
			break; /* sorted by start: none after it holds pos */
		if (e->start + e->count > pos)
			pos = e->start + e->count;
	}
	if (pos >= end)
		return 0;
	return dcast_fail(DCAST_ECORRUPT, "COMMIT.digests: no range holds element %" PRIu64 " of tensor %s, "
			  "which a chunk writes ([%" PRIu64 ", +%" PRIu64 ")): it could not be checked",
			  pos, t ? t->name : "?", start, count);
}

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the checksum hashes little-endian u64s");

uint64_t dcast_chunk_checksum(const dcast_chunk *c, uint64_t payload_sum)
{
	const uint64_t v[11] = { payload_sum, c->version, c->base_version, c->anchor, c->tensor, c->start,
				 c->count, c->elem_size, c->encoding, c->changed, c->payload_bytes };

	return dcast_checksum(v, sizeof(v));
}

void dcast_chunk_seal(dcast_chunk *c, const void *payload)
{
	c->checksum = dcast_chunk_checksum(c, dcast_checksum(payload, c->payload_bytes));
}

int dcast_chunk_verify(const dcast_chunk *c, const void *payload)
{
	return dcast_chunk_verify_sum(c, dcast_checksum(payload, c->payload_bytes));
}

int dcast_chunk_verify_sum(const dcast_chunk *c, uint64_t payload_sum)
{
	uint64_t sum = dcast_chunk_checksum(c, payload_sum);

	if (sum == c->checksum)
		return 0;
	return dcast_fail(DCAST_ECHECKSUM,
			  "CHUNK %s v%llu tensor %u start %llu: checksum %016llx, header says %016llx",
			  c->model, (unsigned long long)c->version, c->tensor,
			  (unsigned long long)c->start, (unsigned long long)sum,
			  (unsigned long long)c->checksum);
}

int dcast_chunk_sound(const dcast_chunk *c, dcast_desc_array d, uint64_t payload_sum)
{
	int rc = dcast_chunk_fits(c, d);

	return rc ? rc : dcast_chunk_verify_sum(c, payload_sum);
}
