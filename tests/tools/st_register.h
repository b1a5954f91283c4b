/* Register every tensor of a safetensors file with a producer (host memory,
 * the whole tensor as this rank's shard), so that the next publish sends the
 * file's contents.  Shared by the paced publishers fault_publish and
 * bench_sync_publish.  Returns 0 or the first dcast_err. */
#ifndef ST_REGISTER_H
#define ST_REGISTER_H

#include "deltacast/producer.h"
#include "deltacast/safetensors.h"

static inline int st_register_file(dcast_producer *p, dcast_st_file *f)
{
	for (size_t i = 0; i < dcast_st_count(f); i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(f, i);
		int d = dcast_dtype_from_name(dcast_st_dtype_name(t->dtype));
		int rc = d < 0 ? DCAST_EDTYPE
			       : dcast_producer_register(p, t->name, d, t->ndim, t->shape, t->data,
							 DCAST_MEM_HOST, 0, t->count);
		if (rc)
			return rc;
	}
	return 0;
}
#endif
