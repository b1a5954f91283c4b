/* Durability glue between the broker's log and broker/segment.c: with
 * --data-dir every committed version is written and fsynced before its ACK
 * (broker_version_committed), and at start-up the segments are replayed
 * into the log (broker_log_restore).  One store per process. */
#include <string.h>
#include "broker.h"
#include "dcast_common.h"
#include "durable.h"
#include "segment.h"

static broker_seg_store *store;

/* Restore state: the version being rebuilt from its records. */
struct restore {
	struct broker *b;
	struct broker_model *m;
	struct broker_version *v;
	uint32_t cap;
	uint64_t versions;
};

static int durable_write(struct broker_model *m, struct broker_version *v)
{
	int rc = 0;

	if (v->anchor)
		rc = broker_seg_begin_anchor(store, m->name, v->version, v->manifest->enc,
					     v->manifest->enc_len);
	for (uint32_t i = 0; !rc && i < v->n_chunks; i++)
		rc = broker_seg_append_chunk(store, m->name, v->version,
					     zmq_msg_data(&v->chunks[i].hdr),
					     zmq_msg_size(&v->chunks[i].hdr),
					     zmq_msg_data(&v->chunks[i].payload),
					     zmq_msg_size(&v->chunks[i].payload));
	if (!rc)
		return broker_seg_commit(store, m->name, v->version, zmq_msg_data(&v->commit_hdr),
					 zmq_msg_size(&v->commit_hdr));
	broker_seg_abort(store, m->name);
	return rc;
}

/* The version's records written and fsynced; logged with the time it took,
 * which the event loop spent waiting (docs/operations.md, durability). */
int broker_durable_commit(struct broker *b, struct broker_model *m, struct broker_version *v)
{
	uint64_t t0;
	int rc;

	(void)b;
	if (!store)
		return 0;
	t0 = dcast_now_ns();
	if (!(rc = durable_write(m, v)))
		DCAST_LOG_I("model %s: version %llu durable: %llu bytes written and fsynced in %.1f ms",
			    m->name, (unsigned long long)v->version, (unsigned long long)v->payload_bytes,
			    (double)(dcast_now_ns() - t0) / 1e6);
	return rc;
}

static int frame_copy(zmq_msg_t *msg, const void *data, size_t len)
{
	if (zmq_msg_init_size(msg, len))
		return dcast_fail(DCAST_ENOMEM, "restore: %zu-byte frame", len);
	memcpy(zmq_msg_data(msg), data, len);
	return 0;
}

static int restore_manifest(struct restore *r, const char *model, const void *hdr, size_t len)
{
	struct broker_manifest *mf;
	dcast_msg msg;
	int rc = dcast_msg_decode(hdr, len, &msg);

	if (rc)
		return rc;
	r->m = broker_model_get(r->b, model, 1);
	mf = r->m ? broker_manifest_new(&msg.u.manifest) : NULL;
	dcast_msg_free(&msg);
	if (!mf)
		return r->m ? dcast_fail(DCAST_ENOMEM, "restore: manifest of %s", model)
			    : DCAST_EBUSY;
	broker_manifest_put(r->m->manifest);
	r->m->manifest = mf;
	return 0;
}

static int restore_version_new(struct restore *r, uint64_t version)
{
	struct broker_version *v = calloc(1, sizeof(*v));

	if (!v)
		return dcast_fail(DCAST_ENOMEM, "restore: version %llu", (unsigned long long)version);
	v->refs = 1;
	v->version = version;
	v->manifest = r->m->manifest;
	v->manifest->refs++;
	zmq_msg_init(&v->commit_hdr);
	r->v = v;
	r->cap = 0;
	return 0;
}

static int restore_chunk(struct restore *r, uint64_t version, const void *hdr, size_t hdr_len,
			 const void *payload, size_t payload_len)
{
	struct broker_version *v;
	int rc;

	if (!r->v && (rc = restore_version_new(r, version)))
		return rc;
	v = r->v;
	if (v->n_chunks == r->cap) {
		uint32_t cap = r->cap ? r->cap * 2 : 64;
		struct broker_chunk *c = realloc(v->chunks, cap * sizeof(*c));

		if (!c)
			return dcast_fail(DCAST_ENOMEM, "restore: %u chunks", cap);
		v->chunks = c;
		r->cap = cap;
	}
	if ((rc = frame_copy(&v->chunks[v->n_chunks].hdr, hdr, hdr_len)))
		return rc;
	if ((rc = frame_copy(&v->chunks[v->n_chunks].payload, payload, payload_len))) {
		zmq_msg_close(&v->chunks[v->n_chunks].hdr);
		return rc;
	}
	v->n_chunks++;
	v->payload_bytes += payload_len;
	return 0;
}

static int restore_commit(struct restore *r, uint64_t version, const void *hdr, size_t len)
{
	struct broker_version *v;
	dcast_msg msg;
	int rc;

	if (!r->v && (rc = restore_version_new(r, version)))
		return rc;
	v = r->v;
	r->v = NULL;
	if ((rc = dcast_msg_decode(hdr, len, &msg)) == 0) {
		v->base_version = msg.u.commit.base_version;
		v->anchor = (int)msg.u.commit.anchor;
		v->n_digests = msg.u.commit.n_digests;
		v->digests = msg.u.commit.digests;
		msg.u.commit.digests = NULL;
		dcast_msg_free(&msg);
		rc = frame_copy(&v->commit_hdr, hdr, len);
	}
	if (!rc)
		rc = broker_log_append(r->b, r->m, v);
	if (rc) {
		broker_version_put(v);
		return rc;
	}
	r->versions++;
	return 0;
}

static int restore_visit(void *ctx, const char *model, int kind, uint64_t version,
			 const void *hdr, size_t hdr_len, const void *payload, size_t payload_len)
{
	struct restore *r = ctx;

	if (kind == BROKER_SEG_MANIFEST)
		return restore_manifest(r, model, hdr, hdr_len);
	if (!r->m)
		return dcast_fail(DCAST_ECORRUPT, "restore: %s: version before its manifest", model);
	if (kind == BROKER_SEG_CHUNK)
		return restore_chunk(r, version, hdr, hdr_len, payload, payload_len);
	return restore_commit(r, version, hdr, hdr_len);
}

int broker_durable_restore(struct broker *b)
{
	struct restore r = {.b = b};
	int rc;

	if (!b->cfg.data_dir)
		return 0;
	if ((rc = broker_seg_open(&store, b->cfg.data_dir)))
		return rc;
	DCAST_LOG_I("data dir %s: segments written through %s", b->cfg.data_dir,
		    broker_seg_uses_uring(store) ? "io_uring" : "pread/pwrite");
	rc = broker_seg_load(store, restore_visit, &r);
	if (r.v)
		broker_version_put(r.v);
	if (rc)
		return dcast_fail(rc, "restore from %s: %s", b->cfg.data_dir, dcast_last_error());
	DCAST_LOG_I("data dir %s: %llu committed version(s) restored", b->cfg.data_dir,
		    (unsigned long long)r.versions);
	return 0;
}

void broker_durable_close(void)
{
	broker_seg_close(&store);
}
