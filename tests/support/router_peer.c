/* A test playing the broker (router_peer.h). */
#include <string.h>
#include "../check.h"
#include "../chunk_fit_cases.h"
#include "../router_peer.h"
#include "dcast_wire.h"
#include "deltacast/codec.h"

void rp_send(void *router, zmq_msg_t *rid, const dcast_msg *m, const void *payload, size_t len)
{
	zmq_msg_t p;

	REQUIRE(zmq_msg_init_size(&p, len) == 0);
	if (len)
		memcpy(zmq_msg_data(&p), payload, len);
	REQUIRE(dcast_wire_send(router, zmq_msg_data(rid), zmq_msg_size(rid), m, len ? &p : NULL, 0) == 0);
	if (!len)
		zmq_msg_close(&p);
}

void rp_welcome(void *router, zmq_msg_t *rid, const char *model)
{
	dcast_tensor_desc t;
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_WELCOME);
	snprintf(m.u.welcome.model, sizeof(m.u.welcome.model), "%s", model);
	m.u.welcome.version = m.u.welcome.anchor_version = DCAST_VERSION_NONE;
	m.u.welcome.heartbeat_ms = 60000;
	m.u.welcome.run = 0x1234;
	rp_send(router, rid, &m, NULL, 0);
	chunk_fit_manifest(&m, &t, model);
	rp_send(router, rid, &m, NULL, 0);
}

void rp_anchor(dcast_msg *chunk, dcast_msg *commit, dcast_range_digest *d, const char *model,
	       uint64_t version, const uint16_t *w)
{
	dcast_chunk *k = &chunk->u.chunk;
	dcast_commit *m = &commit->u.commit;

	dcast_msg_init(chunk, DCAST_MSG_CHUNK);
	snprintf(k->model, sizeof(k->model), "%s", model);
	k->version = version, k->base_version = DCAST_VERSION_NONE, k->anchor = 1;
	k->count = k->changed = CFC_ELEMS, k->elem_size = 2;
	k->encoding = DCAST_ENC_DENSE, k->payload_bytes = CFC_ELEMS * 2;
	dcast_chunk_seal(k, w);
	*d = (dcast_range_digest){0, 0, CFC_ELEMS, 0};
	REQUIRE(dcast_ldigest(0, 0, w, CFC_ELEMS, 2, &d->digest) == 0);
	dcast_msg_init(commit, DCAST_MSG_COMMIT);
	snprintf(m->model, sizeof(m->model), "%s", model);
	m->version = version, m->base_version = DCAST_VERSION_NONE, m->anchor = 1;
	m->parts = 1, m->chunks = 1, m->bytes = CFC_ELEMS * 2;
	m->n_digests = 1;
	m->digests = d;
}
