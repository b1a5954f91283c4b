/* Private: buffers for payloads a process keeps for long (a relay's log
 * held in memory), carved one after another out of regions of
 * DCAST_SLAB_BYTES that the kernel may back with transparent huge pages
 * (MADV_HUGEPAGE).  Memory malloc hands out for such payloads is faulted
 * in 4 KiB at a time on first touch, and for an anchor kept in memory the
 * faults were about a third of the time to take it.  A region is
 * unmapped once a newer one is in use and every buffer carved from it was
 * freed: payloads freed in about the order they came (a log's versions)
 * return their memory; one kept long holds its whole region.  Thread-safe. */
#ifndef DCAST_SLAB_H
#define DCAST_SLAB_H

#include <stddef.h>

#define DCAST_SLAB_BYTES (32u << 20)

/* A buffer of n bytes, 64-byte aligned, and in *region what
 * dcast_slab_free needs; n over DCAST_SLAB_BYTES less 64 gets a region of
 * its own.  NULL when no memory could be mapped (errno from mmap). */
void *dcast_slab_get(size_t n, void **region);

/* The buffer `data` from dcast_slab_get goes back (the signature of a
 * zmq_msg_init_data free function: data unused, region as hint). */
void dcast_slab_free(void *data, void *region);

#endif
