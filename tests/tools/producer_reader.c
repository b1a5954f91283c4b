/* producer_reader: a minimal consumer for the producer's tests, built on the
 * wire helpers only (so it checks the producer against the protocol, not
 * against the consumer library).  It joins a broker's consumer endpoint,
 * applies every version it is sent to host tensors (checksums verified,
 * ranges checked, digests of every COMMIT compared), and once it has applied
 * --until V writes the tensors as a safetensors file and exits 0.
 *
 * usage: producer_reader --endpoint E --model M --until V --out FILE
 *                        [--timeout-ms N]            exit 0 ok, 1 error */
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include "dcast_common.h"
#include "dcast_wire.h"
#include "deltacast/codec.h"
#include "deltacast/safetensors.h"

typedef struct reader {
	void *ctx, *sock;
	const char *model;
	dcast_tensor_desc *desc;
	unsigned char **data;
	uint32_t n;
	uint64_t applied, staged_version, chunks;
} reader;

static int die(const char *what)
{
	fprintf(stderr, "producer_reader: %s: %s\n", what, dcast_last_error());
	return 1;
}

static void send_msg(reader *r, dcast_msg *m)
{
	dcast_wire_send(r->sock, NULL, 0, m, NULL, 0);
}

static int on_manifest(reader *r, const dcast_manifest *mf)
{
	if (r->desc)
		return 0; /* same model, same manifest: the producer checks shapes */
	r->n = mf->n_tensors;
	r->desc = calloc(r->n + 1, sizeof(*r->desc));
	r->data = calloc(r->n + 1, sizeof(*r->data));
	for (uint32_t i = 0; i < r->n; i++) {
		r->desc[i] = mf->tensors[i];
		r->data[i] = calloc(dcast_tensor_elems(&r->desc[i]) + 1,
				    dcast_dtype_size((int)r->desc[i].dtype));
	}
	return 0;
}

static int on_chunk(reader *r, const dcast_chunk *c, const void *payload)
{
	dcast_chunk_info info = {c->encoding, c->elem_size, c->count, c->changed, c->payload_bytes};
	dcast_msg cr;
	int rc;

	if ((rc = dcast_chunk_verify(c, payload)))
		return rc;
	if (!r->desc || c->tensor >= r->n)
		return dcast_fail(DCAST_ECORRUPT, "chunk for tensor %u, manifest has %u", c->tensor, r->n);
	if (c->elem_size != dcast_dtype_size((int)r->desc[c->tensor].dtype) ||
	    c->start + c->count > dcast_tensor_elems(&r->desc[c->tensor]))
		return dcast_fail(DCAST_ECORRUPT, "chunk range/elem size outside tensor %u", c->tensor);
	if (!c->anchor && c->base_version != r->applied)
		return dcast_fail(DCAST_EGAP, "delta on %" PRIu64 ", have %" PRIu64, c->base_version,
				  r->applied);
	if ((rc = dcast_codec_apply(&info, payload, r->data[c->tensor] + c->start * c->elem_size,
				    NULL)))
		return rc;
	r->chunks++;
	dcast_msg_init(&cr, DCAST_MSG_CREDIT);
	cr.u.credit.bytes = c->payload_bytes ? c->payload_bytes : 1;
	send_msg(r, &cr);
	return 0;
}

static int on_commit(reader *r, const dcast_commit *c)
{
	dcast_msg ack;

	if (c->chunks != r->chunks)
		return dcast_fail(DCAST_ECORRUPT, "COMMIT %" PRIu64 " says %u chunks, got %" PRIu64,
				  c->version, c->chunks, r->chunks);
	for (uint32_t i = 0; i < c->n_digests; i++) {
		const dcast_range_digest *d = &c->digests[i];
		uint64_t got = 0;
		unsigned es;

		if (d->tensor >= r->n)
			return dcast_fail(DCAST_ECORRUPT, "digest of tensor %u", d->tensor);
		es = dcast_dtype_size((int)r->desc[d->tensor].dtype);
		if (dcast_ldigest(d->tensor, d->start, r->data[d->tensor] + d->start * es, d->count, es, &got) ||
		    got != d->digest)
			return dcast_fail(DCAST_EDIGEST, "version %" PRIu64 ": digest of %s [%" PRIu64
					  ", +%" PRIu64 ") differs", c->version,
					  r->desc[d->tensor].name, d->start, d->count);
	}
	r->applied = c->version;
	r->chunks = 0;
	dcast_msg_init(&ack, DCAST_MSG_ACK);
	snprintf(ack.u.ack.model, sizeof(ack.u.ack.model), "%s", r->model);
	ack.u.ack.version = c->version;
	send_msg(r, &ack);
	printf("applied version %" PRIu64 " (%s, %u digests ok)\n", c->version,
	       c->anchor ? "anchor" : "delta", c->n_digests);
	return 0;
}

static int handle(reader *r, dcast_wire_in *in)
{
	const dcast_msg *m = &in->msg;

	switch (m->type) {
	case DCAST_MSG_MANIFEST:
		return on_manifest(r, &m->u.manifest);
	case DCAST_MSG_CHUNK:
		return on_chunk(r, &m->u.chunk, zmq_msg_data(&in->payload));
	case DCAST_MSG_COMMIT:
		return on_commit(r, &m->u.commit);
	case DCAST_MSG_ERROR:
		return dcast_fail((int)m->u.error.code, "broker ERROR: %s", m->u.error.text);
	default:
		return 0;
	}
}

static int write_out(reader *r, const char *path)
{
	dcast_st_spec *s = calloc(r->n + 1, sizeof(*s));
	int rc;

	for (uint32_t i = 0; i < r->n; i++) {
		const char *dn = dcast_dtype_name((int)r->desc[i].dtype);
		s[i].name = r->desc[i].name;
		s[i].dtype = dcast_st_dtype_from_name(dn, strlen(dn));
		s[i].ndim = r->desc[i].ndim;
		memcpy(s[i].shape, r->desc[i].shape, sizeof(s[i].shape));
		s[i].data = r->data[i];
	}
	rc = dcast_st_write(path, s, r->n, NULL, 0);
	free(s);
	return rc;
}

static int run(reader *r, const char *endpoint, uint64_t until, int timeout_ms)
{
	uint64_t deadline = dcast_now_ms() + (uint64_t)timeout_ms;
	dcast_msg h;

	r->ctx = zmq_ctx_new();
	r->sock = zmq_socket(r->ctx, ZMQ_DEALER);
	dcast_wire_socket_opts(r->sock);
	if (zmq_connect(r->sock, endpoint))
		return dcast_fail(DCAST_EZMQ, "connect %s", endpoint);
	dcast_msg_init(&h, DCAST_MSG_HELLO);
	h.u.hello.role = DCAST_ROLE_CONSUMER;
	snprintf(h.u.hello.model, sizeof(h.u.hello.model), "%s", r->model);
	h.u.hello.window_bytes = 1ull << 30;
	snprintf(h.u.hello.client, sizeof(h.u.hello.client), "producer_reader");
	send_msg(r, &h);
	while (r->applied == DCAST_VERSION_NONE || r->applied < until) {
		zmq_pollitem_t it = {r->sock, 0, ZMQ_POLLIN, 0};
		dcast_wire_in in;
		int rc;

		if (dcast_now_ms() > deadline)
			return dcast_fail(DCAST_ETIMEDOUT, "version %" PRIu64 " not applied in %d ms",
					  until, timeout_ms);
		if (zmq_poll(&it, 1, 100) <= 0)
			continue;
		rc = dcast_wire_recv(r->sock, 0, &in, 0);
		if (!rc)
			rc = handle(r, &in);
		dcast_wire_in_close(&in);
		if (rc)
			return rc;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"endpoint", 1, 0, 'e'}, {"model", 1, 0, 'm'},
					     {"until", 1, 0, 'u'},    {"out", 1, 0, 'o'},
					     {"timeout-ms", 1, 0, 't'}, {0, 0, 0, 0}};
	const char *endpoint = NULL, *out = NULL;
	reader r = {.applied = DCAST_VERSION_NONE};
	uint64_t until = 0;
	int timeout_ms = 30000, c, rc;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 'e') endpoint = optarg;
		else if (c == 'm') r.model = optarg;
		else if (c == 'u') until = strtoull(optarg, NULL, 10);
		else if (c == 'o') out = optarg;
		else if (c == 't') timeout_ms = atoi(optarg);
		else return 2;
	}
	if (!endpoint || !r.model || !out) {
		fprintf(stderr, "usage: producer_reader --endpoint E --model M --until V --out FILE\n");
		return 2;
	}
	rc = run(&r, endpoint, until, timeout_ms);
	if (!rc)
		rc = write_out(&r, out);
	for (uint32_t i = 0; i < r.n; i++)
		free(r.data[i]);
	free(r.data);
	free(r.desc);
	if (r.sock)
		zmq_close(r.sock);
	if (r.ctx)
		zmq_ctx_term(r.ctx);
	return rc ? die("failed") : 0;
}
