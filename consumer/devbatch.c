/* A version's sparse chunks of device tensors, decoded and checked ahead
 * and applied in one launch (kernels/dcast_batch.h).  The check ahead
 * (verify.c) decodes each such chunk on the host (the CPU decoder,
 * O(changed)) into a batch in the pool's undo region, copies the batch to
 * the device once, and one kernel reads the old values at its positions
 * from the live tensors, makes the new ones and moves each chunk's
 * digest: the COMMIT is checked before READY.  Apply (apply.c) is then one
 * scatter launch that keeps the old values in the device copy (the undo
 * buffer); a failed or interrupted apply is one more launch with the roles
 * swapped, bit-exact, with no disk read.  The batch runs on its tensors'
 * device (the calling thread's current device is set for each step and
 * set back); tensors of one version on several devices are not batched.
 * The work ahead runs on a stream of its own, beside the engine's
 * kernels; the pause runs on the legacy default stream, so it follows
 * the engine's work there.
 *
 * Test seam: with DELTACAST_DEVICE_TWIN=1 in the environment when the
 * process first asks, a consumer without device tensors takes this path
 * for its host tensors that have no bound slices, run by the batch's CPU
 * twin on the host copy, so that machines without a GPU run the same
 * plumbing. */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "consumer_impl.h"
#include "dcast_common.h"

/* ---- the device copy of each consumer's batch, found by its pool ---- */

typedef struct dev_copy {
	const cs_pool *pool;
	void *dev;
	uint64_t cap;
	int device;             /* where dev is */
	void *stream;           /* there, for the work ahead of apply */
	struct dev_copy *next;
} dev_copy;

static pthread_mutex_t copies_lock = PTHREAD_MUTEX_INITIALIZER;
static dev_copy *copies;

/* p's device copy, made on first use (NULL: out of memory). */
static dev_copy *copy_of(const cs_pool *p)
{
	dev_copy *d;

	pthread_mutex_lock(&copies_lock);
	for (d = copies; d && d->pool != p; d = d->next)
		;
	if (!d && (d = calloc(1, sizeof(*d)))) {
		d->pool = p;
		d->next = copies;
		copies = d;
	}
	pthread_mutex_unlock(&copies_lock);
	return d;
}

void cs_dbatch_release(const cs_pool *p)
{
	dev_copy **at, *d;

	pthread_mutex_lock(&copies_lock);
	for (at = &copies; *at && (*at)->pool != p; at = &(*at)->next)
		;
	d = *at;
	if (d)
		*at = d->next;
	pthread_mutex_unlock(&copies_lock);
	if (d) {
		dcast_cuda_batch_free(&d->dev, &d->cap);
		dcast_cuda_batch_stream_free(d->stream);
	}
	free(d);
}

/* ---- which chunks ---- */

static int twin_env;

static void twin_read(void)
{
	const char *e = getenv("DELTACAST_DEVICE_TWIN");

	twin_env = e && !strcmp(e, "1");
	if (twin_env)
		DCAST_LOG_W("consumer: DELTACAST_DEVICE_TWIN=1: host tensors take the device path (CPU twin)");
}

static int twin_armed(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, twin_read);
	return twin_env;
}

int cs_dbatch_tensor(const dcast_consumer *c, const cs_tensor *t)
{
	if (t->mem == DCAST_MEM_CUDA)
		return 1;
	return !c->device_tensors && !t->n_views && twin_armed();
}

int cs_dbatch_chunk(const dcast_consumer *c, const cs_chunk *k)
{
	return k->info.encoding != DCAST_ENC_DENSE && k->info.changed && k->resident && k->file_off != CS_IN_PLACE &&
	       cs_dbatch_tensor(c, &c->tensors[k->tensor]);
}

/* ---- the batch in the undo region: a header, then the batch's buffer ---- */

typedef struct cs_dbatch_hdr {
	dcast_batch_dims d;
	int32_t on_device;      /* its tensors are device memory (else the twin runs) */
	int32_t device;         /* theirs */
} cs_dbatch_hdr;

static void dims_of(const dcast_consumer *c, const cs_version *v, dcast_batch_dims *d, int *on_device)
{
	memset(d, 0, sizeof(*d));
	*on_device = 0;
	for (uint32_t i = 0; i < v->n_chunks; i++) {
		const cs_chunk *k = &v->chunks[i];
		if (!cs_dbatch_chunk(c, k))
			continue;
		d->n_seg++;
		d->n_tile += dcast_batch_tiles(k->info.changed);
		d->n += k->info.changed;
		d->val_bytes += dcast_batch_val_bytes(k->info.changed, k->info.elem_size);
		*on_device |= c->tensors[k->tensor].mem == DCAST_MEM_CUDA;
	}
}

uint64_t cs_dbatch_bytes(const dcast_consumer *c, const cs_version *v)
{
	dcast_batch_dims d;
	int on_device;

	dims_of(c, v, &d, &on_device);
	return d.n_seg ? sizeof(cs_dbatch_hdr) + dcast_batch_bytes(&d) : 0;
}

static void map_at(unsigned char *at, dcast_batch *b)
{
	const cs_dbatch_hdr *h = (const cs_dbatch_hdr *)at;

	dcast_batch_map(b, at + sizeof(*h), &h->d);
}

/* The one device v's batched device tensors are on, into *device. */
static int device_of(const dcast_consumer *c, const cs_version *v, int *device)
{
	uint32_t last = UINT32_MAX;
	int err = 0, d;

	*device = -1;
	for (uint32_t i = 0; !err && i < v->n_chunks; i++) {
		const cs_chunk *k = &v->chunks[i];
		const cs_tensor *t = &c->tensors[k->tensor];
		if (k->tensor == last || t->mem != DCAST_MEM_CUDA || !cs_dbatch_chunk(c, k))
			continue;
		last = k->tensor;
		if ((err = dcast_cuda_batch_device_of(t->ptr, &d)))
			break;
		if (*device >= 0 && d != *device)
			err = dcast_fail(DCAST_EINVAL, "version %" PRIu64 ": tensors on devices %d and %d: one "
					 "batch each is not done", v->version, *device, d);
		*device = d;
	}
	return err;
}

int cs_dbatch_layout(const dcast_consumer *c, const cs_version *v, unsigned char *at, dcast_batch *b)
{
	cs_dbatch_hdr *h = (cs_dbatch_hdr *)at;
	uint64_t s = 0, first = 0, val = 0;
	int on_device, device, err;

	DCAST_ASSERT(((uintptr_t)at & 7) == 0);
	if ((err = device_of(c, v, &device)))
		return err;
	dims_of(c, v, &h->d, &on_device);
	h->on_device = on_device;
	h->device = device;
	map_at(at, b);
	for (uint32_t i = 0; i < v->n_chunks; i++) {
		const cs_chunk *k = &v->chunks[i];
		if (!cs_dbatch_chunk(c, k))
			continue;
		b->seg[s++] = (dcast_batch_seg){ .dst = (uintptr_t)cs_chunk_dst(c, k), .start = k->start,
						 .first = first, .val_off = val, .count = (uint32_t)k->info.changed,
						 .tensor = k->tensor, .elem_size = k->info.elem_size };
		first += k->info.changed;
		val += dcast_batch_val_bytes(k->info.changed, k->info.elem_size);
	}
	dcast_batch_tile_up(b);
	return 0;
}

int cs_dbatch_decode(dcast_batch *b, uint64_t seg, const cs_chunk *k, const unsigned char *p)
{
	dcast_batch_seg *s = &b->seg[seg];
	unsigned mode;
	int err = dcast_batch_decode(&k->info, p, b->pos + s->first, b->code + s->first, &mode);

	s->mode = mode;
	return err;
}

/* ---- on the device, or by the twin ---- */

/* The device copy of a batch, on `device` and big enough for it, and its
 * stream (NULL: no memory; the current device is `device`). */
static dev_copy *device_copy(dcast_consumer *c, uint64_t bytes, int device)
{
	dev_copy *d = copy_of(&c->pool);

	if (d && d->dev && d->device != device) {
		dcast_cuda_batch_free(&d->dev, &d->cap);
		dcast_cuda_batch_stream_free(d->stream);
		d->stream = NULL;
	}
	if (!d || dcast_cuda_batch_reserve(&d->dev, &d->cap, bytes) || (!d->stream && dcast_cuda_batch_stream(&d->stream)))
		return NULL;
	d->device = device;
	return d;
}

/* The device part of cs_dbatch_resolve, on the batch's device and its
 * own stream (inference may be running). */
static int resolve_device(dcast_consumer *c, dcast_batch *b, int values, int device)
{
	uint64_t bytes = dcast_batch_bytes(&b->d);
	dev_copy *d = device_copy(c, bytes, device);
	unsigned char *dev;
	int err;

	if (!d)
		return dcast_fail(DCAST_ENOMEM, "consumer %s: device memory for %" PRIu64 " bytes of changes: %s",
				  c->model, bytes, dcast_last_error());
	dev = d->dev;
	if ((err = dcast_cuda_batch_copy(dev, b->base, bytes, 0, d->stream)) ||
	    (err = dcast_cuda_batch_resolve(dev, b, d->stream)))
		return err;
	if (values && (err = dcast_cuda_batch_copy(b->old_vals, dev + (b->old_vals - b->base),
						   (uint64_t)(b->base + bytes - b->old_vals), 0, d->stream)))
		return err;
	return dcast_cuda_batch_copy(b->seg, dev, b->d.n_seg * sizeof(*b->seg), 1, d->stream);
}

int cs_dbatch_resolve(dcast_consumer *c, unsigned char *at, int values)
{
	const cs_dbatch_hdr *h = (const cs_dbatch_hdr *)at;
	dcast_batch b;
	int err, prev;

	map_at(at, &b);
	for (uint64_t s = 0; s < b.d.n_seg; s++)
		b.seg[s].move = 0;
	if (!h->on_device) {
		dcast_batch_resolve_cpu(&b);
		return 0;
	}
	if ((err = dcast_cuda_batch_enter(h->device, &prev)))
		return err;
	err = resolve_device(c, &b, values, h->device);
	dcast_cuda_batch_leave(prev);
	return err;
}

void cs_dbatch_map(unsigned char *at, dcast_batch *b)
{
	map_at(at, b);
}

int cs_dbatch_scatter(dcast_consumer *c, unsigned char *at, int undo, uint64_t seg_hi)
{
	const cs_dbatch_hdr *h = (const cs_dbatch_hdr *)at;
	dev_copy *d;
	dcast_batch b;
	int err, prev;

	map_at(at, &b);
	if (!h->on_device) {
		dcast_batch_scatter_cpu(&b, undo, 0, seg_hi);
		return 0;
	}
	d = copy_of(&c->pool);
	DCAST_ASSERT(d && d->dev && d->device == h->device); /* the check ahead made it */
	if ((err = dcast_cuda_batch_enter(h->device, &prev)))
		return err;
	if (!(err = dcast_cuda_batch_scatter(d->dev, &b, undo, 0, seg_hi, NULL)))
		err = dcast_cuda_batch_sync(NULL);
	dcast_cuda_batch_leave(prev);
	return err;
}
