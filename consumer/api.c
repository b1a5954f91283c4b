/* The consumer's calls on live tensors: bind, read, apply, wait, stats. */
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <time.h>
#include "consumer_impl.h"
#include "dcast_common.h"
#include "store/store.h"

static int bind_locked(dcast_consumer *c, const char *name, void *ptr, dcast_mem mem, uint64_t bytes)
{
	cs_tensor *t;

	if (!(t = cs_tensor_find(c, name)))
		return dcast_fail(DCAST_ENOTFOUND, "bind: no tensor \"%s\" in the manifest of %s", name, c->model);
	if (dcast_tensor_tiled(&t->desc)) /* a view in natural order; the host copy stays */
		return cs_bind_view(c, t, ptr, mem, 0, NULL, NULL, bytes);
	if (t->n_views)
		return dcast_fail(DCAST_ESTATE, "bind %s: slices of it are bound; bind the whole tensor "
				  "as a slice too", name);
	if (mem == DCAST_MEM_CUDA && !dcast_cuda_available())
		return dcast_fail(DCAST_ENODEVICE, "bind %s: CUDA memory but no CUDA device (or a build without "
				  "CUDA); the tensor stays in the consumer's host memory", name);
	if (mem != DCAST_MEM_HOST && mem != DCAST_MEM_CUDA)
		return dcast_fail(DCAST_EINVAL, "bind %s: unknown memory kind %d", name, (int)mem);
	if (bytes != t->bytes)
		return dcast_fail(DCAST_ESHAPE, "bind %s: %" PRIu64 " bytes given, the manifest says %" PRIu64,
				  name, bytes, t->bytes);
	if (!t->owned)
		return dcast_fail(DCAST_ESTATE, "bind %s: already bound", name);
	if (cs_drop_in_place(c)) /* written into the copy that moves now: fetched again */
		cs_rejoin(c);
	t->ptr = ptr;
	t->mem = mem;
	int err = cs_to_tensor(t, 0, t->host, t->bytes); /* the current version moves over */
	if (err) {
		t->ptr = t->host;
		t->mem = DCAST_MEM_HOST;
		return err;
	}
	cs_ckpt_settle_direct(c); /* an anchor's file may still be written from the host copy */
	cs_host_release(t->host, t->bytes);
	if (mem == DCAST_MEM_CUDA)
		cs_pool_cuda_register(&c->pool); /* DMA from the pool from now on */
	cs_dcache_clear(&c->dcache); /* the caller's memory from now on: hash it afresh */
	cs_ahead_forget(c);
	t->owned = 0;
	c->device_tensors += mem == DCAST_MEM_CUDA;
	return 0;
}

/* Does unbind(name) concern t (name NULL: every tensor)? */
static int unbind_hits(const cs_tensor *t, const char *name)
{
	return (!t->owned || t->n_views) && (!name || !strcmp(t->desc.name, name));
}

/* Step 1: the current bytes of every tensor bound whole back in our host
 * copy (the caller's memory holds the one copy; the cached digests
 * describe them, as they did while bound); on failure the copies made are
 * given back and no binding has changed. */
static int unbind_copy(dcast_consumer *c, const char *name)
{
	uint32_t i;
	int err = 0;

	for (i = 0; !err && i < c->n_tensors; i++) {
		cs_tensor *t = &c->tensors[i];
		if (unbind_hits(t, name) && !t->owned)
			err = cs_from_tensor(t, 0, t->host, t->bytes);
	}
	while (err && i--)
		if (unbind_hits(&c->tensors[i], name) && !c->tensors[i].owned)
			cs_host_release(c->tensors[i].host, c->tensors[i].bytes);
	return err;
}

/* Step 2, which cannot fail: the bindings dropped. */
static void unbind_switch(dcast_consumer *c, const char *name)
{
	uint32_t moved = 0;

	for (uint32_t i = 0; i < c->n_tensors; i++) {
		cs_tensor *t = &c->tensors[i];
		if (!unbind_hits(t, name))
			continue;
		c->device_tensors -= !t->owned && t->mem == DCAST_MEM_CUDA;
		t->ptr = t->host;
		t->mem = DCAST_MEM_HOST;
		t->owned = 1;
		cs_views_free(t); /* a sliced tensor's host copy stays, values and all */
		moved++;
	}
	if (!moved)
		return;
	cs_ahead_forget(c); /* resolved against the memory left */
	cs_check_next(c);   /* and again against the host copies, ahead of apply */
}

static int unbind_locked(dcast_consumer *c, const char *name)
{
	cs_tensor *t = name ? cs_tensor_find(c, name) : NULL;
	int err;

	if (name && !t)
		return dcast_fail(DCAST_ENOTFOUND, "unbind: no tensor \"%s\" in the manifest of %s", name,
				  c->model);
	if (t && !unbind_hits(t, name))
		return dcast_fail(DCAST_ESTATE, "unbind %s: not bound", name);
	cs_ckpt_settle_direct(c); /* the host copies change: an anchor's file is written from them */
	if ((err = unbind_copy(c, name)))
		return dcast_fail(err, "unbind: the current version not copied back from the bound "
				  "memory, nothing unbound: %s", dcast_last_error());
	unbind_switch(c, name);
	return 0;
}

int dcast_consumer_unbind(dcast_consumer *c, const char *name)
{
	int err;

	if (!c)
		return dcast_fail(DCAST_EINVAL, "dcast_consumer_unbind: NULL consumer");
	pthread_mutex_lock(&c->lock);
	err = unbind_locked(c, name);
	pthread_mutex_unlock(&c->lock);
	return err;
}

int dcast_consumer_bind(dcast_consumer *c, const char *name, void *ptr, dcast_mem mem, uint64_t bytes)
{
	int err;

	if (!c || !name || !ptr)
		return dcast_fail(DCAST_EINVAL, "dcast_consumer_bind: NULL argument");
	pthread_mutex_lock(&c->lock);
	err = bind_locked(c, name, ptr, mem, bytes);
	pthread_mutex_unlock(&c->lock);
	return err;
}

int dcast_consumer_tensor(dcast_consumer *c, const char *name, void **ptr, dcast_tensor_desc *desc,
			  dcast_mem *mem)
{
	cs_tensor *t;

	if (!c || !name)
		return dcast_fail(DCAST_ENOTFOUND, "no tensor \"%s\"", name ? name : "(null)");
	pthread_mutex_lock(&c->lock);
	t = cs_tensor_find(c, name);
	if (t && ptr)
		*ptr = t->ptr;
	if (t && desc)
		*desc = t->desc;
	if (t && mem)
		*mem = (dcast_mem)t->mem;
	pthread_mutex_unlock(&c->lock);
	if (!t)
		return dcast_fail(DCAST_ENOTFOUND, "no tensor \"%s\"", name);
	return 0;
}

uint32_t dcast_consumer_tensor_count(const dcast_consumer *c)
{
	dcast_consumer *w = (dcast_consumer *)c;
	uint32_t n;

	if (!c)
		return 0;
	pthread_mutex_lock(&w->lock);
	n = c->n_tensors;
	pthread_mutex_unlock(&w->lock);
	return n;
}

int dcast_consumer_tensor_at(const dcast_consumer *c, uint32_t i, dcast_tensor_desc *desc)
{
	dcast_consumer *w = (dcast_consumer *)c;
	int found;

	if (!c || !desc)
		return dcast_fail(DCAST_EINVAL, "dcast_consumer_tensor_at: NULL argument");
	pthread_mutex_lock(&w->lock);
	if ((found = i < c->n_tensors))
		*desc = c->tensors[i].desc;
	pthread_mutex_unlock(&w->lock);
	return found ? 0 : dcast_fail(DCAST_ENOTFOUND, "tensor index %u out of range", i);
}

/* Newest READY version apply() can take now (NONE when none); *n, when
 * not NULL: how many READY versions lead up to it (the first staged[*n]). */
static uint64_t ready_chain_locked(const dcast_consumer *c, uint64_t *n)
{
	uint64_t have = dcast_consumer_version(c), v = DCAST_VERSION_NONE, count = 0;

	for (uint32_t i = 0; c && i < c->n_staged && c->staged[i].state == CS_V_READY && !c->staged[i].held; i++) {
		const cs_version *s = &c->staged[i];
		if (!s->anchor && s->base_version != have)
			break;
		v = have = s->version;
		count++;
	}
	if (n)
		*n = count;
	return v;
}

uint32_t dcast_consumer_ready_versions(const dcast_consumer *c, uint64_t *out, uint32_t cap)
{
	dcast_consumer *w = (dcast_consumer *)c; /* the lock, not the state, changes */
	uint64_t n;

	if (!c)
		return 0;
	pthread_mutex_lock(&w->lock);
	ready_chain_locked(c, &n);
	for (uint32_t i = 0; out && i < n && i < cap; i++)
		out[i] = c->staged[i].version;
	pthread_mutex_unlock(&w->lock);
	return (uint32_t)n;
}

static uint64_t ready_locked(const dcast_consumer *c)
{
	return ready_chain_locked(c, NULL);
}

uint64_t dcast_consumer_ready_version(const dcast_consumer *c)
{
	dcast_consumer *w = (dcast_consumer *)c; /* the lock, not the state, changes */
	uint64_t v;

	if (!c)
		return DCAST_VERSION_NONE;
	pthread_mutex_lock(&w->lock);
	v = ready_locked(c);
	pthread_mutex_unlock(&w->lock);
	return v;
}

static void record_stats(dcast_consumer *c, const cs_version *v, uint64_t apply_ns)
{
	c->stats.version = v->version;
	c->stats.anchor = v->anchor;
	c->stats.chunks = v->n_chunks;
	c->stats.bytes = v->bytes;
	c->stats.stage_ns = v->ready_ns - v->first_ns;
	c->stats.apply_ns = apply_ns;
	c->stats.spilled_chunks = v->spilled;
	c->stats.verify_bytes = c->opts.verify_digests ? c->verify_bytes : 0;
}

/* Apply the first staged version; on success it leaves staged[]. */
static int apply_first(dcast_consumer *c)
{
	cs_version *v = &c->staged[0];
	uint64_t t0 = dcast_now_ns();
	int err;

	if (v->state != CS_V_READY)
		return dcast_fail(DCAST_ESTATE, "version %" PRIu64 " is not ready", v->version);
	if (!v->anchor && v->base_version != dcast_consumer_version(c))
		return dcast_fail(DCAST_EGAP, "version %" PRIu64 " builds on %" PRIu64 ", tensors hold %" PRIu64,
				  v->version, v->base_version, dcast_consumer_version(c));
	if ((err = cs_intake_apply(c, v, 1)))
		return err;
	record_stats(c, v, dcast_now_ns() - t0);
	cs_ack(c, v->version);
	c->ob.refusals = 0;
	if (cs_store_applied(c, v)) /* a delta to fold, or an anchor's seal due */
		c->ss.fold_due = 1;
	if (c->ss.fold_due || cs_fold_wanted(c)) {
		c->ss.fold_due = 1; /* on the consumer's thread, after this apply */
		cs_wake(c);
	}
	cs_version_drop(c, v, 0);
	return 0;
}

int cs_check_next(dcast_consumer *c)
{
	int err;

	if (c->n_staged && (err = cs_verify_ahead(c, &c->staged[0])))
		return cs_refuse(c, c->staged[0].version, err);
	return 0;
}

/* dcast_consumer_apply with `lock` held. */
static int apply_locked(dcast_consumer *c, uint64_t version)
{
	cs_version *v = cs_version_find(c, version);
	int err = 0;

	if (!v || v->state != CS_V_READY)
		return dcast_fail(DCAST_ESTATE, "apply: version %" PRIu64 " is not ready", version);
	if (v->anchor) /* an anchor supersedes everything staged before it */
		while (&c->staged[0] != v && c->staged[0].version < version)
			cs_version_drop(c, &c->staged[0], 1), v--;
	for (uint32_t guard = 0; !err && c->n_staged && c->staged[0].version <= version &&
	     guard < CS_MAX_STAGED; guard++)
		err = apply_first(c);
	if (err) {
		char why[512];
		snprintf(why, sizeof(why), "%s", dcast_last_error());
		DCAST_LOG_W("consumer %s: apply of version %" PRIu64 " refused: %s", c->model, version, why);
		cs_drop_from(c, c->n_staged ? c->staged[0].version : version);
		dcast_fail(err, "%s", why);
		cs_rejoin_refused(c, CS_REFUSED_VERSION, version, err); /* the broker sends it again */
	}
	return err;
}

/* Apply `version`, a device batch's scatter launched as `pause` says,
 * then check the next version ahead: here, or, behind a scatter not
 * waited for, on the session thread (its check waits for the scatter, so
 * this call does not). */
static int apply_call(dcast_consumer *c, uint64_t version, cs_pause pause)
{
	int err;

	pthread_mutex_lock(&c->lock);
	c->pause = pause;
	err = apply_locked(c, version);
	if (c->pause.launched)
		cs_wake(c);
	else
		cs_check_next(c);
	c->pause = (cs_pause){0};
	pthread_mutex_unlock(&c->lock);
	return err;
}

int dcast_consumer_apply(dcast_consumer *c, uint64_t version)
{
	if (!c)
		return dcast_fail(DCAST_EINVAL, "dcast_consumer_apply: NULL consumer");
	return apply_call(c, version, (cs_pause){0});
}

int dcast_consumer_apply_async(dcast_consumer *c, uint64_t version, void *stream, void *event)
{
	if (!c)
		return dcast_fail(DCAST_EINVAL, "dcast_consumer_apply_async: NULL consumer");
	return apply_call(c, version, (cs_pause){ .async = 1, .stream = stream, .event = event });
}

int cs_auto_apply(dcast_consumer *c)
{
	uint64_t v = c->opts.auto_apply ? ready_locked(c) : DCAST_VERSION_NONE;

	return v == DCAST_VERSION_NONE ? 0 : apply_locked(c, v);
}

/* The detail of a wait_version timeout: whether min_version is READY and
 * only waits for an apply(), which no wait does on its own. */
static int wait_timed_out(dcast_consumer *c, uint64_t min_version, int timeout_ms)
{
	uint64_t ready, held = dcast_consumer_version(c);
	char have[32] = "none";

	pthread_mutex_lock(&c->lock);
	ready = ready_locked(c);
	pthread_mutex_unlock(&c->lock);
	if (held != DCAST_VERSION_NONE)
		snprintf(have, sizeof(have), "%" PRIu64, held);
	if (ready != DCAST_VERSION_NONE && ready >= min_version)
		return dcast_fail(DCAST_ETIMEDOUT, "version %" PRIu64 " not reached in %d ms: it is READY "
				  "(up to %" PRIu64 ") but not applied; the tensors hold %s (call apply(), "
				  "or open with auto_apply)", min_version, timeout_ms, ready, have);
	return dcast_fail(DCAST_ETIMEDOUT, "version %" PRIu64 " not reached in %d ms (the tensors hold %s)",
			  min_version, timeout_ms, have);
}

int dcast_consumer_wait_version(dcast_consumer *c, uint64_t min_version, int timeout_ms)
{
	struct timespec ts;
	int rc = 0;

	if (!c)
		return dcast_fail(DCAST_EINVAL, "wait_version: NULL consumer");
	cs_deadline(&ts, timeout_ms < 0 ? 0 : timeout_ms);
	pthread_mutex_lock(&c->mu);
	for (;;) {
		uint64_t v = atomic_load(&c->applied);
		if (v != DCAST_VERSION_NONE && v >= min_version)
			break;
		rc = timeout_ms < 0 ? pthread_cond_wait(&c->cv, &c->mu) : pthread_cond_timedwait(&c->cv, &c->mu, &ts);
		if (rc == ETIMEDOUT)
			break;
	}
	pthread_mutex_unlock(&c->mu);
	if (rc == ETIMEDOUT)
		return wait_timed_out(c, min_version, timeout_ms);
	return 0;
}

void dcast_consumer_stats_get(const dcast_consumer *c, dcast_consumer_stats *st)
{
	dcast_consumer *w = (dcast_consumer *)c;

	pthread_mutex_lock(&w->lock);
	*st = c->stats;
	st->total_bytes_received = c->total_received;
	st->peak_pool_bytes = c->pool.peak;
	st->pool_bytes = c->pool.bytes;
	cs_store_stats(c->store, st);
	st->rejoins = c->ss.hellos ? c->ss.hellos - 1 : 0;
	ready_chain_locked(c, &st->ready_backlog);
	pthread_mutex_unlock(&w->lock);
}

int dcast_consumer_checkpoint(dcast_consumer *c)
{
	int err;

	if (!c)
		return dcast_fail(DCAST_EINVAL, "dcast_consumer_checkpoint: NULL consumer");
	pthread_mutex_lock(&c->lock);
	cs_store_fold_wait(c->store, &c->lock); /* an anchor's seal it runs: done first */
	if (!(err = cs_anchor_new_seal(c, NULL)) && !(err = cs_store_fold_now(c)))
		c->ss.fold_due = 0;
	pthread_mutex_unlock(&c->lock);
	return err;
}
