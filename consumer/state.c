/* The consumer's state that every part reads: the live tensors' table,
 * the applied version (published for wait_version), the event queue, and
 * a staged version's memory (made fresh, freed; its chunk table, its
 * duplicate set and the steps that change its state are intake.c's).  At
 * the bottom of consumer/: it calls nothing of it but the views' free. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "consumer_impl.h"
#include "dcast_common.h"

void cs_event_push(dcast_consumer *c, int type, uint64_t version, int code, const char *text)
{
	dcast_event *e;

	if (c->ev_count == CS_EVENTS) { /* bounded: the oldest goes */
		c->ev_head = (c->ev_head + 1) % CS_EVENTS;
		c->ev_count--;
	}
	e = &c->events[(c->ev_head + c->ev_count++) % CS_EVENTS];
	memset(e, 0, sizeof(*e));
	e->type = type;
	e->version = version;
	e->have_version = DCAST_VERSION_NONE;
	e->code = code;
	snprintf(e->text, sizeof(e->text), "%s", text ? text : "");
}

void cs_set_applied(dcast_consumer *c, uint64_t v)
{
	pthread_mutex_lock(&c->mu);
	atomic_store(&c->applied, v);
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

uint64_t dcast_consumer_version(const dcast_consumer *c)
{
	return c ? atomic_load(&((dcast_consumer *)c)->applied) : DCAST_VERSION_NONE;
}

static const char *tensor_name(const void *ctx, uint32_t i)
{
	return ((const dcast_consumer *)ctx)->tensors[i].desc.name;
}

cs_tensor *cs_tensor_find(dcast_consumer *c, const char *name)
{
	int64_t i = dcast_names_get(&c->names, name, tensor_name, c);

	return i < 0 ? NULL : &c->tensors[i];
}

dcast_desc_array cs_tensor_descs(const dcast_consumer *c)
{
	return (dcast_desc_array){c->n_tensors ? &c->tensors[0].desc : NULL, sizeof(cs_tensor), c->n_tensors};
}

int cs_tensors_tiled(const dcast_consumer *c)
{
	for (uint32_t i = 0; i < c->n_tensors; i++)
		if (c->tensors[i].map.tiled)
			return 1;
	return 0;
}

#define CS_PAGE 4096u

/* x rounded up to a multiple of `to`, a power of two. */
static uint64_t round_up(uint64_t x, uint64_t to)
{
	return (x + to - 1) & ~(to - 1);
}

/* Zeroed, CS_FILE_ALIGN-aligned (O_DIRECT reads the memory too). */
static void *small_alloc(uint64_t bytes)
{
	void *p = NULL;

	if (posix_memalign(&p, CS_FILE_ALIGN, bytes ? (size_t)bytes : 1) != 0)
		return NULL;
	memset(p, 0, bytes ? (size_t)bytes : 1);
	return p;
}

void *cs_host_alloc(uint64_t bytes, int huge)
{
	size_t len = (size_t)bytes + CS_HUGE_PAGE, keep = round_up(bytes, CS_PAGE);
	unsigned char *m, *a;

	if (bytes < CS_HUGE_PAGE)
		return small_alloc(bytes);
	m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return NULL;
	a = (unsigned char *)round_up((uintptr_t)m, CS_HUGE_PAGE);
	if (a > m)
		munmap(m, (size_t)(a - m));
	if (a + keep < m + len)
		munmap(a + keep, (size_t)(m + len - (a + keep)));
	/* best effort */
	madvise(a, bytes & ~(uint64_t)(CS_HUGE_PAGE - 1), huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	return a;
}

void cs_host_free(void *p, uint64_t bytes)
{
	if (bytes < CS_HUGE_PAGE)
		free(p);
	else if (p)
		munmap(p, (size_t)bytes);
}

void cs_host_release(void *p, uint64_t bytes)
{
	uintptr_t a = round_up((uintptr_t)p, CS_PAGE), end = ((uintptr_t)p + bytes) & ~(uintptr_t)(CS_PAGE - 1);

	if (a < end)
		madvise((void *)a, end - a, MADV_DONTNEED); /* best effort: the pages are ours alone */
}

void cs_tensors_free(dcast_consumer *c)
{
	for (uint32_t i = 0; i < c->n_tensors; i++)
		cs_views_free(&c->tensors[i]);
	cs_host_free(c->arena, c->arena_bytes);
	c->arena = NULL;
	c->arena_bytes = 0;
	free(c->tensors);
	dcast_names_free(&c->names);
	c->tensors = NULL;
	c->n_tensors = 0;
}

/* Where tensor t goes in the arena, its bytes starting at `data_off` of
 * model.safetensors' data section, the arena's bytes used so far being
 * `end`: the first place from end congruent to data_off modulo
 * CS_FILE_ALIGN, unless data_off does not suit its elements (the file's
 * tensors are packed: a 2-byte tensor of odd length before a 4-byte one),
 * then the next page, which keeps every element aligned. */
static uint64_t arena_place(const cs_tensor *t, uint64_t data_off, uint64_t end)
{
	if (!t->elem_size || data_off % t->elem_size)
		return round_up(end, CS_PAGE);
	return end + ((data_off - end) & (CS_FILE_ALIGN - 1));
}

/* Each tensor's place in the arena into t[i].ptr (an offset until the
 * arena exists); returns the arena's size. */
static uint64_t arena_offsets(cs_tensor *t, uint32_t n)
{
	uint64_t end = 0, data_off = 0;

	for (uint32_t i = 0; i < n; i++) {
		uint64_t at = arena_place(&t[i], data_off, end);

		t[i].ptr = (unsigned char *)(uintptr_t)at;
		end = at + t[i].bytes;
		data_off += t[i].bytes;
	}
	return end;
}

int cs_tensors_from_manifest(dcast_consumer *c, const dcast_manifest *m)
{
	cs_tensor *t = calloc(m->n_tensors ? m->n_tensors : 1, sizeof(*t));
	uint64_t total = 0;
	int err = 0;

	if (!t)
		return dcast_fail(DCAST_ENOMEM, "tensor table of %u", m->n_tensors);
	for (uint32_t i = 0; i < m->n_tensors; i++) {
		t[i].desc = m->tensors[i];
		t[i].elem_size = dcast_dtype_size((int)t[i].desc.dtype);
		t[i].bytes = dcast_tensor_elems(&t[i].desc) * t[i].elem_size;
		t[i].mem = DCAST_MEM_HOST;
		t[i].owned = 1;
		dcast_tiles_init(&t[i].map, &t[i].desc);
	}
	c->tensors = t;
	c->n_tensors = m->n_tensors;
	for (uint32_t i = 0; i < m->n_tensors && !err; i++)
		err = dcast_names_put(&c->names, t[i].desc.name, i);
	total = arena_offsets(t, m->n_tensors);
	if (!err && !(c->arena = cs_host_alloc(total, c->arena_huge)))
		err = dcast_fail(DCAST_ENOMEM, "host copies of %u tensors (%" PRIu64 " bytes)", m->n_tensors, total);
	if (err) {
		cs_tensors_free(c);
		return err;
	}
	c->arena_bytes = total;
	for (uint32_t i = 0; i < m->n_tensors; i++)
		t[i].ptr = t[i].host = c->arena + (uintptr_t)t[i].ptr;
	return 0;
}

static int manifest_matches(const dcast_consumer *c, const dcast_manifest *m)
{
	if (m->n_tensors != c->n_tensors)
		return 0;
	for (uint32_t i = 0; i < m->n_tensors; i++) {
		const dcast_tensor_desc *a = &m->tensors[i], *b = &c->tensors[i].desc;
		if (strcmp(a->name, b->name) || a->dtype != b->dtype || a->ndim != b->ndim ||
		    memcmp(a->shape, b->shape, a->ndim * sizeof(a->shape[0])) || !dcast_grid_same(a, b))
			return 0;
	}
	return 1;
}

int cs_manifest_take(dcast_consumer *c, const dcast_manifest *m)
{
	if (!c->n_tensors)
		return cs_tensors_from_manifest(c, m);
	return manifest_matches(c, m) ? 0 : dcast_fail(DCAST_ESHAPE, "MANIFEST of %s differs from "
						       "the tensors held", c->model);
}

/* ---- a version's memory, and the digests it or the tensors keep ---- */

void cs_dcache_clear(cs_dcache *d)
{
	free(d->e);
	d->e = NULL;
	d->n = 0;
}

int cs_chunk_writes(const cs_chunk *k)
{
	return k->info.encoding == DCAST_ENC_DENSE || k->info.changed;
}

void cs_version_init(cs_version *v, uint64_t version)
{
	memset(v, 0, sizeof(*v));
	v->version = version;
	v->base_version = DCAST_VERSION_NONE;
	v->fd = -1;
	v->io_file = -1;
}

void cs_version_free(cs_version *v)
{
	free(v->chunks);
	free(v->seen);
	free(v->commit.digests);
	cs_dcache_clear(&v->ahead);
	if (v->io && v->io_file >= 0)
		dcast_io_file_remove(v->io, v->io_file);
	if (v->fd >= 0)
		close(v->fd);
	cs_version_init(v, DCAST_VERSION_NONE);
}
