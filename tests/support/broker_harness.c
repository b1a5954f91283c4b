/* The broker tests' harness (tests/broker_harness.h, which documents each
 * function): a raw producer and consumer on DEALER sockets speaking the
 * wire protocol, their tensors in memory. */
#include "../broker_harness.h"

void *h_ctx;

void h_init(void)
{
	tp_install();
	h_ctx = zmq_ctx_new();
	REQUIRE(h_ctx);
}

int h_finish(tp_broker *br, const char *dir, const char *name)
{
	tp_broker_kill(br, SIGTERM);
	zmq_ctx_term(h_ctx);
	if (check_failures)
		fprintf(stderr, "broker log: %s\n", br->log);
	check_remove_dir(dir);
	return check_done(name);
}

int h_dup_seq = -1;

uint64_t h_ldigest(uint32_t t, uint64_t start, const uint16_t *data, uint64_t count)
{
	uint64_t d = 0;
	REQUIRE(dcast_ldigest(t, start, data, count, 2, &d) == DCAST_OK);
	return d;
}

void h_client_socket(struct h_client *c, const char *model)
{
	int ms = 100;

	memset(c, 0, sizeof(*c));
	c->model = model;
	c->version = c->last_ack = DCAST_VERSION_NONE;
	c->sock = zmq_socket(h_ctx, ZMQ_DEALER);
	REQUIRE(c->sock);
	dcast_wire_socket_opts(c->sock);
	zmq_setsockopt(c->sock, ZMQ_RCVTIMEO, &ms, sizeof(ms));
}

void h_client_connect(struct h_client *c, int port)
{
	char ep[64];

	snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", port);
	REQUIRE(zmq_connect(c->sock, ep) == 0);
}

void h_client_open_curve(struct h_client *c, int port, const char *model,
			 const char *server_pub, const char *secret_file)
{
	h_client_socket(c, model);
	if (server_pub)
		REQUIRE(dcast_curve_client_setup(c->sock, server_pub, secret_file) == 0);
	h_client_connect(c, port);
}

void h_client_open(struct h_client *c, int port, const char *model)
{
	h_client_open_curve(c, port, model, NULL, NULL);
}

void h_client_close(struct h_client *c)
{
	int zero = 0;

	if (c->sock) {
		zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof(zero));
		zmq_close(c->sock);
	}
	c->sock = NULL;
}

int h_send(struct h_client *c, const dcast_msg *m, zmq_msg_t *payload)
{
	return dcast_wire_send(c->sock, NULL, 0, m, payload, 0);
}

void h_hello(struct h_client *c, int role, uint64_t have)
{
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_HELLO);
	m.u.hello.role = (uint32_t)role;
	snprintf(m.u.hello.model, sizeof(m.u.hello.model), "%s", c->model);
	m.u.hello.have_version = have;
	m.u.hello.window_bytes = role == DCAST_ROLE_CONSUMER ? (1ull << 30) : 0;
	snprintf(m.u.hello.client, sizeof(m.u.hello.client), "test-%d", (int)getpid());
	REQUIRE(h_send(c, &m, NULL) == 0);
}

void h_fill_manifest(const char *model, dcast_msg *m, dcast_tensor_desc *t)
{
	dcast_msg_init(m, DCAST_MSG_MANIFEST);
	snprintf(m->u.manifest.model, sizeof(m->u.manifest.model), "%s", model);
	for (int i = 0; i < H_TENSORS; i++) {
		memset(&t[i], 0, sizeof(t[i]));
		snprintf(t[i].name, sizeof(t[i].name), "layer%d.weight", i);
		t[i].dtype = DCAST_DTYPE_BF16;
		t[i].ndim = 2;
		t[i].shape[0] = 256;
		t[i].shape[1] = H_ELEMS / 256;
	}
	m->u.manifest.n_tensors = H_TENSORS;
	m->u.manifest.tensors = t;
}

void h_consumer_handle(struct h_client *c, dcast_wire_in *in)
{
	dcast_msg *m = &in->msg;

	if (m->type == DCAST_MSG_WELCOME) {
		c->welcomed = 1;
		c->welcome_version = m->u.welcome.version;
		c->open_chunks = c->open_bytes = 0; /* a new stream */
	} else if (m->type == DCAST_MSG_MANIFEST) {
		c->manifest_seen = 1;
	} else if (m->type == DCAST_MSG_CHUNK) {
		dcast_chunk *ch = &m->u.chunk;
		dcast_chunk_info info = {ch->encoding, ch->elem_size, ch->count, ch->changed,
					 ch->payload_bytes};
		void *p = zmq_msg_data(&in->payload);

		if (ch->tensor >= H_TENSORS || ch->start + ch->count > H_ELEMS ||
		    dcast_chunk_verify(ch, p) || dcast_codec_apply(&info, p, &c->state[ch->tensor][ch->start], NULL))
			c->errors++;
		c->open_chunks++;
		c->open_bytes += ch->payload_bytes;
	} else if (m->type == DCAST_MSG_COMMIT) {
		dcast_commit *cm = &m->u.commit;

		c->commit_mismatch += cm->chunks != c->open_chunks || cm->bytes != c->open_bytes;
		c->open_chunks = c->open_bytes = 0;

		for (uint32_t i = 0; i < cm->n_digests; i++) {
			dcast_range_digest *d = &cm->digests[i];

			if (d->tensor >= H_TENSORS || d->start + d->count > H_ELEMS ||
			    h_ldigest(d->tensor, d->start, &c->state[d->tensor][d->start], d->count) != d->digest)
				c->digest_mismatch++;
		}
		c->version = cm->version;
		c->commits++;
		c->anchors += cm->anchor;
	} else if (m->type == DCAST_MSG_ERROR) {
		c->last_error_code = m->u.error.code;
	}
}

void h_producer_handle(struct h_client *c, dcast_wire_in *in)
{
	dcast_msg *m = &in->msg;

	if (m->type == DCAST_MSG_WELCOME) {
		c->welcomed = 1;
		c->welcome_version = m->u.welcome.version;
	} else if (m->type == DCAST_MSG_ACK) {
		c->last_ack = m->u.ack.version;
	} else if (m->type == DCAST_MSG_ERROR) {
		c->last_error_code = m->u.error.code;
		c->errors++;
	}
}

int h_pump(struct h_client *c, int consumer, int (*done)(struct h_client *), int rounds)
{
	int idle = 0;

	for (long total = 0; !done(c) && idle < rounds && total < 1000000; total++) {
		dcast_wire_in in;

		if (dcast_wire_recv(c->sock, 0, &in, 0) == 0) {
			if (consumer)
				h_consumer_handle(c, &in);
			else
				h_producer_handle(c, &in);
			idle = 0;
		} else {
			idle++;
		}
		dcast_wire_in_close(&in);
	}
	return done(c);
}

int h_done_welcomed(struct h_client *c)
{
	return c->welcomed;
}

uint64_t h_want;

int h_done_acked(struct h_client *c)
{
	return c->last_ack != DCAST_VERSION_NONE && c->last_ack >= h_want;
}

int h_done_version(struct h_client *c)
{
	return c->version != DCAST_VERSION_NONE && c->version >= h_want;
}

int h_done_error(struct h_client *c)
{
	return c->last_error_code != 0;
}

int h_producer_join(struct h_client *c)
{
	dcast_tensor_desc t[H_TENSORS];
	dcast_msg m;

	h_hello(c, DCAST_ROLE_PRODUCER, DCAST_VERSION_NONE);
	if (!h_pump(c, 0, h_done_welcomed, 50))
		return -1;
	h_fill_manifest(c->model, &m, t);
	return h_send(c, &m, NULL);
}

void h_mutate(struct h_client *c, uint32_t *rng, unsigned frac)
{
	for (int t = 0; t < H_TENSORS; t++)
		for (int i = 0; i < H_ELEMS; i++) {
			*rng = *rng * 1664525u + 1013904223u;
			if ((*rng >> 8) % frac == 0)
				c->state[t][i] = (uint16_t)(*rng >> 16);
		}
}

int h_client_publish(struct h_client *c, uint64_t version, int anchor, int rounds)
{
	static uint8_t out[H_CHUNK_ELEMS * 8 + 4096];
	dcast_range_digest dg[H_TENSORS];
	uint32_t seq = 0;
	uint64_t bytes = 0;
	dcast_msg m;

	for (int t = 0; t < H_TENSORS; t++)
		for (uint32_t s = 0; s < H_ELEMS; s += H_CHUNK_ELEMS) {
			dcast_chunk_info info;
			zmq_msg_t pl;

			REQUIRE(dcast_codec_encode(&c->state[t][s], anchor ? NULL : &c->base[t][s],
						   H_CHUNK_ELEMS, 2, -1, DCAST_ENCODE_UPDATE_BASE,
						   out, sizeof(out), &info) == 0);
			dcast_msg_init(&m, DCAST_MSG_CHUNK);
			dcast_chunk *ch = &m.u.chunk;
			snprintf(ch->model, sizeof(ch->model), "%s", c->model);
			ch->version = version;
			ch->base_version = anchor ? DCAST_VERSION_NONE : c->version;
			ch->anchor = (uint32_t)anchor;
			ch->seq = seq++;
			ch->tensor = (uint32_t)t;
			ch->start = s;
			ch->count = H_CHUNK_ELEMS;
			ch->elem_size = 2;
			ch->encoding = info.encoding;
			ch->changed = info.changed;
			ch->payload_bytes = info.payload_bytes;
			dcast_chunk_seal(ch, out);
			REQUIRE(zmq_msg_init_size(&pl, info.payload_bytes) == 0);
			memcpy(zmq_msg_data(&pl), out, info.payload_bytes);
			if (ch->seq == (uint32_t)h_dup_seq) { /* a repeat, as after a resend */
				zmq_msg_t again;
				REQUIRE(zmq_msg_init(&again) == 0 && zmq_msg_copy(&again, &pl) == 0);
				REQUIRE(h_send(c, &m, &again) == 0);
			}
			REQUIRE(h_send(c, &m, &pl) == 0);
			bytes += info.payload_bytes;
		}
	if (anchor)
		memcpy(c->base, c->state, sizeof(c->state));
	dcast_msg_init(&m, DCAST_MSG_COMMIT);
	snprintf(m.u.commit.model, sizeof(m.u.commit.model), "%s", c->model);
	m.u.commit.version = version;
	m.u.commit.base_version = anchor ? DCAST_VERSION_NONE : c->version;
	m.u.commit.anchor = (uint32_t)anchor;
	m.u.commit.chunks = seq;
	m.u.commit.bytes = bytes;
	for (int t = 0; t < H_TENSORS; t++)
		dg[t] = (dcast_range_digest){(uint32_t)t, 0, H_ELEMS,
					     h_ldigest((uint32_t)t, 0, c->state[t], H_ELEMS)};
	m.u.commit.n_digests = H_TENSORS;
	m.u.commit.digests = dg;
	REQUIRE(h_send(c, &m, NULL) == 0);
	c->version = version;
	h_want = version;
	return h_pump(c, 0, h_done_acked, rounds) ? 0 : -1;
}

int h_consume_until(struct h_client *c, uint64_t have, uint64_t want, int rounds)
{
	h_hello(c, DCAST_ROLE_CONSUMER, have);
	h_want = want;
	return h_pump(c, 1, h_done_version, rounds) ? 0 : -1;
}
