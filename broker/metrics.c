/* A small HTTP/1.0 server for /metrics (metrics.h), inside the broker's
 * event loop.  The listener and every client are non-blocking fds in the
 * loop's poll set: a turn reads what a client has sent, renders the page
 * once the request is complete, and sends what the socket takes, keeping
 * the rest for the next turn.  Each client is bounded: METRICS_REQUEST_BYTES
 * of request, METRICS_CLIENT_MS from accept to the last byte sent, and at
 * most METRICS_MAX_CLIENTS at once (more are closed at once); the time is
 * checked on each readiness and on the loop's timer turn (heartbeat_ms / 4).
 * So a slow or silent client costs the loop a recv or a send, never a wait.
 *
 * Why not a thread with a snapshot: the page reads models, consumers and
 * stats that the loop changes every turn; a thread would need a copy
 * published under a lock on every turn (or the loop to stop for it), while
 * rendering here, when a request is complete, costs one pass over the
 * tables and no locking.  The page buffer is allocated once at open; only
 * a response the socket did not take at once is copied, per client. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "auth.h"
#include "dcast_common.h"
#include "durable.h" /* writer metrics (broker/durable.c) */
#include "fold.h"
#include "metrics.h"

#define METRICS_BODY_BYTES (1u << 20)
#define METRICS_HEAD_BYTES 256       /* room before the body for the HTTP head */
#define METRICS_REQUEST_BYTES 8192   /* a longer request is closed unanswered */
#define METRICS_CLIENT_MS 2000       /* accept to last byte sent, then closed */
#define METRICS_MAX_CLIENTS 16       /* more are closed as soon as accepted */
#define METRICS_ACCEPT_BURST 32

struct metrics_client {
	struct broker_client base;   /* first: the slot of b->metrics_clients */
	size_t req_len;
	char req[METRICS_REQUEST_BYTES];
	char *out;                   /* the unsent part of the response, owned */
	size_t out_len, out_off;
	int answered;                /* the response is composed: only sending left */
};


struct out {
	char *buf;
	size_t cap, len;
};

static void emit(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(struct out *o, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (o->len + 1 >= o->cap)
		return;
	va_start(ap, fmt);
	n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= o->cap - o->len)
		o->buf[o->len] = '\0'; /* drop the partial line */
	else
		o->len += (size_t)n;
}

static void counter(struct out *o, const char *name, const char *help, uint64_t v)
{
	emit(o, "# HELP deltacast_%s %s\n# TYPE deltacast_%s counter\ndeltacast_%s %llu\n", name,
	     help, name, name, (unsigned long long)v);
}

static void gauge(struct out *o, const char *name, const char *help, uint64_t v)
{
	emit(o, "# HELP deltacast_%s %s\n# TYPE deltacast_%s gauge\ndeltacast_%s %llu\n", name,
	     help, name, name, (unsigned long long)v);
}

/* Label values: model and client names with \ " and newlines escaped. */
static void label(char *out, size_t cap, const char *s)
{
	size_t n = 0;

	for (; *s && n + 3 < cap; s++) {
		if (*s == '\\' || *s == '"' || *s == '\n') {
			out[n++] = '\\';
			out[n++] = *s == '\n' ? 'n' : *s;
		} else {
			out[n++] = *s;
		}
	}
	out[n] = '\0';
}

static void render_errors(struct out *o, const struct broker_stats *st)
{
	emit(o, "# HELP deltacast_errors_total inbound messages refused, by error\n"
		"# TYPE deltacast_errors_total counter\n");
	for (int i = 1; i < DCAST_ERR_COUNT; i++)
		if (st->errors[i])
			emit(o, "deltacast_errors_total{code=\"%s\"} %llu\n", dcast_errname(i),
			     (unsigned long long)st->errors[i]);
}

/* Per-model values (UINT64_MAX: no sample for that model). */
static uint64_t model_version(const struct broker_model *m)
{
	uint64_t v = broker_model_newest(m);

	return v == DCAST_VERSION_NONE ? UINT64_MAX : v;
}

static uint64_t model_anchor_version(const struct broker_model *m)
{
	return m->n_log ? m->log[0]->version : UINT64_MAX;
}

static uint64_t model_lost_version(const struct broker_model *m)
{
	return m->lost_version == DCAST_VERSION_NONE ? UINT64_MAX : m->lost_version;
}

static uint64_t model_log_versions(const struct broker_model *m)
{
	return m->n_log;
}

/* Parts that committed the open version: a version waiting on a rank. */
static uint64_t model_parts_committed(const struct broker_model *m)
{
	return m->pending ? m->pending->n_committed : 0;
}

/* One family with a sample per model, after its HELP and TYPE. */
static void model_family(struct out *o, const struct broker *b, const char *name, const char *help,
			 uint64_t (*value)(const struct broker_model *))
{
	char m[2 * DCAST_MAX_NAME + 2];

	emit(o, "# HELP deltacast_%s %s\n# TYPE deltacast_%s gauge\n", name, help, name);
	for (uint32_t i = 0; i < b->n_models; i++) {
		uint64_t v = value(b->models[i]);

		label(m, sizeof(m), b->models[i]->name);
		if (v != UINT64_MAX)
			emit(o, "deltacast_%s{model=\"%s\"} %llu\n", name, m, (unsigned long long)v);
	}
}

/* Each bulk thread's bytes (--bulk-threads): how the transfers spread. */
static void bulk_threads(struct out *o, const struct broker *b)
{
	emit(o, "# HELP deltacast_bulk_thread_bytes_total bytes written to --bulk connections by each of "
	     "the threads that write them\n# TYPE deltacast_bulk_thread_bytes_total counter\n");
	for (uint32_t i = 0; i < b->bulk_threads; i++)
		emit(o, "deltacast_bulk_thread_bytes_total{thread=\"%u\"} %llu\n", i,
		     (unsigned long long)b->stats.bulk_thread_bytes[i]);
}

static void render_models(struct out *o, const struct broker *b)
{
	model_family(o, b, "model_version", "newest committed version", model_version);
	model_family(o, b, "model_anchor_version", "newest anchor in the log", model_anchor_version);
	model_family(o, b, "model_log_versions", "versions in the model's log", model_log_versions);
	model_family(o, b, "model_lost_version", "newest version lost from a damaged segment: the next "
		     "must be an anchor above it", model_lost_version);
	model_family(o, b, "model_parts_committed", "producer parts that committed the open version "
		     "(0: none open)", model_parts_committed);
}

/* The version a consumer has, for version and lag: what it ACKed, else
 * the newest version sent to it (NONE before either). */
static uint64_t consumer_have(const struct broker_peer *p)
{
	return p->acked_version != DCAST_VERSION_NONE ? p->acked_version : p->have_version;
}

static uint64_t consumer_lag(const struct broker_peer *p)
{
	uint64_t newest = broker_model_newest(p->model), have = consumer_have(p);

	return newest != DCAST_VERSION_NONE && newest > have ? newest - have : 0;
}

/* One family with a sample per consumer that has a version: the
 * exposition format wants each family's samples together, after its
 * HELP and TYPE (docs/operations.md, "Metrics"). */
static void consumer_family(struct out *o, const struct broker *b, const char *name,
			    const char *help, uint64_t (*value)(const struct broker_peer *))
{
	char m[2 * DCAST_MAX_NAME + 2], c[2 * DCAST_MAX_CLIENT + 2];

	emit(o, "# HELP deltacast_%s %s\n# TYPE deltacast_%s gauge\n", name, help, name);
	for (uint64_t i = 0; i < b->cons.hi; i++) {
		const struct broker_peer *p = &b->cons.arr[i];

		if (!p->used || !p->model || consumer_have(p) == DCAST_VERSION_NONE)
			continue;
		label(m, sizeof(m), p->model->name);
		label(c, sizeof(c), p->client);
		emit(o, "deltacast_%s{model=\"%s\",client=\"%s\",slot=\"%llu\"} %llu\n", name, m, c,
		     (unsigned long long)i, (unsigned long long)value(p));
	}
}

/* Consumers whose pipe was full on the broker's last send to them: they
 * read slower than the stream comes (or not at all); the rest is theirs
 * to fetch when they read again. */
static uint64_t consumers_blocked(const struct broker *b)
{
	uint64_t n = 0;

	for (uint64_t i = 0; i < b->cons.hi; i++)
		n += b->cons.arr[i].used && b->cons.arr[i].blocked;
	return n;
}

static void render_consumers(struct out *o, const struct broker *b)
{
	consumer_family(o, b, "consumer_version", "version the consumer says it applied",
			consumer_have);
	consumer_family(o, b, "consumer_lag_versions", "newest committed minus applied",
			consumer_lag);
}

size_t broker_metrics_render(const struct broker *b, char *buf, size_t cap)
{
	const struct broker_stats *st = &b->stats;
	struct out o = {buf, cap, 0};

	buf[0] = '\0';
	counter(&o, "versions_committed_total", "versions committed", st->versions_committed);
	counter(&o, "versions_aborted_total", "partial versions dropped", st->versions_aborted);
	counter(&o, "chunks_in_total", "chunks stored from producers", st->chunks_in);
	counter(&o, "bytes_in_total", "payload bytes stored from producers", st->bytes_in);
	counter(&o, "chunks_out_total", "chunks sent to consumers", st->chunks_out);
	counter(&o, "cut_through_chunks_total", "chunks sent before their version's COMMIT (--cut-through)",
		st->cut_through_chunks);
	counter(&o, "cut_through_aborted_total", "aborted versions some of whose chunks had gone to consumers",
		st->cut_through_aborted);
	counter(&o, "bulk_versions_total", "anchors sent to consumers over --bulk connections",
		st->bulk_versions);
	counter(&o, "bulk_bytes_total", "bytes written to --bulk connections (frames and payloads)",
		st->bulk_bytes);
	counter(&o, "bulk_sendfile_bytes_total", "of the bytes written to --bulk connections, payload "
		"bytes sent with sendfile(2) from the page cache (the rest with send())",
		st->bulk_sendfile_bytes);
	counter(&o, "bulk_local_bytes_total", "payload bytes passed to consumers on this host as references "
		"to the files that hold them, not written (--bulk's local listener)", st->bulk_local_bytes);
	bulk_threads(&o, b);
	counter(&o, "relay_bulk_versions_total", "anchors this relay took over its upstream's --bulk connection",
		st->relay_bulk_versions);
	counter(&o, "relay_bulk_bytes_total", "payload bytes this relay took over its upstream's --bulk connection",
		st->relay_bulk_bytes);
	counter(&o, "relay_bulk_failures_total", "bulk transfers from the upstream that failed (re-joined over ZeroMQ)",
		st->relay_bulk_failures);
	counter(&o, "bytes_out_total", "payload bytes sent to consumers", st->bytes_out);
	gauge(&o, "producers_connected", "producer parts connected", st->producers_connected);
	gauge(&o, "consumers_connected", "consumers connected", st->consumers_connected);
	gauge(&o, "consumers_blocked", "consumers whose pipe was full on the last send", consumers_blocked(b));
	counter(&o, "consumer_joins_total", "consumer HELLOs taken: joins and re-joins", st->consumer_joins);
	counter(&o, "peers_timed_out_total", "peers dropped after heartbeats", st->peers_timed_out);
	counter(&o, "auth_refused_total", "peers refused by the ZAP handler", broker_auth_refused(b));
	counter(&o, "anchors_made_total", "anchors the broker made by folding deltas", st->anchors_made);
	counter(&o, "anchor_digest_errors_total", "made anchors refused: digest differs from the producer's",
		st->anchor_digest_errors);
	counter(&o, "anchor_deltas_total", "producer anchors made into deltas for consumers at the version before",
		st->anchor_deltas);
	counter(&o, "anchor_deltas_failed_total", "producer anchors that went whole: their delta could not be made",
		st->anchor_deltas_failed);
	counter(&o, "anchor_delta_bytes_saved_total", "producer anchors' payload bytes less their made deltas'",
		st->anchor_delta_bytes_saved);
	counter(&o, "versions_poisoned_total", "committed versions the fold found bad: never served again",
		st->versions_poisoned);
	counter(&o, "models_expired_total", "models removed after --model-idle-s without peers",
		st->models_expired);
	counter(&o, "models_deleted_total", "models removed by an operator (deltacast model delete)",
		st->models_deleted);
	counter(&o, "durable_failures_total", "committed versions that did not become durable",
		st->durable_failures);
	gauge(&o, "fold_state_bytes",
	      "model state the fold holds in memory to make anchors (0 between cuts; with --data-dir a range)",
	      broker_fold_state_bytes(b));
	gauge(&o, "durable_in_flight_versions", "versions queued for the durable writer, not yet done",
	      broker_durable_in_flight(b));
	gauge(&o, "disk_read_in_flight_bytes", "payload bytes read from the segments for consumers, not yet sent",
	      broker_disk_inflight_bytes());
	counter(&o, "disk_read_bytes_total", "payload bytes read from the segments to serve consumers",
		broker_disk_read_bytes());
	counter(&o, "disk_mapped_bytes_total",
		"of those, payload bytes sent from a mapping of the segments (no copy into the heap)",
		broker_disk_mapped_bytes());
	counter(&o, "read_cache_hits_total", "chunks served from the read cache in place of a read",
		broker_read_cache_hits());
	gauge(&o, "read_cache_bytes", "payload bytes the read cache keeps for consumers about to take them",
	      broker_read_cache_bytes());
	counter(&o, "versions_to_disk_total", "committed versions whose payloads left the heap for their segment",
		st->versions_to_disk);
	emit(&o, "# HELP deltacast_loop_stall_max_ms longest event loop turn spent on durable work\n"
	     "# TYPE deltacast_loop_stall_max_ms gauge\ndeltacast_loop_stall_max_ms %.3f\n",
	     (double)st->loop_stall_max_ns / 1e6);
	counter(&o, "heap_trims_total", "free heap memory given back to the system (quiet turns after the log "
		"changed)", st->heap_trims);
	gauge(&o, "heap_trim_due", "1 while the log changed since the last heap trim", broker_heap_trim_due(b));
	emit(&o, "# HELP deltacast_heap_trim_max_ms longest of those, on the event loop\n"
	     "# TYPE deltacast_heap_trim_max_ms gauge\ndeltacast_heap_trim_max_ms %.3f\n",
	     (double)st->heap_trim_max_ns / 1e6);
	render_errors(&o, st);
	render_models(&o, b);
	render_consumers(&o, b);
	return o.len;
}

static void client_close(struct broker *b, struct metrics_client *c)
{
	broker_clients_close(b, &b->metrics_clients, &c->base);
}

static void client_free(struct broker_client *base)
{
	free(((struct metrics_client *)base)->out);
}

/* Send what the socket takes; closed once all is sent or on an error. */
static void client_send(struct broker *b, struct metrics_client *c)
{
	while (c->out_off < c->out_len) {
		ssize_t r = send(c->base.fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			return;
		if (r <= 0)
			break;
		c->out_off += (size_t)r;
	}
	client_close(b, c);
}

/* The HTTP head before the body in the page; returns where the response starts. */
static char *head_before(char *body, int ok, size_t len, size_t *head_len)
{
	char head[METRICS_HEAD_BYTES];
	int n = snprintf(head, sizeof(head), "HTTP/1.0 %s\r\nContent-Type: text/plain; version=0.0.4; "
			 "charset=utf-8\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
			 ok ? "200 OK" : "404 Not Found", len);

	*head_len = (size_t)n;
	return memcpy(body - n, head, (size_t)n);
}

/* Compose the response (GET /metrics, else 404) in the page, send what the
 * socket takes now and keep a copy of the rest. */
static void client_answer(struct broker *b, struct metrics_client *c)
{
	char *body = b->metrics_page + METRICS_HEAD_BYTES, *resp;
	int ok = c->req_len >= 13 && (!memcmp(c->req, "GET /metrics ", 13) ||
				      !memcmp(c->req, "GET /metrics\r", 13));
	size_t len = ok ? broker_metrics_render(b, body, METRICS_BODY_BYTES) : 10, head, sent;
	ssize_t r;

	if (!ok)
		memcpy(body, "not found\n", 10);
	resp = head_before(body, ok, len, &head);
	r = send(c->base.fd, resp, head + len, MSG_NOSIGNAL | MSG_DONTWAIT);
	sent = r > 0 ? (size_t)r : 0;
	c->answered = 1;
	if (sent == head + len || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ||
	    !(c->out = malloc(head + len - sent))) {
		client_close(b, c);
		return;
	}
	memcpy(c->out, resp + sent, head + len - sent);
	c->out_len = head + len - sent;
	broker_poll_events(b, c->base.fd, ZMQ_POLLOUT);
}

/* A blank line ends the request; only the bytes just read (and the three
 * before them) are searched, so a byte-at-a-time sender costs O(1) a byte. */
static int request_complete(const struct metrics_client *c, size_t from)
{
	size_t at = from > 3 ? from - 3 : 0;

	return memmem(c->req + at, c->req_len - at, "\r\n\r\n", 4) ||
	       memmem(c->req + at, c->req_len - at, "\n\n", 2);
}

/* Read what has arrived: 1 when the request is complete (or ended by
 * EOF), 0 to wait for more, -1 to close (an error, or too long). */
static int client_read(struct metrics_client *c)
{
	for (;;) {
		size_t from = c->req_len;
		ssize_t r = recv(c->base.fd, c->req + from, sizeof(c->req) - from, MSG_DONTWAIT);

		if (r < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
		c->req_len += (size_t)r;
		if (r == 0 || request_complete(c, from))
			return 1;
		if (c->req_len == sizeof(c->req))
			return -1; /* METRICS_REQUEST_BYTES */
	}
}

static void client_recv(struct broker *b, struct metrics_client *c)
{
	int rc = client_read(c);

	if (rc > 0)
		client_answer(b, c);
	else if (rc < 0)
		client_close(b, c);
}

static void on_client(struct broker *b, int fd, void *arg)
{
	struct metrics_client *c = arg;

	(void)fd;
	if (dcast_now_ms() >= c->base.deadline_ms)
		client_close(b, c);
	else if (c->answered)
		client_send(b, c);
	else
		client_recv(b, c);
}

int broker_metrics_open(struct broker *b)
{
	int fd, rc;

	b->metrics_clients = (struct broker_clients){
		.what = "metrics", .listen_fd = -1, .cap = METRICS_MAX_CLIENTS,
		.burst = METRICS_ACCEPT_BURST, .slot_bytes = sizeof(struct metrics_client),
		.client_ms = METRICS_CLIENT_MS, .on_client = on_client, .on_free = client_free};
	if (!b->cfg.metrics)
		return 0;
	if (!(b->metrics_page = malloc(METRICS_HEAD_BYTES + METRICS_BODY_BYTES)))
		return dcast_fail(DCAST_ENOMEM, "metrics buffer");
	if ((fd = broker_tcp_listen("--metrics", b->cfg.metrics, NULL)) < 0)
		return -fd;
	if ((rc = broker_clients_start(b, &b->metrics_clients, fd)))
		return rc;
	DCAST_LOG_I("metrics on http://%s/metrics", broker_tcp_bound(fd).text);
	return 0;
}

void broker_metrics_close(struct broker *b)
{
	broker_clients_stop(b, &b->metrics_clients);
	free(b->metrics_page);
	b->metrics_page = NULL;
}
