/* The staging pool: one pinned mapping (mmap + mlock, best effort) split
 * into resident, scratch and undo regions (consumer_impl.h).  Mapped once
 * at open; nothing on the receive path allocates.  Its pages are faulted
 * in, locked and registered with the I/O engine at its first use, not at
 * open: an anchor taken in place never touches it, so a fresh consumer
 * joins without the 48 MiB of page faults and pinning a default budget
 * costs (docs/architecture.md, "An anchor's bytes"). */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include "consumer_impl.h"
#include "dcast_common.h"

int cs_pool_open(cs_pool *p, uint64_t budget_bytes)
{
	memset(p, 0, sizeof(*p));
	p->region_bytes = (budget_bytes / 4) & ~(uint64_t)4095;
	p->bytes = 3 * p->region_bytes;
	p->undo_owner = DCAST_VERSION_NONE;
	p->base = mmap(NULL, p->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p->base == MAP_FAILED) {
		p->base = NULL;
		return dcast_fail(DCAST_ENOMEM, "staging pool: mmap %llu bytes: %s",
				  (unsigned long long)p->bytes, strerror(errno));
	}
	return 0; /* pinned for CUDA too once a device tensor is bound (cs_pool_cuda_register) */
}

void cs_pool_attach(cs_pool *p, dcast_io *io)
{
	DCAST_ASSERT(!p->io && !p->pinned);
	p->io = io;
}

/* Fault the pages in and lock them (mlock, best effort), then register
 * them with the I/O engine: once, at the pool's first use. */
static void pool_pin(cs_pool *p)
{
	p->pinned = 1;
	if (mlock(p->base, p->bytes) == 0) {
		p->locked = 1;
	} else {
		static _Atomic int warned;
		if (!warned++)
			DCAST_LOG_W("consumer: staging pool of %llu bytes not pinned (mlock: %s; "
				    "raise RLIMIT_MEMLOCK); continuing unpinned",
				    (unsigned long long)p->bytes, strerror(errno));
	}
	/* refused by the kernel: plain buffers, said by dcast_io; any other
	 * error is a second registration, which pinned rules out */
	int rc = p->io ? dcast_io_register_buffers(p->io, &(struct iovec){p->base, p->bytes}, 1) : 0;
	DCAST_ASSERT(rc == 0);
}

/* The pool's memory, pinned from its first use on. */
static unsigned char *pool_mem(cs_pool *p)
{
	if (!p->pinned)
		pool_pin(p);
	return p->base;
}

void cs_pool_close(cs_pool *p)
{
	cs_pool_cuda_unregister(p);
	if (p->base)
		munmap(p->base, p->bytes);
	memset(p, 0, sizeof(*p));
}

unsigned char *cs_pool_scratch(cs_pool *p)
{
	return pool_mem(p) + p->region_bytes;
}

unsigned char *cs_pool_undo_take(cs_pool *p, uint64_t version)
{
	p->undo_owner = version;
	return pool_mem(p) + 2 * p->region_bytes;
}

unsigned char *cs_pool_resident_get(cs_pool *p, uint64_t n)
{
	uint64_t aligned = (n + 63) & ~(uint64_t)63;
	unsigned char *slot;

	if (p->resident_used + aligned > p->region_bytes)
		return NULL;
	slot = pool_mem(p) + p->resident_used;
	p->resident_used += aligned;
	p->resident_live++;
	p->in_use += aligned;
	if (p->in_use > p->peak)
		p->peak = p->in_use;
	return slot;
}

void cs_pool_resident_put(cs_pool *p, uint64_t n)
{
	uint64_t aligned = (n + 63) & ~(uint64_t)63;

	DCAST_ASSERT(p->resident_live > 0 && p->in_use >= aligned);
	p->in_use -= aligned;
	if (--p->resident_live == 0)
		p->resident_used = 0;
}
