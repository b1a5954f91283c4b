/* A version's sparse chunks of device tensors, decoded and checked ahead
 * and applied in one launch (kernels/dcast_batch.h).  The check ahead
 * (verify.c) lays each such chunk out in a batch in the pool's undo
 * region, copies the batch to the device once, decodes its payloads, and
 * one kernel reads the old values at its positions
 * from the live tensors, makes the new ones and moves each chunk's
 * digest: the COMMIT is checked before READY.  Apply (apply.c) is then one
 * scatter launch that keeps the old values in the device copy (the undo
 * buffer); a failed or interrupted apply is one more launch with the roles
 * swapped, bit-exact, with no disk read.  The batch runs on its tensors'
 * device (the calling thread's current device is set for each step and
 * set back); tensors of one version on several devices are not batched.
 * Compact payloads are decoded on the device (kernels/batch_decode.h:
 * every index block of the version in one launch); the host checks their
 * headers and decodes the other sparse encodings.
 * The work ahead runs on a stream of its own, beside the engine's
 * kernels; the pause runs on the legacy default stream, so it follows
 * the engine's work there, and is waited for; or, for
 * dcast_consumer_apply_async, on the caller's stream, not waited for: an
 * event of the device copy's own marks it, the next check ahead's stream
 * waits on it before it writes the copy, and every other step that
 * touches the copy or the device tensors (an undo, a bind, devmem.c's
 * copies and kernels, close) waits for it on the host first.
 *
 * Test seam: with DELTACAST_DEVICE_TWIN=1 in the environment when the
 * process first asks, a consumer without device tensors takes this path
 * for its host tensors that have no bound slices, run by the batch's CPU
 * twin on the host copy, so that machines without a GPU run the same
 * plumbing. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "batch_decode.h"
#include "consumer_impl.h"
#include "dcast_common.h"

/* ---- the device copy of each consumer's batch, found by its pool ---- */

typedef struct dev_copy {
	const cs_pool *pool;
	void *dev;
	uint64_t cap;
	int device;             /* where dev is */
	void *stream;           /* there, for the work ahead of apply */
	void *done;             /* there, recorded after a scatter nobody waited for */
	int pending;            /* that scatter may still run (done and pending under copies_lock) */
	struct dev_copy *next;
} dev_copy;

static pthread_mutex_t copies_lock = PTHREAD_MUTEX_INITIALIZER;
static dev_copy *copies;
/* How many copies have `pending` set: every device tensor operation asks
 * cs_dbatch_settle first, and with none pending (the usual case) it need
 * not take copies_lock.  Changed only with `pending`, by set_pending. */
static atomic_uint n_pending;

static void set_pending(dev_copy *d, int on)
{
	if (d->pending != on)
		on ? atomic_fetch_add(&n_pending, 1) : atomic_fetch_sub(&n_pending, 1);
	d->pending = on;
}

/* ---- a scatter the caller did not wait for (dcast_consumer_apply_async):
 * until it is done, the device copy (batch and undo buffer) and the
 * tensors it writes are waited for before anything else touches them ---- */

/* Return when d's scatter is done (copies_lock held, or d unreachable). */
static int settle_locked(dev_copy *d)
{
	if (!d->pending)
		return 0;
	DCAST_LOG_D("consumer: waiting for a pending device scatter");
	set_pending(d, 0);
	return dcast_cuda_batch_event_sync(d->done);
}

static int settle(dev_copy *d)
{
	int err;

	pthread_mutex_lock(&copies_lock);
	err = settle_locked(d);
	pthread_mutex_unlock(&copies_lock);
	return err;
}

int cs_dbatch_settle(void)
{
	int err = 0;

	if (!atomic_load(&n_pending))
		return 0; /* a mark this thread made is seen: the count is seq_cst */
	pthread_mutex_lock(&copies_lock);
	for (dev_copy *d = copies; d; d = d->next)
		err = settle_locked(d) ? DCAST_ECUDA : err;
	pthread_mutex_unlock(&copies_lock);
	return err;
}

/* Work enqueued on stream from now on starts after d's scatter. */
static int after_pending(dev_copy *d, void *stream)
{
	int err;

	pthread_mutex_lock(&copies_lock);
	if (d->pending)
		DCAST_LOG_D("consumer: device work queued behind a pending scatter");
	err = d->pending ? dcast_cuda_batch_wait(stream, d->done) : 0;
	pthread_mutex_unlock(&copies_lock);
	return err;
}

/* d's event recorded after the scatter just enqueued on stream. */
static int mark_pending(dev_copy *d, void *stream)
{
	int err;

	pthread_mutex_lock(&copies_lock);
	set_pending(d, !(err = dcast_cuda_batch_record(d->done, stream)));
	pthread_mutex_unlock(&copies_lock);
	return err;
}

/* d's device memory, stream and event given back (nothing pending). */
static void drop_device(dev_copy *d)
{
	DCAST_ASSERT(!d->pending);
	dcast_cuda_batch_free(&d->dev, &d->cap);
	dcast_cuda_batch_stream_free(d->stream);
	dcast_cuda_batch_event_free(d->done);
	d->stream = d->done = NULL;
}

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
	if (d && settle_locked(d)) /* off the list: no other thread reaches it */
		DCAST_LOG_E("consumer: a pending device scatter failed at close: %s", dcast_last_error());
	if (d)
		drop_device(d);
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

/* ---- the batch in the undo region: a header, the batch's buffer, then
 * the buffer of its compact payloads, which the device decodes ---- */

typedef struct cs_dbatch_hdr {
	dcast_batch_dims d;
	dcast_batch_ddims dd;   /* the compact payloads' */
	int32_t on_device;      /* its tensors are device memory (else the twin runs) */
	int32_t device;         /* theirs */
} cs_dbatch_hdr;

static void dims_of(const dcast_consumer *c, const cs_version *v, cs_dbatch_hdr *h)
{
	memset(h, 0, sizeof(*h));
	for (uint32_t i = 0; i < v->n_chunks; i++) {
		const cs_chunk *k = &v->chunks[i];
		if (!cs_dbatch_chunk(c, k))
			continue;
		h->d.n_seg++;
		h->d.n_tile += dcast_batch_tiles(k->info.changed);
		h->d.n += k->info.changed;
		h->d.val_bytes += dcast_batch_val_bytes(k->info.changed, k->info.elem_size);
		h->on_device |= c->tensors[k->tensor].mem == DCAST_MEM_CUDA;
		if (dcast_batch_is_cpt(k->info.encoding))
			dcast_batch_ddims_add(&h->dd, &k->info);
	}
}

uint64_t cs_dbatch_bytes(const dcast_consumer *c, const cs_version *v)
{
	cs_dbatch_hdr h;

	dims_of(c, v, &h);
	return h.d.n_seg ? sizeof(h) + dcast_batch_bytes(&h.d) + dcast_batch_dbytes(&h.dd) : 0;
}

static void map_at(unsigned char *at, dcast_batch *b)
{
	const cs_dbatch_hdr *h = (const cs_dbatch_hdr *)at;

	dcast_batch_map(b, at + sizeof(*h), &h->d);
}

static void map_dec(unsigned char *at, dcast_batch_dec *x)
{
	const cs_dbatch_hdr *h = (const cs_dbatch_hdr *)at;

	dcast_batch_dmap(x, at + sizeof(*h) + dcast_batch_bytes(&h->d), &h->dd);
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
	uint64_t s = 0, first = 0, val = 0, cpt = 0, pl = 0;
	int device, err;
	dcast_batch_dec x;

	DCAST_ASSERT(((uintptr_t)at & 7) == 0);
	if ((err = device_of(c, v, &device)))
		return err;
	dims_of(c, v, h);
	h->device = device;
	map_at(at, b);
	map_dec(at, &x);
	for (uint32_t i = 0; i < v->n_chunks; i++) {
		const cs_chunk *k = &v->chunks[i];
		if (!cs_dbatch_chunk(c, k))
			continue;
		b->seg[s++] = (dcast_batch_seg){ .dst = (uintptr_t)cs_chunk_dst(c, k), .start = k->start,
						 .first = first, .val_off = val, .count = (uint32_t)k->info.changed,
						 .tensor = k->tensor, .elem_size = k->info.elem_size,
						 .cpt = (uint32_t)cpt };
		if (dcast_batch_is_cpt(k->info.encoding)) { /* its payload's place, for cs_dbatch_decode */
			x.cpt[cpt++] = (dcast_batch_cpt){ .payload_off = pl, .first = first };
			pl += (k->info.payload_bytes + 7) & ~(uint64_t)7;
		}
		first += k->info.changed;
		val += dcast_batch_val_bytes(k->info.changed, k->info.elem_size);
	}
	dcast_batch_tile_up(b);
	return 0;
}

/* A compact chunk's payload put for the device's decode: its header
 * checked, its payload copied to its place. */
static int put_compact(unsigned char *at, dcast_batch_seg *s, const cs_chunk *k, const unsigned char *p)
{
	dcast_batch_dec x;
	uint64_t cpt, off;
	int err;

	map_dec(at, &x);
	cpt = s->cpt; /* set by the layout: the decode threads write x.cpt, so none searches it */
	DCAST_ASSERT(cpt < x.d.n_cpt);
	off = x.cpt[cpt].payload_off;
	if (!(err = dcast_batch_dput(&x, cpt, &k->info, p, &off, s->first)))
		s->mode = x.cpt[cpt].mode == DCAST_CPT_RAW ? DCAST_BATCH_RAW : DCAST_BATCH_ULP;
	return err;
}

int cs_dbatch_decode(unsigned char *at, uint64_t seg, const cs_chunk *k, const unsigned char *p)
{
	dcast_batch b;
	dcast_batch_seg *s;
	unsigned mode;
	int err;

	map_at(at, &b);
	s = &b.seg[seg];
	if (dcast_batch_is_cpt(k->info.encoding))
		return put_compact(at, s, k, p);
	err = dcast_batch_decode(&k->info, p, b.pos + s->first, b.code + s->first, &mode);
	s->mode = mode;
	return err;
}

/* The first compact chunk the decode refused: its error (the CPU
 * decoder's code and text), or 0. */
static int decode_verdict(const dcast_batch_dec *x)
{
	int err = 0;

	for (uint64_t i = 0; !err && i < x->d.n_cpt; i++)
		err = dcast_batch_cpt_report(&x->cpt[i]);
	return err;
}

/* ---- on the device, or by the twin ---- */

/* The device copy of a batch, on `device` and big enough for it, and its
 * stream (NULL: no memory, or a pending scatter failed; the current
 * device is `device`).  Memory a pending scatter may read is given back
 * only once it is done. */
static dev_copy *device_copy(dcast_consumer *c, uint64_t bytes, int device)
{
	dev_copy *d = copy_of(&c->pool);

	if (d && d->dev && (d->device != device || d->cap < bytes) && settle(d))
		return NULL;
	if (d && d->dev && d->device != device)
		drop_device(d);
	if (!d || dcast_cuda_batch_reserve(&d->dev, &d->cap, bytes) || (!d->stream && dcast_cuda_batch_stream(&d->stream)))
		return NULL;
	d->device = device;
	return d;
}

/* The device's decode of the compact payloads (their buffer after the
 * batch's in the device copy, decoded into the device's pos and code),
 * the chunks' verdicts brought back (*refuse: one refused). */
static int decode_device(unsigned char *dev, const dcast_batch *b, dcast_batch_dec *x, void *stream, int *refuse)
{
	unsigned char *ddev = dev + dcast_batch_bytes(&b->d);
	uint64_t bytes = dcast_batch_dbytes(&x->d);
	int err;

	if (!x->d.n_cpt)
		return 0;
	if ((err = dcast_cuda_batch_copy(ddev, x->base, bytes, 0, stream)) ||
	    (err = dcast_cuda_batch_decode(ddev, x, (uint32_t *)(dev + ((unsigned char *)b->pos - b->base)),
					   (uint32_t *)(dev + ((unsigned char *)b->code - b->base)), stream)) ||
	    (err = dcast_cuda_batch_copy(x->cpt, ddev, x->d.n_cpt * sizeof(*x->cpt), 1, stream)))
		return err;
	*refuse = (err = decode_verdict(x)) != 0;
	return err;
}

/* The device part of cs_dbatch_resolve, on the batch's device and its
 * own stream (inference may be running): one copy of the batch, the
 * compact payloads decoded, the old values gathered, new ones and moves
 * made, the segments (and with `values` the changes) brought back. */
static int resolve_device(dcast_consumer *c, dcast_batch *b, dcast_batch_dec *x, int values, int device,
			  int *refuse)
{
	uint64_t bytes = dcast_batch_bytes(&b->d);
	dev_copy *d = device_copy(c, bytes + dcast_batch_dbytes(&x->d), device);
	unsigned char *dev;
	int err;

	if (!d)
		return dcast_fail(DCAST_ENOMEM, "consumer %s: device memory for %" PRIu64 " bytes of changes: %s",
				  c->model, bytes, dcast_last_error());
	dev = d->dev;
	if ((err = after_pending(d, d->stream)) ||
	    (err = dcast_cuda_batch_copy(dev, b->base, dcast_batch_host_bytes(b, x->d.n_cpt), 0, d->stream)) ||
	    (err = decode_device(dev, b, x, d->stream, refuse)) || (err = dcast_cuda_batch_resolve(dev, b, d->stream)))
		return err;
	if (values && (err = dcast_cuda_batch_copy(b->pos, dev + ((unsigned char *)b->pos - b->base),
						   (uint64_t)(b->base + bytes - (unsigned char *)b->pos), 0, d->stream)))
		return err;
	return dcast_cuda_batch_copy(b->seg, dev, b->d.n_seg * sizeof(*b->seg), 1, d->stream);
}

/* The twin's: the compact payloads decoded (refused ones stop it), then
 * the resolve, on the host copy. */
static int resolve_twin(dcast_batch *b, dcast_batch_dec *x, int *refuse)
{
	int err;

	dcast_batch_decode_cpu(x, b->pos, b->code);
	if ((*refuse = (err = decode_verdict(x)) != 0))
		return err;
	dcast_batch_resolve_cpu(b);
	return 0;
}

int cs_dbatch_resolve(dcast_consumer *c, unsigned char *at, int values, int *refuse)
{
	const cs_dbatch_hdr *h = (const cs_dbatch_hdr *)at;
	dcast_batch_dec x;
	dcast_batch b;
	int err, prev;

	*refuse = 0;
	map_at(at, &b);
	map_dec(at, &x);
	dcast_batch_blk_up(&x);
	for (uint64_t s = 0; s < b.d.n_seg; s++)
		b.seg[s].move = 0;
	if (!h->on_device)
		return resolve_twin(&b, &x, refuse);
	if ((err = dcast_cuda_batch_enter(h->device, &prev)))
		return err;
	err = resolve_device(c, &b, &x, values, h->device, refuse);
	dcast_cuda_batch_leave(prev);
	return err;
}

void cs_dbatch_map(unsigned char *at, dcast_batch *b)
{
	map_at(at, b);
}

/* The scatter on the legacy default stream, after a pending one, waited
 * for. */
static int scatter_waited(dev_copy *d, const dcast_batch *b, int undo, uint64_t seg_hi)
{
	int err;

	if ((err = settle(d)) || (err = dcast_cuda_batch_scatter(d->dev, b, undo, 0, seg_hi, NULL)))
		return err;
	return dcast_cuda_batch_sync(NULL);
}

/* The apply's scatter on the caller's stream, after a pending one, not
 * waited for: d's event, then the caller's, recorded after it.  When d's
 * cannot be, the stream is waited for (an undo may follow on another). */
static int scatter_async(dev_copy *d, const dcast_batch *b, uint64_t seg_hi, cs_pause *pz)
{
	int err;

	if ((!d->done && (err = dcast_cuda_batch_event(&d->done))) || (err = after_pending(d, pz->stream)) ||
	    (err = dcast_cuda_batch_scatter(d->dev, b, 0, 0, seg_hi, pz->stream)))
		return err;
	if ((err = mark_pending(d, pz->stream))) {
		dcast_cuda_batch_sync(pz->stream);
		return err;
	}
	pz->launched = 1;
	return pz->event ? dcast_cuda_batch_record(pz->event, pz->stream) : 0;
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
	if (undo || !c->pause.async)
		err = scatter_waited(d, &b, undo, seg_hi);
	else
		err = scatter_async(d, &b, seg_hi, &c->pause);
	dcast_cuda_batch_leave(prev);
	return err;
}
