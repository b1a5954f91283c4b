/* A tiny HTTP/1.0 server for /metrics (metrics.h).  The listening fd sits in
 * the broker's poll set; each readable turn accepts a bounded number of
 * connections, reads the request with a short timeout, answers and closes.
 * The response buffer is allocated once at open. */
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
#include "metrics.h"

#define METRICS_BODY_BYTES (1u << 20)
#define METRICS_ACCEPT_BURST 8
#define METRICS_READ_TIMEOUT_MS 200

static char *body;

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

static void render_models(struct out *o, const struct broker *b)
{
	char m[2 * DCAST_MAX_NAME + 2];

	emit(o, "# HELP deltacast_model_version newest committed version\n"
		"# TYPE deltacast_model_version gauge\n");
	for (uint32_t i = 0; i < b->n_models; i++) {
		uint64_t v = broker_model_newest(b->models[i]);

		label(m, sizeof(m), b->models[i]->name);
		if (v != DCAST_VERSION_NONE)
			emit(o, "deltacast_model_version{model=\"%s\"} %llu\n", m,
			     (unsigned long long)v);
	}
	emit(o, "# HELP deltacast_model_anchor_version newest anchor in the log\n"
		"# TYPE deltacast_model_anchor_version gauge\n");
	for (uint32_t i = 0; i < b->n_models; i++) {
		label(m, sizeof(m), b->models[i]->name);
		if (b->models[i]->n_log)
			emit(o, "deltacast_model_anchor_version{model=\"%s\"} %llu\n", m,
			     (unsigned long long)b->models[i]->log[0]->version);
	}
	emit(o, "# HELP deltacast_model_log_versions versions in the model's log\n"
		"# TYPE deltacast_model_log_versions gauge\n");
	for (uint32_t i = 0; i < b->n_models; i++) {
		label(m, sizeof(m), b->models[i]->name);
		emit(o, "deltacast_model_log_versions{model=\"%s\"} %u\n", m, b->models[i]->n_log);
	}
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
	counter(&o, "bytes_out_total", "payload bytes sent to consumers", st->bytes_out);
	gauge(&o, "producers_connected", "producer parts connected", st->producers_connected);
	gauge(&o, "consumers_connected", "consumers connected", st->consumers_connected);
	counter(&o, "peers_timed_out_total", "peers dropped after heartbeats", st->peers_timed_out);
	counter(&o, "auth_refused_total", "peers refused by the ZAP handler", broker_auth_refused());
	counter(&o, "anchors_made_total", "anchors the broker made by folding deltas", st->anchors_made);
	counter(&o, "anchor_digest_errors_total", "made anchors refused: digest differs from the producer's",
		st->anchor_digest_errors);
	counter(&o, "durable_failures_total", "committed versions that did not become durable",
		st->durable_failures);
	gauge(&o, "durable_in_flight_versions", "versions queued for the durable writer, not yet done",
	      broker_durable_in_flight());
	emit(&o, "# HELP deltacast_loop_stall_max_ms longest event loop turn spent on durable work\n"
	     "# TYPE deltacast_loop_stall_max_ms gauge\ndeltacast_loop_stall_max_ms %.3f\n",
	     (double)st->loop_stall_max_ns / 1e6);
	render_errors(&o, st);
	render_models(&o, b);
	render_consumers(&o, b);
	return o.len;
}

/* Answer one connection: GET /metrics, else 404. */
static void serve(struct broker *b, int fd)
{
	struct timeval tv = {0, METRICS_READ_TIMEOUT_MS * 1000};
	char req[2048], head[160];
	size_t n = 0, len = 0;
	ssize_t r;
	int ok;

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	while (n < sizeof(req) - 1 && (r = recv(fd, req + n, sizeof(req) - 1 - n, 0)) > 0) {
		n += (size_t)r;
		req[n] = '\0';
		if (strstr(req, "\r\n\r\n") || strstr(req, "\n\n"))
			break;
	}
	req[n] = '\0';
	ok = !strncmp(req, "GET /metrics ", 13) || !strncmp(req, "GET /metrics\r", 13);
	if (ok)
		len = broker_metrics_render(b, body, METRICS_BODY_BYTES);
	snprintf(head, sizeof(head), "HTTP/1.0 %s\r\nContent-Type: text/plain; version=0.0.4\r\n"
		 "Content-Length: %zu\r\nConnection: close\r\n\r\n",
		 ok ? "200 OK" : "404 Not Found", ok ? len : (size_t)10);
	if (send(fd, head, strlen(head), MSG_NOSIGNAL) > 0)
		send(fd, ok ? body : "not found\n", ok ? len : 10, MSG_NOSIGNAL);
	close(fd);
}

static void on_readable(struct broker *b, int lfd, void *arg)
{
	(void)arg;
	for (int i = 0; i < METRICS_ACCEPT_BURST; i++) {
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

		if (fd < 0)
			return;
		serve(b, fd);
	}
}

static int parse_addr(const char *s, struct sockaddr_in *sa)
{
	char host[64];
	const char *colon = strrchr(s, ':');
	char *end;
	unsigned long port;

	if (!colon || (size_t)(colon - s) >= sizeof(host))
		return dcast_fail(DCAST_EINVAL, "--metrics \"%s\": want HOST:PORT", s);
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = '\0';
	port = strtoul(colon + 1, &end, 10);
	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	sa->sin_port = htons((uint16_t)port);
	if (*end || port == 0 || port > 65535 || inet_pton(AF_INET, host, &sa->sin_addr) != 1)
		return dcast_fail(DCAST_EINVAL, "--metrics \"%s\": want IPv4-HOST:PORT (1..65535)", s);
	return 0;
}

int broker_metrics_open(struct broker *b)
{
	struct sockaddr_in sa;
	int fd, one = 1, rc;

	if (!b->cfg.metrics)
		return 0;
	if ((rc = parse_addr(b->cfg.metrics, &sa)))
		return rc;
	if (!body && !(body = malloc(METRICS_BODY_BYTES)))
		return dcast_fail(DCAST_ENOMEM, "metrics buffer");
	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 16)) {
		rc = dcast_fail(DCAST_EIO, "--metrics %s: %s", b->cfg.metrics, strerror(errno));
		if (fd >= 0)
			close(fd);
		return rc;
	}
	if ((rc = broker_poll_add(b, fd, on_readable, NULL))) {
		close(fd);
		return rc;
	}
	DCAST_LOG_I("metrics on http://%s/metrics", b->cfg.metrics);
	return 0;
}
