/* The broker's single-threaded event loop: zmq_poll over the producer and
 * consumer ROUTERs, the relay's upstream DEALERs and extra fds (eventfds,
 * the metrics and admin listeners and clients, main.c's signalfd), with a
 * timer for heartbeats, part timeouts and local clients' time.  Each
 * turn reads a bounded burst from each socket, grants producer credit,
 * then gives every consumer a bounded burst of sends. */
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include "broker.h"
#include "auth.h" /* CURVE: the ZAP thread, joined at close */
#include "dcast_common.h"
#include "dcast_wire.h"
#include "durable.h" /* --data-dir: the writer thread (broker/durable.c) */
#include "metrics.h" /* --metrics: the listener, opened and closed here */
#include "limits.h" /* accept failures watched (broker/limits.c) */
#include "admin.h" /* --admin-socket: the listener, opened and closed here */
#include "fold.h"  /* broker-made anchors: the work eventfd, closed here */
#include "bulk.h"  /* --bulk: the listener, opened and closed here */

#define MAX_POLL (2 + BROKER_MAX_UPSTREAM_MODELS + BROKER_MAX_EXTRA_FDS)

static int io_threads_set(struct broker *b)
{
	uint64_t n = broker_threads_auto(b->cfg.io_threads);

	if (zmq_ctx_set(b->ctx, ZMQ_IO_THREADS, (int)n))
		return dcast_fail(DCAST_EZMQ, "--io-threads %llu: %s", (unsigned long long)n,
				  zmq_strerror(errno));
	DCAST_LOG_I("ZeroMQ I/O threads: %llu%s", (unsigned long long)n,
		    b->cfg.io_threads ? "" : " (--io-threads 0: half the CPUs, 2 to 8)");
	return 0;
}

static int router_open(struct broker *b, void **sock, const char *endpoint, const char *which)
{
	if (!(*sock = zmq_socket(b->ctx, ZMQ_ROUTER)))
		return dcast_fail(DCAST_EZMQ, "%s socket: %s", which, zmq_strerror(errno));
	if (broker_socket_setup(b, *sock, which))
		return DCAST_EZMQ;
	char bound[256];
	size_t len = sizeof(bound);

	if (broker_bind(b, *sock, endpoint, which))
		return DCAST_EZMQ;
	if (zmq_getsockopt(*sock, ZMQ_LAST_ENDPOINT, bound, &len))
		snprintf(bound, sizeof(bound), "%s", endpoint);
	DCAST_LOG_I("%s on %s", which, bound); /* the port bound: tcp://HOST:* picks one */
	return broker_limits_watch(b, *sock, which);
}

/* The consumer endpoint as bound, for WELCOME.x-consumers: "" (none named)
 * when it breaks that field's rule (an ipc:// path with a space). */
static void consumers_name(struct broker *b)
{
	size_t len = sizeof(b->consumers_bound);

	if (zmq_getsockopt(b->consumers, ZMQ_LAST_ENDPOINT, b->consumers_bound, &len))
		dcast_fail(DCAST_ETOO_LARGE, "consumers: endpoint longer than %d bytes",
			   DCAST_MAX_ENDPOINT);
	else if (!dcast_endpoint_check(b->consumers_bound, "consumers"))
		return;
	DCAST_LOG_W("%s: producers are not told the consumer endpoint", dcast_last_error());
	b->consumers_bound[0] = '\0';
}

static int peers_alloc(struct broker *b)
{
	int rc = broker_peers_init(&b->prod, b->cfg.max_producers);

	return rc ? rc : broker_peers_init(&b->cons, b->cfg.max_consumers);
}

int broker_open(struct broker *b, const struct broker_config *cfg)
{
	int rc;

	memset(b, 0, sizeof(*b));
	b->cfg = *cfg;
	b->metrics_clients.listen_fd = b->admin_clients.listen_fd = b->fold.efd = -1;
	b->bulk_clients.listen_fd = -1;
	b->bulk_local_clients.listen_fd = -1;
	if ((rc = peers_alloc(b)))
		return rc;
	broker_ingest_init(b);
	broker_read_cache_set(cfg->read_cache_bytes);
	broker_disk_map_fault(cfg->fault_nomap);
	if (!(b->ctx = zmq_ctx_new()))
		return dcast_fail(DCAST_EZMQ, "zmq_ctx_new: %s", zmq_strerror(errno));
	if ((rc = io_threads_set(b)))
		return rc;
	/* The data dir is restored before the endpoints bind (a broker that
	 * cannot load it exits without having listened) and before the relay's
	 * HELLO (which names the newest version restored). */
	if ((rc = broker_relay_open(b)) || (rc = broker_log_restore(b)) ||
	    (rc = router_open(b, &b->producers, cfg->producers, "producers")) ||
	    (rc = router_open(b, &b->consumers, cfg->consumers, "consumers")) ||
	    (rc = broker_metrics_open(b)) || (rc = broker_admin_open(b)) ||
	    (rc = broker_bulk_open(b)))
		return rc;
	consumers_name(b);
	broker_relay_start(b);
	return 0;
}

/* A message that does not decode is still traffic: its sender is not
 * silent (docs/protocol.md, HEARTBEAT: "after heartbeat_ms without other
 * traffic"), it only gets its ERROR. */
static void heard_from(struct broker *b, void *sock, dcast_wire_in *in)
{
	struct broker_peers *s = sock == b->producers ? &b->prod : sock == b->consumers ? &b->cons : NULL;
	struct broker_peer *p = s && in->has_rid ? broker_peer_find(s, &in->rid, 0) : NULL;

	if (p)
		p->last_recv_ms = dcast_now_ms();
}

static void drain(struct broker *b, void *sock, int router,
		  void (*handle)(struct broker *, dcast_wire_in *))
{
	for (int i = 0; i < BROKER_RECV_BURST; i++) {
		dcast_wire_in in;
		int rc = dcast_wire_recv(sock, router, &in, ZMQ_DONTWAIT);

		if (rc == DCAST_EBUSY) {
			dcast_wire_in_close(&in);
			return;
		}
		if (rc) {
			heard_from(b, sock, &in);
			broker_refuse(b, sock, in.has_rid ? &in.rid : NULL, rc, "",
				      DCAST_VERSION_NONE);
		} else
			handle(b, &in);
		dcast_wire_in_close(&in);
	}
}

static void timers(struct broker *b)
{
	uint64_t now = dcast_now_ms();
	uint64_t every = b->cfg.heartbeat_ms / 4;

	if (now - b->last_timer_ms < (every ? every : 1))
		return;
	/* A late turn: the loop itself was busy (a long fsync, a stopped
	 * process), and what peers sent meanwhile may still be queued, so their
	 * silence is judged on the next turn, after the queues are read. */
	b->late_turn = b->last_timer_ms && now - b->last_timer_ms > b->cfg.heartbeat_ms;
	if (b->late_turn)
		DCAST_LOG_W("event loop busy for %llu ms: peer timeouts checked next turn",
			    (unsigned long long)(now - b->last_timer_ms));
	b->last_timer_ms = now;
	broker_refuse_log_roll(b, now);
	broker_producer_timers(b, now);
	broker_consumer_timers(b, now);
	broker_relay_timers(b, now);
	broker_clients_timers(b, &b->metrics_clients, now);
	broker_clients_timers(b, &b->admin_clients, now);
	broker_clients_timers(b, &b->bulk_clients, now);
	broker_clients_timers(b, &b->bulk_local_clients, now);
	broker_bulk_timers(b);
	broker_models_idle(b, now); /* --model-idle-s (broker/retire.c) */
	broker_heap_trim(b, now);
}

static long poll_timeout(const struct broker *b)
{
	if (b->fanout_more)
		return 0;
	if (b->fanout_blocked)
		return 2; /* a consumer's pipe was full; retry soon */
	return (long)(b->cfg.heartbeat_ms / 4 ? b->cfg.heartbeat_ms / 4 : 1);
}

static int poll_once(struct broker *b)
{
	zmq_pollitem_t it[MAX_POLL];
	uint32_t n_extra = b->n_extra;
	int n = 0, rc;

	it[n++] = (zmq_pollitem_t){b->producers, 0, ZMQ_POLLIN, 0};
	it[n++] = (zmq_pollitem_t){b->consumers, 0, ZMQ_POLLIN, 0};
	for (uint32_t i = 0; i < b->n_up; i++)
		it[n++] = (zmq_pollitem_t){b->up[i].sock, 0, broker_relay_events(&b->up[i]), 0};
	for (uint32_t i = 0; i < n_extra; i++)
		it[n++] = (zmq_pollitem_t){NULL, b->extra[i].fd, b->extra[i].events, 0};
	rc = zmq_poll(it, n, poll_timeout(b));
	if (rc < 0)
		return errno == EINTR ? 0 : dcast_fail(DCAST_EZMQ, "zmq_poll: %s", zmq_strerror(errno));
	if (it[0].revents & ZMQ_POLLIN)
		drain(b, b->producers, 1, broker_producer_msg);
	if (it[1].revents & ZMQ_POLLIN)
		drain(b, b->consumers, 1, broker_consumer_msg);
	for (uint32_t i = 0; i < b->n_up; i++)
		if (it[2 + i].revents & ZMQ_POLLIN)
			broker_relay_msg(b, &b->up[i]);
	broker_poll_dispatch(b, it + 2 + b->n_up, n_extra);
	return 0;
}

int broker_run(struct broker *b)
{
	int rc = 0;

	while (!b->stop && !rc) {
		rc = poll_once(b);
		broker_producer_flush_credit(b);
		broker_relay_flush_credit(b);
		broker_fanout(b);
		timers(b);
		broker_durable_turn_end(b);
	}
	if (b->stop)
		DCAST_LOG_I("stop requested: shutting down");
	return rc;
}

void broker_close(struct broker *b)
{
	for (uint32_t i = 0; i < b->n_models; i++)
		if (b->prod.arr && b->models[i]->pending)
			broker_pending_abort(b, b->models[i], "broker shutting down");
	broker_bulk_close(b);
	broker_admin_close(b);
	broker_metrics_close(b);
	broker_durable_close(b); /* the writer finishes what is queued */
	broker_peers_free(&b->prod);
	broker_peers_free(&b->cons);
	for (uint32_t i = 0; i < b->n_models; i++) {
		broker_fold_free(b->models[i]);
		broker_model_free(b->models[i]);
	}
	broker_read_cache_free();
	broker_fold_close(b);
	broker_relay_close(b);
	broker_limits_close(b);
	if (b->producers)
		zmq_close(b->producers);
	if (b->consumers)
		zmq_close(b->consumers);
	if (b->ctx)
		zmq_ctx_term(b->ctx);
	b->ctx = NULL;
	broker_auth_close(b);
	memset(b, 0, sizeof(*b));
}
