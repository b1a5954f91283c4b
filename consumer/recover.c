/* The recovery policy, when an apply left the tensors torn (its old values
 * not kept in memory): bring the applied version back from the store, or,
 * when that fails too, forget the state (version NONE: the re-join asks
 * for an anchor).  Above the store, which only rebuilds what it holds. */
#include <inttypes.h>
#include <stdio.h>
#include "consumer_impl.h"
#include "dcast_common.h"
#include "store/store.h"

void cs_forget_state(dcast_consumer *c)
{
	cs_set_applied(c, DCAST_VERSION_NONE);
	cs_dcache_clear(&c->dcache);
	c->ss.fold_due = 0;
	cs_ckpt_discard(c);
}

int cs_ckpt_recover(dcast_consumer *c, uint64_t version, int err)
{
	uint64_t prev = dcast_consumer_version(c);
	char why[512];

	snprintf(why, sizeof(why), "%s", dcast_last_error());
	if (prev == DCAST_VERSION_NONE)
		DCAST_LOG_I("consumer %s: version %" PRIu64 " refused while the tensors held no version: "
			    "nothing to restore", c->model, version);
	else
		DCAST_LOG_I("consumer %s: old values of version %" PRIu64 " not kept in memory; restoring "
			    "version %" PRIu64 " from the local checkpoint", c->model, version, prev);
	cs_store_fold_wait(c->store, &c->lock); /* its files may be the ones the restore reads */
	if (!cs_ckpt_restore(c))
		return dcast_fail(err, "%s (version %" PRIu64 " refused; tensors kept at the previous version)",
				  why, version);
	DCAST_LOG_E("consumer %s: restore from the local checkpoint failed: %s", c->model, dcast_last_error());
	cs_forget_state(c);
	DCAST_LOG_E("consumer %s: version %" PRIu64 " refused and version %" PRIu64 " could not be brought back; "
		    "tensors hold no valid version until an anchor arrives", c->model, version, prev);
	return dcast_fail(err, "%s (version %" PRIu64 " refused; version %" PRIu64 " could not be restored "
			  "either: the tensors hold no valid version (version() is NONE) until the broker's "
			  "anchor is applied)", why, version, prev);
}
