/* A relay's anchor over its upstream's bulk connection (docs/protocol.md,
 * "Bulk anchors"), as a consumer takes one: the relay's HELLO says x-bulk,
 * the upstream answers a committed anchor with BULK, and the relay reads
 * the version's CHUNK and COMMIT frames from a plain TCP connection to the
 * upstream's host (common/bulkrx.c) beside its DEALER, each taken by the
 * same open-version checks as one that came over ZeroMQ
 * (broker_relay_frame).  No credit is granted for those bytes: TCP's flow
 * control holds the upstream back while the loop is busy.  The upstream
 * holds the relay's ZeroMQ stream meanwhile and goes on after the COMMIT. */
#include <inttypes.h>
#include <string.h>
#include "broker.h"
#include "dcast_common.h"

#define RELAY_BULK_QUIET_MIN_MS 30000 /* as the upstream's side (bulk.c, BULK_STALL_MIN_MS) */

void broker_relay_bulk_init(struct broker *b, struct broker_upstream *u)
{
	dcast_bulkrx_init(&u->bulk);
	u->bulk_addr_len = 0;
	u->bulk_off = 0;
	if (b->cfg.upstream_no_bulk || b->cfg.upstream_server_key)
		return;
	if (dcast_bulkrx_resolve(b->cfg.upstream, &u->bulk_addr, &u->bulk_addr_len))
		DCAST_LOG_W("relay %s: %s; anchors come over ZeroMQ", u->model ? u->model->name : "?",
			    dcast_last_error());
}

int broker_relay_bulk_wanted(const struct broker_upstream *u)
{
	return u->bulk_addr_len && !u->bulk_off;
}

void broker_relay_bulk_close(struct broker *b, struct broker_upstream *u)
{
	if (!dcast_bulkrx_active(&u->bulk))
		return;
	broker_poll_del(b, u->bulk.fd);
	dcast_bulkrx_close(&u->bulk);
}

/* The transfer failed (dcast_last_error() says why): counted, bulk off
 * until a COMMIT comes over ZeroMQ, and the relay joins again so. */
static void bulk_failed(struct broker *b, struct broker_upstream *u)
{
	char why[DCAST_MAX_TEXT + 96];

	snprintf(why, sizeof(why), "bulk transfer of version %" PRIu64 " failed: %s", u->bulk.version,
		 dcast_last_error());
	DCAST_LOG_W("relay %s: %s; bulk off until a version comes over ZeroMQ", u->model->name, why);
	b->stats.relay_bulk_failures++;
	u->bulk_off = 1;
	broker_relay_hello(b, u, why); /* closes the connection, drops what was open */
}

/* Bytes moved: the transfer and the upstream are alive. */
static void moved(struct broker_upstream *u, uint64_t n)
{
	if (n)
		u->bulk_last_ms = u->last_recv_ms = dcast_now_ms();
}

/* One recv into the frame being read: its prefix, header, or payload
 * (into a buffer of its own once the header is checked); *n bytes came. */
static int read_step(struct broker_upstream *u, uint64_t *n)
{
	dcast_bulkrx *r = &u->bulk;
	int err;

	if (!dcast_bulkrx_head_done(r)) {
		if (!(err = dcast_bulkrx_head_step(r, n)) && dcast_bulkrx_head_done(r))
			err = dcast_bulkrx_payload_buffer(r);
	} else {
		err = dcast_bulkrx_take(r, (char *)zmq_msg_data(&r->payload) + r->payload_got,
					r->payload_len - r->payload_got, n);
		r->payload_got += *n;
	}
	moved(u, *n);
	return err;
}

/* A whole frame taken; after the COMMIT's the transfer is over. */
static int frame_take(struct broker *b, struct broker_upstream *u)
{
	uint64_t version = u->bulk.version, bytes = u->bulk.payload_len;
	dcast_wire_in in;
	int rc, commit;

	dcast_bulkrx_finish(&u->bulk, &in);
	commit = in.msg.type == DCAST_MSG_COMMIT;
	rc = broker_relay_frame(b, u, &in);
	dcast_wire_in_close(&in);
	if (rc)
		return rc;
	b->stats.relay_bulk_bytes += bytes;
	if (!commit && b->cfg.fault_relay_bulk_cut && u->bulk.frames >= b->cfg.fault_relay_bulk_cut)
		return dcast_fail(DCAST_EIO, "the connection was cut after %" PRIu64 " frames (test fault "
				  "relay_bulk_cut)", u->bulk.frames);
	if (!commit)
		return 0;
	b->stats.relay_bulk_versions++;
	broker_relay_bulk_close(b, u);
	DCAST_LOG_I("relay %s: version %" PRIu64 " came over the bulk connection", u->model->name,
		    version);
	return 0;
}

/* Read what is there, at most a burst of frames. */
static int bulk_read(struct broker *b, struct broker_upstream *u)
{
	int rc = 0;

	for (int i = 0; i < BROKER_RECV_BURST && !rc && dcast_bulkrx_active(&u->bulk); i++) {
		uint64_t n = 1;
		while (!rc && n && !dcast_bulkrx_whole(&u->bulk))
			rc = read_step(u, &n);
		if (rc || !dcast_bulkrx_whole(&u->bulk))
			return rc;
		rc = frame_take(b, u);
	}
	return rc;
}

/* The test fault relay_bulk_hold: once open, the connection is not read
 * until the hold is over (broker_relay_bulk_timers polls it again). */
static int held(struct broker *b, struct broker_upstream *u)
{
	if (!u->bulk_held_until)
		return 0;
	if (dcast_now_ms() < u->bulk_held_until) {
		broker_poll_events(b, u->bulk.fd, 0);
		return 1;
	}
	u->bulk_held_until = 0;
	return 0;
}

static void on_bulk(struct broker *b, int fd, void *arg)
{
	struct broker_upstream *u = arg;
	int open, rc = dcast_bulkrx_open_step(&u->bulk, &open);

	(void)fd;
	if (!rc && open && !held(b, u)) {
		broker_poll_events(b, u->bulk.fd, ZMQ_POLLIN);
		rc = bulk_read(b, u);
	}
	if (rc)
		bulk_failed(b, u);
}

int broker_relay_bulk_start(struct broker *b, struct broker_upstream *u, const dcast_bulk *m)
{
	int rc;

	if (!broker_relay_bulk_wanted(u) || dcast_bulkrx_active(&u->bulk))
		return dcast_fail(DCAST_ESTATE, "BULK of version %" PRIu64 " not asked for (%s)", m->version,
				  dcast_bulkrx_active(&u->bulk) ? "a bulk transfer is under way"
								 : "HELLO without x-bulk");
	if ((rc = dcast_bulkrx_start(&u->bulk, &u->bulk_addr, u->bulk_addr_len, m, b->cfg.upstream)) ||
	    (rc = broker_poll_add(b, u->bulk.fd, on_bulk, u))) {
		dcast_bulkrx_close(&u->bulk);
		b->stats.relay_bulk_failures++;
		u->bulk_off = 1;
		return rc;
	}
	broker_poll_events(b, u->bulk.fd, ZMQ_POLLOUT);
	u->bulk_last_ms = dcast_now_ms();
	u->bulk_held_until = b->cfg.fault_relay_bulk_hold_ms ? u->bulk_last_ms + b->cfg.fault_relay_bulk_hold_ms : 0;
	DCAST_LOG_I("relay %s: version %" PRIu64 " over a bulk connection to port %u (%u chunks, %"
		    PRIu64 " bytes)", u->model->name, m->version, m->port, m->chunks, m->bytes);
	return 0;
}

void broker_relay_bulk_timers(struct broker *b, struct broker_upstream *u, uint64_t now_ms)
{
	uint64_t limit = 3 * b->cfg.heartbeat_ms;

	if (limit < RELAY_BULK_QUIET_MIN_MS)
		limit = RELAY_BULK_QUIET_MIN_MS;
	if (dcast_bulkrx_active(&u->bulk) && u->bulk_held_until && now_ms >= u->bulk_held_until)
		broker_poll_events(b, u->bulk.fd, ZMQ_POLLIN); /* the hold is over: on_bulk reads */
	if (!dcast_bulkrx_active(&u->bulk) || now_ms - u->bulk_last_ms <= limit)
		return;
	dcast_fail(DCAST_ETIMEDOUT, "no byte for %" PRIu64 " ms", now_ms - u->bulk_last_ms);
	bulk_failed(b, u);
}
