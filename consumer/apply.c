/* Applying one whole version to the live tensors, transactionally: every
 * chunk is checked against the manifest, its payload against its checksum,
 * then written with its old values saved in the pool's undo region; then
 * the COMMIT digests are checked.  Any failure undoes the chunks written so
 * far in reverse order, or, when the old values did not fit in the undo
 * region (anchors, huge deltas), restores the previous version from the
 * local checkpoint. */
#include <inttypes.h>
#include <string.h>
#include "consumer_impl.h"
#include "dcast_common.h"

int cs_check_chunk(const dcast_consumer *c, const dcast_chunk *h)
{
	const cs_tensor *t;
	uint64_t elems;

	if (h->tensor >= c->n_tensors)
		return dcast_fail(DCAST_EFIELD_RANGE, "CHUNK.tensor: %u, manifest has %u tensors",
				  h->tensor, c->n_tensors);
	t = &c->tensors[h->tensor];
	elems = dcast_tensor_elems(&t->desc);
	if (h->elem_size != t->elem_size)
		return dcast_fail(DCAST_EFIELD_RANGE, "CHUNK.elem_size: %u, tensor %s has %s (%u bytes)",
				  h->elem_size, t->desc.name, dcast_dtype_name((int)t->desc.dtype), t->elem_size);
	if (h->count == 0 || h->start > elems || h->count > elems - h->start)
		return dcast_fail(DCAST_EFIELD_RANGE, "CHUNK range [%" PRIu64 ", +%" PRIu64 ") outside tensor %s "
				  "of %" PRIu64 " elements", h->start, h->count, t->desc.name, elems);
	if (h->encoding >= DCAST_ENC_COUNT || h->changed > h->count)
		return dcast_fail(DCAST_EFIELD_RANGE, "CHUNK.encoding %u / changed %" PRIu64 " invalid",
				  h->encoding, h->changed);
	if (h->anchor && (h->encoding != DCAST_ENC_DENSE || h->payload_bytes != h->count * h->elem_size))
		return dcast_fail(DCAST_EFIELD_RANGE, "CHUNK: anchor chunk of tensor %s is not dense",
				  t->desc.name);
	return 0;
}

/* An anchor must cover every element of every tensor exactly. */
static int check_anchor_cover(const dcast_consumer *c, const cs_version *v)
{
	uint64_t *cover = calloc(c->n_tensors ? c->n_tensors : 1, sizeof(*cover));
	int err = 0;

	if (!cover)
		return dcast_fail(DCAST_ENOMEM, "anchor coverage");
	for (uint32_t i = 0; i < v->n_chunks; i++)
		cover[v->chunks[i].tensor] += v->chunks[i].info.count;
	for (uint32_t t = 0; !err && t < c->n_tensors; t++)
		if (cover[t] != dcast_tensor_elems(&c->tensors[t].desc))
			err = dcast_fail(DCAST_ECORRUPT, "anchor %" PRIu64 ": tensor %s covered by %" PRIu64
					 " of %" PRIu64 " elements", v->version, c->tensors[t].desc.name,
					 cover[t], dcast_tensor_elems(&c->tensors[t].desc));
	free(cover);
	return err;
}

static uint64_t undo_bytes(const cs_chunk *k)
{
	uint64_t n = k->info.encoding == DCAST_ENC_DENSE ? k->info.count : k->info.changed;
	return n * k->info.elem_size;
}

static unsigned char *dst_of(dcast_consumer *c, const cs_chunk *k)
{
	return c->tensors[k->tensor].ptr + k->start * k->info.elem_size;
}

/* The checked payload of k: resident, or read back from the record file. */
static int payload_of(dcast_consumer *c, const cs_version *v, const cs_chunk *k,
		      const unsigned char **out)
{
	int err;

	if (k->resident) {
		*out = k->resident;
		return 0;
	}
	if ((err = cs_ckpt_read_payload(c, v, k, cs_pool_scratch(&c->pool))))
		return err;
	if (dcast_checksum(cs_pool_scratch(&c->pool), k->info.payload_bytes) != k->checksum)
		return dcast_fail(DCAST_ECHECKSUM, "version %" PRIu64 ": staged chunk of tensor %s at %" PRIu64
				  " fails its checksum on disk", v->version, c->tensors[k->tensor].desc.name, k->start);
	*out = cs_pool_scratch(&c->pool);
	return 0;
}

static int write_chunk(dcast_consumer *c, const cs_version *v, const cs_chunk *k, unsigned char *old)
{
	const unsigned char *p;
	int err = payload_of(c, v, k, &p);

	if (err)
		return err;
	if (old && k->info.encoding == DCAST_ENC_DENSE) {
		memcpy(old, dst_of(c, k), undo_bytes(k));
		old = NULL;
	}
	return cs_tensor_apply(&c->tensors[k->tensor], &k->info, p, k->start, old);
}

static void undo_chunks(dcast_consumer *c, const cs_version *v, uint32_t n, uint64_t undo_off)
{
	unsigned char *undo = cs_pool_undo(&c->pool);

	for (uint32_t i = n; i-- > 0;) {
		const cs_chunk *k = &v->chunks[i];
		const unsigned char *p;
		undo_off -= undo_bytes(k);
		if (k->info.encoding == DCAST_ENC_DENSE) {
			memcpy(dst_of(c, k), undo + undo_off, undo_bytes(k));
			continue;
		}
		if (payload_of(c, v, k, &p) || dcast_codec_revert(&k->info, p, dst_of(c, k), undo + undo_off))
			DCAST_LOG_E("consumer %s: undo of version %" PRIu64 " chunk %u failed: %s", c->model,
				    v->version, i, dcast_last_error());
	}
}

static int verify_digests(dcast_consumer *c, const cs_version *v)
{
	for (uint32_t i = 0; i < v->commit.n_digests; i++) {
		const dcast_range_digest *d = &v->commit.digests[i];
		const cs_tensor *t = d->tensor < c->n_tensors ? &c->tensors[d->tensor] : NULL;
		uint64_t elems = t ? dcast_tensor_elems(&t->desc) : 0;
		if (!t || d->start > elems || d->count > elems - d->start)
			return dcast_fail(DCAST_EFIELD_RANGE, "COMMIT.digests[%u]: range outside the manifest", i);
		uint64_t got = 0;
		int err = cs_tensor_digest(t, d->start * t->elem_size, d->count * t->elem_size, &got);
		if (err)
			return err;
		if (got != d->digest)
			return dcast_fail(DCAST_EDIGEST, "version %" PRIu64 ": tensor %s [%" PRIu64 ", +%" PRIu64
					  ") digest differs from the producer's", v->version, t->desc.name,
					  d->start, d->count);
	}
	return 0;
}

static int rollback(dcast_consumer *c, const cs_version *v, int in_memory, uint32_t n, uint64_t off, int err)
{
	char why[512];

	snprintf(why, sizeof(why), "%s", dcast_last_error());
	if (in_memory) {
		undo_chunks(c, v, n, off);
	} else if (!c->restoring) {
		DCAST_LOG_I("consumer %s: old values of version %" PRIu64 " not kept in memory; restoring "
			    "version %" PRIu64 " from the local checkpoint", c->model, v->version,
			    dcast_consumer_version(c));
		c->restoring = 1;
		int rerr = cs_ckpt_restore(c);
		c->restoring = 0;
		if (rerr)
			DCAST_LOG_E("consumer %s: restore from checkpoint failed: %s", c->model, dcast_last_error());
	}
	return dcast_fail(err, "%s (version %" PRIu64 " refused; tensors kept at the previous version)",
			  why, v->version);
}

int cs_apply_version(dcast_consumer *c, cs_version *v, int verify)
{
	uint64_t need = 0, off = 0;
	int in_memory, err = 0;
	uint32_t i;

	if (v->anchor && (err = check_anchor_cover(c, v)))
		return err;
	for (i = 0; i < v->n_chunks; i++)
		need += undo_bytes(&v->chunks[i]);
	in_memory = !v->anchor && need <= c->pool.region_bytes && !c->device_tensors;
	for (i = 0; !err && i < v->n_chunks; i++) {
		err = write_chunk(c, v, &v->chunks[i], in_memory ? cs_pool_undo(&c->pool) + off : NULL);
		if (!err)
			off += undo_bytes(&v->chunks[i]);
	}
	if (err)
		return rollback(c, v, in_memory, i - 1, off, err);
	if (c->fault_kind == CS_FAULT_DIGEST && c->fault_version == v->version && v->commit.n_digests) {
		c->fault_kind = CS_FAULT_NONE; /* test hook: the digest check fails after every write */
		v->commit.digests[0].digest ^= 1;
	}
	if (verify && (err = verify_digests(c, v)))
		return rollback(c, v, in_memory, v->n_chunks, off, err);
	return 0;
}
