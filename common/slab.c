/* Buffers carved from huge-page regions (dcast_slab.h). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "dcast_common.h"
#include "dcast_slab.h"

#define SLAB_ALIGN 64
#define SLAB_HUGE (2u << 20)

/* A region's head, at its start: its buffers follow. */
struct slab {
	atomic_size_t refs;  /* buffers not yet freed, +1 while it is the current region */
	size_t bytes;        /* the mapping's size */
};

static void slab_put(struct slab *s)
{
	if (atomic_fetch_sub(&s->refs, 1) == 1)
		munmap(s, s->bytes);
}

void dcast_slab_free(void *data, void *region)
{
	(void)data;
	slab_put(region);
}

int dcast_huge_pages(void)
{
	const char *e = getenv("DELTACAST_HUGE_PAGES");

	return !e || strcmp(e, "0") != 0;
}

/* A fresh region that holds at least `need` bytes after its head. */
static struct slab *slab_new(size_t need)
{
	size_t bytes = need + SLAB_ALIGN > DCAST_SLAB_BYTES
		       ? (need + SLAB_ALIGN + SLAB_HUGE - 1) / SLAB_HUGE * SLAB_HUGE : DCAST_SLAB_BYTES;
	struct slab *s = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (s == MAP_FAILED)
		return NULL;
	if (dcast_huge_pages())
		madvise(s, bytes, MADV_HUGEPAGE); /* a hint: 4 KiB pages where refused */
	atomic_init(&s->refs, 1);
	s->bytes = bytes;
	return s;
}

void *dcast_slab_get(struct dcast_slab_pool *pool, size_t n, void **region)
{
	size_t need = (n + SLAB_ALIGN - 1) / SLAB_ALIGN * SLAB_ALIGN;
	struct dcast_slab_pool *q = pool;
	struct slab *cur;
	unsigned char *p = NULL;

	pthread_mutex_lock(&q->mu);
	cur = q->cur; /* buffers are carved from here; q->used of it handed out, its head included */
	if (cur && q->used + need > cur->bytes) {
		slab_put(cur); /* no longer current: gone with its last buffer */
		cur = NULL;
	}
	if (!cur && (cur = slab_new(need)))
		q->used = SLAB_ALIGN; /* the head */
	if (cur) {
		p = (unsigned char *)cur + q->used;
		q->used += need;
		atomic_fetch_add(&cur->refs, 1);
		*region = cur;
		DCAST_ASSERT(q->used <= cur->bytes);
	}
	q->cur = cur;
	pthread_mutex_unlock(&q->mu);
	return p;
}

void dcast_slab_pool_close(struct dcast_slab_pool *pool)
{
	pthread_mutex_lock(&pool->mu);
	if (pool->cur)
		slab_put(pool->cur);
	pool->cur = NULL;
	pool->used = 0;
	pthread_mutex_unlock(&pool->mu);
}

int dcast_slab_msg(struct dcast_slab_pool *pool, zmq_msg_t *msg, size_t n)
{
	void *region, *p = dcast_slab_get(pool, n, &region);

	if (!p)
		return -1;
	if (!zmq_msg_init_data(msg, p, n, dcast_slab_free, region))
		return 0;
	dcast_slab_free(p, region);
	return -1;
}
