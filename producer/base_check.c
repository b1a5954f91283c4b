/* A baseline the caller holds (the checkpoint it published last, say) is
 * checked against the broker's newest version before it is trusted: its
 * digests must equal those of the broker's COMMIT of that version.  The
 * COMMIT is read on a consumer connection of our own that asks for the
 * deltas after the log's anchor (or the anchor itself, when the newest
 * version is one) and drops their payloads as they come, crediting them
 * back; only the digests are kept.  The wire rules: docs/protocol.md,
 * "Consumer and broker". */
#include <errno.h>
#include <string.h>
#include "producer_shared.h"

#define CHECK_WINDOW_BYTES (64ull << 20) /* a broker-made anchor's chunks: 4 MiB */
#define CHECK_POLL_MS 100

/* The COMMIT being waited for, once it came. */
typedef struct check_read {
	void *sock;
	uint64_t want;
	dcast_range_digest *digests;
	uint32_t n_digests;
	int done;
} check_read;

static int check_open(const dcast_producer *p, const char *endpoint, check_read *r)
{
	int rc;

	if (!(r->sock = zmq_socket(p->zctx, ZMQ_DEALER)))
		return dcast_fail(DCAST_EZMQ, "adopt_baseline: zmq_socket: %s", zmq_strerror(errno));
	if ((rc = dcast_wire_socket_opts(r->sock)) || (rc = prod_conn_curve(p, r->sock)))
		return rc;
	if (zmq_connect(r->sock, endpoint))
		return dcast_fail(DCAST_EINVAL, "adopt_baseline: cannot connect to \"%s\": %s",
				  endpoint, zmq_strerror(errno));
	return 0;
}

/* The deltas after the log's anchor carry the newest version's COMMIT at
 * O(changed); when the newest version is the anchor, only it does. */
static int check_hello(const dcast_producer *p, check_read *r)
{
	uint64_t anchor = p->conn.anchor_version;
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_HELLO);
	m.u.hello.role = DCAST_ROLE_CONSUMER;
	memcpy(m.u.hello.model, p->model, sizeof(p->model));
	m.u.hello.parts = 1;
	m.u.hello.have_version = anchor == r->want ? DCAST_VERSION_NONE : anchor;
	m.u.hello.window_bytes = CHECK_WINDOW_BYTES;
	snprintf(m.u.hello.client, sizeof(m.u.hello.client), "%.55s-check",
		 p->client[0] ? p->client : "producer");
	return dcast_wire_send(r->sock, NULL, 0, &m, NULL, 0);
}

static int check_welcome(const dcast_producer *p, const check_read *r, const dcast_welcome *w)
{
	if (w->version != r->want)
		return dcast_fail(DCAST_ESTATE, "adopt_baseline: the broker now serves version %lld, "
				  "not %llu", (long long)w->version, (unsigned long long)r->want);
	if (p->conn.run && w->run && w->run != p->conn.run)
		return dcast_fail(DCAST_ESTATE, "adopt_baseline: the consumer endpoint serves run "
				  "%llx, the producer endpoint run %llx: another broker?",
				  (unsigned long long)w->run, (unsigned long long)p->conn.run);
	return 0;
}

static int check_manifest(const dcast_producer *p, const dcast_manifest *m)
{
	int rc = prod_tensor_count_matches(p, m->n_tensors, "adopt_baseline");

	for (uint32_t i = 0; i < p->n_tensors && !rc; i++)
		rc = prod_tensor_matches(p, i, &m->tensors[i], "adopt_baseline");
	return rc;
}

/* A payload is dropped: its credit goes back at once. */
static int check_credit(check_read *r, uint64_t bytes)
{
	dcast_msg m;

	if (!bytes)
		return 0;
	dcast_msg_init(&m, DCAST_MSG_CREDIT);
	m.u.credit.bytes = bytes;
	return dcast_wire_send(r->sock, NULL, 0, &m, NULL, 0);
}

static int check_commit(check_read *r, dcast_commit *c)
{
	if (c->version > r->want)
		return dcast_fail(DCAST_ESTATE, "adopt_baseline: the broker served version %llu "
				  "before %llu's COMMIT", (unsigned long long)c->version,
				  (unsigned long long)r->want);
	if (c->version < r->want)
		return 0;
	r->digests = c->digests; /* taken from the message */
	r->n_digests = c->n_digests;
	c->digests = NULL;
	c->n_digests = 0;
	r->done = 1;
	return 0;
}

static int check_step(const dcast_producer *p, check_read *r, dcast_msg *m)
{
	switch (m->type) {
	case DCAST_MSG_WELCOME:
		return check_welcome(p, r, &m->u.welcome);
	case DCAST_MSG_MANIFEST:
		return check_manifest(p, &m->u.manifest);
	case DCAST_MSG_CHUNK:
		return check_credit(r, m->u.chunk.payload_bytes);
	case DCAST_MSG_COMMIT:
		return check_commit(r, &m->u.commit);
	case DCAST_MSG_ERROR:
		return dcast_fail((int)m->u.error.code, "adopt_baseline: the broker: %s",
				  m->u.error.text);
	default:
		return 0;
	}
}

/* Messages until the wanted COMMIT came, or the deadline. */
static int check_read_all(const dcast_producer *p, check_read *r, int timeout_ms)
{
	uint64_t deadline = dcast_now_ms() + (uint64_t)(timeout_ms < 0 ? INT32_MAX : timeout_ms);
	int rc = 0;

	while (!rc && !r->done) {
		zmq_pollitem_t it = {r->sock, 0, ZMQ_POLLIN, 0};
		dcast_wire_in in;

		if (dcast_now_ms() >= deadline)
			return dcast_fail(DCAST_ETIMEDOUT, "adopt_baseline: no COMMIT of version %llu "
					  "from the broker within %d ms", (unsigned long long)r->want,
					  timeout_ms);
		if (zmq_poll(&it, 1, CHECK_POLL_MS) < 0 && errno != EINTR)
			return dcast_fail(DCAST_EZMQ, "adopt_baseline: zmq_poll: %s", zmq_strerror(errno));
		if (!(it.revents & ZMQ_POLLIN))
			continue;
		rc = dcast_wire_recv(r->sock, 0, &in, ZMQ_DONTWAIT);
		if (rc == DCAST_EBUSY)
			rc = 0;
		else if (!rc)
			rc = check_step(p, r, &in.msg);
		dcast_wire_in_close(&in);
	}
	return rc;
}

/* Each broker digest range inside this part's shard of its tensor is
 * computed over the caller's copy; every element of the shard must be
 * covered. */
static int check_digests(const dcast_producer *p, const check_read *r,
			 const void *const *bases, uint64_t *covered)
{
	for (uint32_t k = 0; k < r->n_digests; k++) {
		const dcast_range_digest *d = &r->digests[k];
		const prod_tensor *t;
		uint64_t got;
		int rc;

		if (d->tensor >= p->n_tensors)
			return dcast_fail(DCAST_ECORRUPT, "adopt_baseline: a digest names tensor %u of "
					  "%u", d->tensor, p->n_tensors);
		t = &p->tensors[d->tensor];
		if (d->start < t->shard_off || d->start + d->count > t->shard_off + t->shard_count)
			continue; /* another part's range */
		if ((rc = dcast_ldigest(d->tensor, d->start, (const unsigned char *)bases[d->tensor] +
					(d->start - t->shard_off) * t->elem_size, d->count,
					t->elem_size, &got)))
			return rc;
		if (got != d->digest)
			return dcast_fail(DCAST_EDIGEST, "adopt_baseline: tensor %s elements [%llu, "
					  "+%llu) differ from the broker's version %llu", t->desc.name,
					  (unsigned long long)d->start, (unsigned long long)d->count,
					  (unsigned long long)r->want);
		covered[d->tensor] += d->count;
	}
	return 0;
}

static int check_covered(const dcast_producer *p, const uint64_t *covered)
{
	for (uint32_t i = 0; i < p->n_tensors; i++)
		if (covered[i] != p->tensors[i].shard_count)
			return dcast_fail(DCAST_ESTATE, "adopt_baseline: the broker's digests cover %llu "
					  "of this part's %llu elements of %s (its parts or ranges "
					  "differ from this producer's): publish an anchor",
					  (unsigned long long)covered[i],
					  (unsigned long long)p->tensors[i].shard_count,
					  p->tensors[i].desc.name);
	return 0;
}

static int check_against(dcast_producer *p, const char *endpoint, const void *const *bases,
			 uint64_t version, int timeout_ms)
{
	check_read r = {.want = version};
	uint64_t *covered = calloc(p->n_tensors, sizeof(*covered));
	int rc;

	if (!covered)
		return dcast_fail(DCAST_ENOMEM, "adopt_baseline: out of memory");
	if (!(rc = check_open(p, endpoint, &r)) && !(rc = check_hello(p, &r)) &&
	    !(rc = check_read_all(p, &r, timeout_ms)) && !(rc = check_digests(p, &r, bases, covered)))
		rc = check_covered(p, covered);
	if (r.sock)
		zmq_close(r.sock);
	free(r.digests);
	free(covered);
	return rc;
}

static int check_args(const dcast_producer *p, const char *endpoint, const void *const *bases,
		      uint32_t n)
{
	if (!p || (endpoint && !*endpoint) || (n && !bases))
		return dcast_fail(DCAST_EINVAL, "adopt_baseline: NULL producer or bases, or an empty "
				  "endpoint");
	if (p->last_version != DCAST_VERSION_NONE || p->pending_version != DCAST_VERSION_NONE)
		return dcast_fail(DCAST_ESTATE, "adopt_baseline: only before the first publish");
	if (n != p->n_tensors)
		return dcast_fail(DCAST_EINVAL, "adopt_baseline: %u bases for %u registered tensors",
				  n, p->n_tensors);
	for (uint32_t i = 0; i < n; i++)
		if (!bases[i] && p->tensors[i].shard_count)
			return dcast_fail(DCAST_EINVAL, "adopt_baseline: no base for tensor %s",
					  p->tensors[i].desc.name);
	return 0;
}

int dcast_producer_adopt_baseline(dcast_producer *p, const char *consumer_endpoint,
				  const void *const *bases, uint32_t n, int timeout_ms)
{
	uint64_t version;
	char ep[PROD_ENDPOINT_MAX];
	int rc;

	if ((rc = check_args(p, consumer_endpoint, bases, n)) || (rc = prod_freeze(p)))
		return rc;
	version = p->conn.broker_version;
	if (version == DCAST_VERSION_NONE || p->conn.need_anchor)
		return dcast_fail(DCAST_ENOTFOUND, "adopt_baseline: the broker holds no version of %s "
				  "to check the baseline against%s", p->model,
				  p->conn.need_anchor ? " (it asks for an anchor)" : "");
	if ((rc = prod_consumer_endpoint(p, consumer_endpoint, ep, sizeof(ep), "adopt_baseline")) ||
	    (rc = check_against(p, ep, bases, version, timeout_ms)))
		return rc;
	prod_baseline_dropped(p);
	for (uint32_t i = 0; i < n && !rc; i++)
		rc = prod_base_fill(p, i, bases[i]);
	if (rc)
		return rc;
	prod_baseline_adopted(p, version);
	DCAST_LOG_I("producer %s part %u: baseline is the caller's copy of version %llu, checked "
		    "against the broker's digests", p->model, p->part, (unsigned long long)version);
	return 0;
}
