/* The store's life (open, close) and what the consumer tells it or asks
 * of it outside a load, a record write or a fold: a version applied, its
 * counters, a failed sync, the generation of its files. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "store_impl.h"
#include "dcast_common.h"

static char *join(const char *a, const char *b)
{
	size_t n = strlen(a) + strlen(b) + 2;
	char *s = malloc(n);

	if (s)
		snprintf(s, n, "%s/%s", a, b);
	return s;
}

int cs_store_open(dcast_consumer *c, const cs_store_sink *sink)
{
	struct cs_store *s = calloc(1, sizeof(*s));
	int err;

	if (!(c->store = s))
		return dcast_fail(DCAST_ENOMEM, "consumer: its store");
	s->sink = sink;
	s->anchor_file_version = DCAST_VERSION_NONE;
	s->new_version = DCAST_VERSION_NONE;
	s->anchor_path = join(c->dir, "model.safetensors");
	s->log_dir = join(c->dir, "model.dlog");
	if (!s->anchor_path || !s->log_dir)
		return dcast_fail(DCAST_ENOMEM, "paths");
	if (mkdir(s->log_dir, 0755) && errno != EEXIST)
		return dcast_fail(DCAST_EIO, "%s: mkdir: %s", s->log_dir, strerror(errno));
	if ((err = cs_syncer_open(&s->syncer)))
		return err;
	return cs_ckpt_wb_open(c);
}

void cs_store_close(dcast_consumer *c, int fold_owed)
{
	struct cs_store *s = c->store;

	if (!s)
		return;
	cs_ckpt_settle(c); /* chunk records written behind */
	if (cs_anchor_new_seal(c, 1)) /* an anchor applied: durable */
		DCAST_LOG_W("consumer %s: anchor file at close: %s", c->model, dcast_last_error());
	if (fold_owed && cs_fold_wanted(c) && cs_ckpt_fold(c))
		DCAST_LOG_W("consumer %s: fold at close: %s", c->model, dcast_last_error());
	cs_syncer_close(&s->syncer); /* what was committed is on the disk */
	cs_ckpt_wb_close(c);
	free(s->new_offs); /* an anchor in place still streaming in: its .new goes at the next open */
	free(s->anchor_path), free(s->log_dir);
	free(s);
	c->store = NULL;
}

int cs_store_error(dcast_consumer *c)
{
	return cs_syncer_error(&c->store->syncer);
}

uint64_t cs_store_gen(const dcast_consumer *c)
{
	return atomic_load(&c->store->gen);
}

int cs_store_applied(dcast_consumer *c, const cs_version *v)
{
	if (!v->direct)
		c->store->deltas_since_fold++; /* a record to fold (not an anchor in its own file) */
	return cs_anchor_new_applied(c, v);
}

void cs_store_stats(const dcast_consumer *c, dcast_consumer_stats *st)
{
	st->log_write_bytes = c->store->log_write_bytes;
	st->log_write_ns = c->store->log_write_ns;
	st->folds = c->store->folds;
	st->folds_from_tensors = c->store->folds_live;
}
