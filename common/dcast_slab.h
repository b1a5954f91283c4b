/* Private: buffers for payloads a process keeps for long (a broker's or
 * a relay's log held in memory), carved one after another out of regions of
 * DCAST_SLAB_BYTES that the kernel may back with transparent huge pages
 * (MADV_HUGEPAGE, unless dcast_huge_pages() says not).  Memory malloc hands out for such payloads is faulted
 * in 4 KiB at a time on first touch, and for an anchor kept in memory the
 * faults were about a third of the time to take it.  A region is
 * unmapped once a newer one is in use and every buffer carved from it was
 * freed: payloads freed in about the order they came (a log's versions)
 * return their memory; one kept long holds its whole region.  So each
 * log carves from a pool of its own (a model's versions retire in order;
 * one model's payload kept long must not hold another model's regions).
 * Thread-safe. */
#ifndef DCAST_SLAB_H
#define DCAST_SLAB_H

#include <pthread.h>
#include <stddef.h>
#include <zmq.h>

#define DCAST_SLAB_BYTES (32u << 20)

/* Where buffers are carved from: a current region and what of it is
 * handed out.  Initialise with DCAST_SLAB_POOL_INIT (or zero it and init
 * mu); close with dcast_slab_pool_close. */
struct dcast_slab_pool {
	pthread_mutex_t mu;
	void *cur;   /* the current region (private), NULL before the first buffer */
	size_t used; /* its bytes handed out, its head included */
};
#define DCAST_SLAB_POOL_INIT {PTHREAD_MUTEX_INITIALIZER, NULL, 0}

/* 1 unless DELTACAST_HUGE_PAGES=0 is in the environment (read at each
 * call): whether memory laid out for transparent huge pages asks the
 * kernel for them (MADV_HUGEPAGE).  On a VM that hands freed memory back
 * to its host, a huge page's first touch costs the host 512 faults
 * (docs/operations.md, "Huge pages" and "The broker's heap"). */
int dcast_huge_pages(void);

/* A buffer of n bytes from `pool`, 64-byte aligned, and in *region what dcast_slab_free needs; n over
 * DCAST_SLAB_BYTES less 64 gets a region of its own.  NULL when no memory
 * could be mapped (errno from mmap). */
void *dcast_slab_get(struct dcast_slab_pool *pool, size_t n, void **region);

/* The pool carves no more: its current region goes once its last buffer
 * is freed (buffers outlive their pool).  The pool is left empty, usable
 * again; its mutex is not destroyed. */
void dcast_slab_pool_close(struct dcast_slab_pool *pool);

/* The buffer `data` from dcast_slab_get goes back (the signature of a
 * zmq_msg_init_data free function: data unused, region as hint). */
void dcast_slab_free(void *data, void *region);

/* msg (uninitialised) becomes a message of n bytes, their contents
 * undefined, carved from `pool` and given back to it when the message is
 * closed.  0, or -1 when no memory was had (msg then left uninitialised). */
int dcast_slab_msg(struct dcast_slab_pool *pool, zmq_msg_t *msg, size_t n);

#endif
