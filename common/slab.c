/* Buffers carved from huge-page regions (dcast_slab.h). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
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

static pthread_mutex_t slab_mu = PTHREAD_MUTEX_INITIALIZER;
static struct slab *slab_cur; /* buffers are carved from here, under slab_mu */
static size_t slab_used;      /* its bytes handed out, its head included */

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

/* A fresh region that holds at least `need` bytes after its head. */
static struct slab *slab_new(size_t need)
{
	size_t bytes = need + SLAB_ALIGN > DCAST_SLAB_BYTES
		       ? (need + SLAB_ALIGN + SLAB_HUGE - 1) / SLAB_HUGE * SLAB_HUGE : DCAST_SLAB_BYTES;
	struct slab *s = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (s == MAP_FAILED)
		return NULL;
	madvise(s, bytes, MADV_HUGEPAGE); /* a hint: 4 KiB pages where refused */
	atomic_init(&s->refs, 1);
	s->bytes = bytes;
	return s;
}

void *dcast_slab_get(size_t n, void **region)
{
	size_t need = (n + SLAB_ALIGN - 1) / SLAB_ALIGN * SLAB_ALIGN;
	unsigned char *p = NULL;

	pthread_mutex_lock(&slab_mu);
	if (slab_cur && slab_used + need > slab_cur->bytes) {
		slab_put(slab_cur); /* no longer current: gone with its last buffer */
		slab_cur = NULL;
	}
	if (!slab_cur && (slab_cur = slab_new(need)))
		slab_used = SLAB_ALIGN; /* the head */
	if (slab_cur) {
		p = (unsigned char *)slab_cur + slab_used;
		slab_used += need;
		atomic_fetch_add(&slab_cur->refs, 1);
		*region = slab_cur;
		DCAST_ASSERT(slab_used <= slab_cur->bytes);
	}
	pthread_mutex_unlock(&slab_mu);
	return p;
}
