/* A staged version's memory: a fresh one (cs_version_init) and its
 * release (cs_version_free: its tables, digests and record file
 * descriptor).  Its chunk table, its duplicate set and the steps that
 * change its state are intake.c's. */
#include <inttypes.h>
#include <string.h>
#include <unistd.h>
#include "consumer_impl.h"
#include "dcast_common.h"

int cs_chunk_writes(const cs_chunk *k)
{
	return k->info.encoding == DCAST_ENC_DENSE || k->info.changed;
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

void cs_version_init(cs_version *v, uint64_t version)
{
	memset(v, 0, sizeof(*v));
	v->version = version;
	v->base_version = DCAST_VERSION_NONE;
	v->fd = -1;
	v->io_file = -1;
}
