/* A relay's anchor over its upstream's bulk connection (docs/protocol.md,
 * "Bulk anchors"), the connection's side: the relay's HELLO says x-bulk,
 * the upstream answers a committed anchor with BULK, and this file
 * connects to the upstream's host at the port it names and reads the
 * version's CHUNK and COMMIT frames (schema/bulkrx.c) beside the DEALER,
 * a whole frame at a time, for relay.c to take as it takes one that came
 * over ZeroMQ.  TCP's flow control holds the upstream back while the
 * loop is busy. */
#include <inttypes.h>
#include <string.h>
#include "broker.h"
#include "dcast_common.h"

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

int broker_relay_bulk_start(struct broker *b, struct broker_upstream *u, const dcast_bulk *m,
			    broker_fd_fn fn)
{
	int rc;

	if (!broker_relay_bulk_wanted(u) || dcast_bulkrx_active(&u->bulk))
		return dcast_fail(DCAST_ESTATE, "BULK of version %" PRIu64 " not asked for (%s)", m->version,
				  dcast_bulkrx_active(&u->bulk) ? "a bulk transfer is under way"
								 : "HELLO without x-bulk");
	if ((rc = dcast_bulkrx_start(&u->bulk, &u->bulk_addr, u->bulk_addr_len, m, b->cfg.upstream)) ||
	    (rc = broker_poll_add(b, u->bulk.fd, fn, u))) {
		dcast_bulkrx_close(&u->bulk);
		return rc;
	}
	broker_poll_events(b, u->bulk.fd, ZMQ_POLLOUT);
	u->bulk_last_ms = dcast_now_ms();
	u->bulk_held_until = b->cfg.fault_relay_bulk_hold_ms ? u->bulk_last_ms + b->cfg.fault_relay_bulk_hold_ms : 0;
	DCAST_LOG_I("relay %s: version %" PRIu64 " over a bulk connection to port %u%s (%u chunks, %"
		    PRIu64 " bytes)", u->model->name, m->version, m->port,
		    u->bulk.local ? ", by its unix socket" : "", m->chunks, m->bytes);
	return 0;
}

/* Bytes moved: the transfer and the upstream are alive. */
static void moved(struct broker_upstream *u, uint64_t n)
{
	if (n)
		u->bulk_last_ms = u->last_recv_ms = dcast_now_ms();
}

/* One recv into the frame being read: its prefix, header, or payload
 * (into a buffer of its own once the header is checked: a recycled one
 * with a data dir, where the payload goes to the version's spill file and
 * its buffer is freed, else one the log keeps); *n bytes came. */
static int read_step(const struct broker *b, struct broker_upstream *u, uint64_t *n)
{
	dcast_bulkrx *r = &u->bulk;
	int err;

	if (!dcast_bulkrx_head_done(r)) {
		if (!(err = dcast_bulkrx_head_step(r, n)) && dcast_bulkrx_head_done(r))
			err = b->cfg.data_dir ? dcast_bulkrx_payload_buffer(r) : dcast_bulkrx_payload_kept(r, &u->model->slab);
	} else {
		err = dcast_bulkrx_take_payload(r, (char *)zmq_msg_data(&r->payload) + r->payload_got,
					r->payload_len - r->payload_got, n);
		r->payload_got += *n;
	}
	moved(u, *n);
	return err;
}

/* The test fault relay_bulk_hold: once open, the connection is not read
 * until the hold is over (broker_relay_bulk_quiet polls it again). */
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

int broker_relay_bulk_read(struct broker *b, struct broker_upstream *u, dcast_wire_in *in, int *got)
{
	dcast_bulkrx *r = &u->bulk;
	uint64_t n = 1;
	int open, err;

	*got = 0;
	if ((err = dcast_bulkrx_open_step(r, &open)) || !open || held(b, u))
		return err;
	broker_poll_events(b, r->fd, ZMQ_POLLIN);
	while (!err && n && !dcast_bulkrx_whole(r))
		err = read_step(b, u, &n);
	if (!r->connected) /* the unix socket refused it: TCP's connect first */
		broker_poll_events(b, r->fd, ZMQ_POLLOUT);
	if (err || !dcast_bulkrx_whole(r))
		return err;
	zmq_msg_close(&in->payload);
	dcast_bulkrx_finish(r, in);
	*got = 1;
	if (in->msg.type == DCAST_MSG_CHUNK && b->cfg.fault_relay_bulk_cut &&
	    r->frames >= b->cfg.fault_relay_bulk_cut)
		return dcast_fail(DCAST_EIO, "the connection was cut after %" PRIu64 " frames (test fault "
				  "relay_bulk_cut)", r->frames);
	return 0;
}

int broker_relay_bulk_quiet(struct broker *b, struct broker_upstream *u, uint64_t now_ms)
{
	uint64_t limit = dcast_bulkrx_quiet_limit(&u->bulk, b->cfg.heartbeat_ms);

	if (dcast_bulkrx_active(&u->bulk) && u->bulk_held_until && now_ms >= u->bulk_held_until)
		broker_poll_events(b, u->bulk.fd, ZMQ_POLLIN); /* the hold is over: the loop reads */
	if (!dcast_bulkrx_active(&u->bulk) || now_ms - u->bulk_last_ms <= limit)
		return 0;
	dcast_bulkrx_quiet_fail(&u->bulk, now_ms - u->bulk_last_ms);
	return 1;
}
