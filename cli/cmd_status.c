/* deltacast status: GET /metrics from a broker's --metrics address and print
 * it for a person: totals, one row per model (version, anchor, log length)
 * and one per consumer (version applied, lag).  The metric names are the
 * ones broker/metrics.c writes (docs/operations.md, "Metrics"); --raw
 * prints the text as received. */
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "cli.h"

#define CMD "status"
#define STATUS_MAX_BYTES (4u << 20) /* the broker caps its body at 1 MiB */
#define STATUS_LABEL 160

static const char usage_text[] =
	"usage: deltacast status --broker HOST:PORT [--raw] [--timeout-ms MS]\n"
	"Fetches http://HOST:PORT/metrics (the broker's --metrics address) and prints\n"
	"totals, each model's newest version and anchor, and each consumer's applied\n"
	"version and lag.  --raw prints the Prometheus text instead.  Exit 1 when the\n"
	"broker cannot be reached or does not answer with metrics.\n";

/* One sample: name{model="",client="",slot="",code=""} value. */
struct sample {
	char name[96];
	char model[STATUS_LABEL], client[STATUS_LABEL], slot[24], code[48];
	unsigned long long value;
};

struct status {
	struct sample *s;
	size_t n, cap;
};

/* ---- fetch ---- */

/* What to say when --broker is one of the broker's ZeroMQ endpoints. */
static int zmq_endpoint(const char *addr, const char *how)
{
	return cli_fail(DCAST_EINVAL, "--broker %s is a ZeroMQ endpoint (%s), not the broker's "
			"--metrics address: give that one, HOST:PORT (the broker logs `metrics on "
			"http://HOST:PORT/metrics`)", addr, how);
}

/* Has a ZeroMQ peer answered?  Its ZMTP greeting starts with 0xff. */
static int zmtp(const char *b, size_t len)
{
	return len && (unsigned char)b[0] == 0xff;
}

static int split_addr(const char *addr, char *host, size_t cap, const char **port)
{
	const char *colon;

	if (strstr(addr, "://") && strncmp(addr, "http://", 7))
		return zmq_endpoint(addr, "its scheme says so");
	if (!strncmp(addr, "http://", 7))
		addr += 7;
	colon = strrchr(addr, ':');
	if (!colon || colon == addr || (size_t)(colon - addr) >= cap || !colon[1])
		return cli_fail(DCAST_EINVAL, "--broker \"%s\": want HOST:PORT", addr);
	memcpy(host, addr, (size_t)(colon - addr));
	host[colon - addr] = '\0';
	*port = colon + 1;
	return 0;
}

static int dial(const char *addr, long timeout_ms, int *out)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai, *p;
	struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
	char host[256], port_s[8];
	const char *port = NULL;
	int rc, fd = -1, err = ECONNREFUSED;

	if ((rc = split_addr(addr, host, sizeof(host), &port)))
		return rc;
	snprintf(port_s, sizeof(port_s), "%.7s", port);
	strtok(port_s, "/"); /* a trailing /metrics is fine */
	if ((rc = getaddrinfo(host, port_s, &hints, &ai)))
		return cli_fail(DCAST_EIO, "--broker %s: %s", addr, gai_strerror(rc));
	for (p = ai; p && fd < 0; p = p->ai_next) {
		if ((fd = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, 0)) < 0)
			continue;
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		if (connect(fd, p->ai_addr, p->ai_addrlen)) {
			err = errno;
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(ai);
	if (fd < 0)
		return cli_fail(DCAST_EIO, "--broker %s: connect: %s (is the broker running with "
				  "--metrics %s?)", addr, strerror(err), addr);
	*out = fd;
	return 0;
}

/* The whole response into *buf (NUL-terminated); the caller frees it. */
static int http_get(const char *addr, long timeout_ms, char **buf, size_t *len)
{
	static const char req[] = "GET /metrics HTTP/1.0\r\nHost: deltacast\r\n\r\n";
	char *b = malloc(STATUS_MAX_BYTES + 1);
	ssize_t r = 0;
	int fd = -1, rc;

	if (!b)
		return cli_fail(DCAST_ENOMEM, "%u-byte response buffer", STATUS_MAX_BYTES);
	if ((rc = dial(addr, timeout_ms, &fd))) {
		free(b);
		return rc;
	}
	*len = 0;
	if (send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) != (ssize_t)sizeof(req) - 1)
		r = -1;
	while (r >= 0 && *len < STATUS_MAX_BYTES && !zmtp(b, *len) &&
	       (r = recv(fd, b + *len, STATUS_MAX_BYTES - *len, 0)) > 0)
		*len += (size_t)r;
	rc = errno;
	close(fd);
	b[*len] = '\0';
	if (zmtp(b, *len)) {
		free(b);
		return zmq_endpoint(addr, "it answered in ZMTP");
	}
	if (r < 0) {
		free(b);
		return cli_fail(DCAST_EIO, "--broker %s: %s", addr, strerror(rc));
	}
	*buf = b;
	return 0;
}

/* The body of a 200 response. */
static int http_body(const char *addr, char *resp, char **body)
{
	char *end = strstr(resp, "\r\n\r\n");

	if (strncmp(resp, "HTTP/1.", 7) || !end)
		return cli_fail(DCAST_EMALFORMED, "--broker %s: not an HTTP response", addr);
	if (strncmp(resp + 8, " 200", 4))
		return cli_fail(DCAST_ENOTFOUND, "--broker %s: /metrics answered \"%.*s\"", addr,
				  (int)strcspn(resp, "\r\n"), resp);
	*body = end + 4;
	return 0;
}

/* ---- parse ---- */

/* One label value, unescaping \\ \" \n; returns the end (past the quote). */
static const char *label_value(const char *p, char *out, size_t cap)
{
	size_t n = 0;

	for (; *p && *p != '"'; p++) {
		char c = *p;

		if (c == '\\' && p[1]) {
			c = *++p == 'n' ? '\n' : *p;
		}
		if (n + 1 < cap)
			out[n++] = c;
	}
	out[n] = '\0';
	return *p == '"' ? p + 1 : NULL;
}

static char *label_dst(struct sample *s, const char *key, size_t *cap)
{
	static char skip[STATUS_LABEL];

	*cap = STATUS_LABEL;
	if (!strcmp(key, "model"))
		return s->model;
	if (!strcmp(key, "client"))
		return s->client;
	*cap = !strcmp(key, "slot") ? sizeof(s->slot) : sizeof(s->code);
	if (!strcmp(key, "slot"))
		return s->slot;
	if (!strcmp(key, "code"))
		return s->code;
	*cap = sizeof(skip);
	return skip;
}

/* key="value" pairs up to the closing brace; returns the end or NULL. */
static const char *labels(const char *p, struct sample *s)
{
	while (p && *p && *p != '}') {
		char key[32];
		size_t k = strcspn(p, "="), cap;
		char *dst;

		if (p[k] != '=' || p[k + 1] != '"' || k >= sizeof(key))
			return NULL;
		memcpy(key, p, k);
		key[k] = '\0';
		dst = label_dst(s, key, &cap);
		p = label_value(p + k + 2, dst, cap);
		if (p && *p == ',')
			p++;
	}
	return p && *p == '}' ? p + 1 : NULL;
}

/* "deltacast_NAME{labels} VALUE": 0 and *s filled, -1 to skip the line. */
static int parse_line(const char *line, struct sample *s)
{
	const char *p = line;
	size_t n;
	char *end;

	memset(s, 0, sizeof(*s));
	if (strncmp(p, "deltacast_", 10))
		return -1;
	p += 10;
	n = strcspn(p, "{ ");
	if (!n || n >= sizeof(s->name))
		return -1;
	memcpy(s->name, p, n);
	p += n;
	if (*p == '{' && !(p = labels(p + 1, s)))
		return -1;
	if (*p != ' ')
		return -1;
	s->value = strtoull(p + 1, &end, 10);
	return end == p + 1 ? -1 : 0;
}

static int status_parse(char *body, struct status *st)
{
	size_t lines = 1;

	for (char *c = body; *c; c++)
		lines += *c == '\n';
	if (!(st->s = calloc(lines, sizeof(*st->s))))
		return cli_fail(DCAST_ENOMEM, "%zu metric lines", lines);
	st->cap = lines;
	for (char *line = strtok(body, "\n"); line && st->n < st->cap; line = strtok(NULL, "\n"))
		if (line[0] != '#' && !parse_line(line, &st->s[st->n]))
			st->n++;
	if (!st->n)
		return cli_fail(DCAST_EMALFORMED, "the response has no deltacast_ metrics");
	return 0;
}

/* ---- print ---- */

/* The value of `name` whose `label` field (offset into struct sample)
 * equals `want` ("" for an unlabelled metric); `dflt` when absent. */
static unsigned long long find(const struct status *st, const char *name, size_t label,
			       const char *want, unsigned long long dflt)
{
	for (size_t i = 0; i < st->n; i++)
		if (!strcmp(st->s[i].name, name) && !strcmp((const char *)&st->s[i] + label, want))
			return st->s[i].value;
	return dflt;
}

#define TOTAL(name) find(st, name, offsetof(struct sample, model), "", 0)

static void print_bytes(const char *what, unsigned long long b, unsigned long long chunks)
{
	printf("%s %.2f MiB (%llu B) in %llu chunks", what, (double)b / (1 << 20), b, chunks);
}

static void print_totals(const struct status *st)
{
	int any = 0;

	printf("versions: %llu committed, %llu aborted; anchors made by the broker: %llu "
	       "(refused for a digest mismatch: %llu)\n", TOTAL("versions_committed_total"),
	       TOTAL("versions_aborted_total"), TOTAL("anchors_made_total"),
	       TOTAL("anchor_digest_errors_total"));
	print_bytes("bytes: in", TOTAL("bytes_in_total"), TOTAL("chunks_in_total"));
	print_bytes(", out", TOTAL("bytes_out_total"), TOTAL("chunks_out_total"));
	printf("\npeers: %llu producer parts, %llu consumers connected; %llu timed out; "
	       "%llu refused by auth\nerrors:", TOTAL("producers_connected"),
	       TOTAL("consumers_connected"), TOTAL("peers_timed_out_total"),
	       TOTAL("auth_refused_total"));
	for (size_t i = 0; i < st->n; i++)
		if (!strcmp(st->s[i].name, "errors_total") && st->s[i].code[0]) {
			printf("%s %s %llu", any ? "," : "", st->s[i].code, st->s[i].value);
			any = 1;
		}
	printf("%s\n", any ? "" : " none");
}

static void print_models(const struct status *st)
{
	const size_t by_model = offsetof(struct sample, model);

	printf("\n%-32s %12s %12s %8s\n", "MODEL", "VERSION", "ANCHOR", "LOG");
	for (size_t i = 0; i < st->n; i++) {
		const struct sample *s = &st->s[i];

		if (strcmp(s->name, "model_log_versions"))
			continue;
		printf("%-32s ", s->model);
		if (find(st, "model_version", by_model, s->model, ~0ull) == ~0ull)
			printf("%12s %12s", "-", "-");
		else
			printf("%12llu %12llu", find(st, "model_version", by_model, s->model, 0),
			       find(st, "model_anchor_version", by_model, s->model, 0));
		printf(" %8llu\n", s->value);
	}
}

static void print_consumers(const struct status *st)
{
	const size_t by_slot = offsetof(struct sample, slot);
	size_t n = 0;

	printf("\n%-6s %-32s %-24s %12s %8s\n", "SLOT", "CONSUMER", "MODEL", "VERSION", "LAG");
	for (size_t i = 0; i < st->n; i++) {
		const struct sample *s = &st->s[i];

		if (strcmp(s->name, "consumer_version"))
			continue;
		printf("%-6s %-32s %-24s %12llu %8llu\n", s->slot, s->client[0] ? s->client : "-",
		       s->model, s->value, find(st, "consumer_lag_versions", by_slot, s->slot, 0));
		n++;
	}
	if (!n)
		printf("(no consumer has a version yet)\n");
}

static int status(const char *addr, long timeout_ms, int raw)
{
	struct status st = {0};
	char *resp = NULL, *body = NULL;
	size_t len;
	int rc = http_get(addr, timeout_ms, &resp, &len);

	if (!rc)
		rc = http_body(addr, resp, &body);
	if (!rc && raw)
		fputs(body, stdout);
	else if (!rc && !(rc = status_parse(body, &st))) {
		printf("broker %s\n", addr);
		print_totals(&st);
		print_models(&st);
		print_consumers(&st);
	}
	free(st.s);
	free(resp);
	return rc;
}

int cmd_status(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"broker", required_argument, NULL, 'b'},
		{"raw", no_argument, NULL, 'r'},
		{"timeout-ms", required_argument, NULL, 't'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *addr = NULL;
	long timeout_ms = 2000;
	int raw = 0, c, rc;

	optind = 1;
	while ((c = getopt_long(argc, argv, "b:rt:h", longopts, NULL)) != -1) {
		if (c == 'b') {
			addr = optarg;
		} else if (c == 'r') {
			raw = 1;
		} else if (c == 't') {
			if ((rc = cli_parse_timeout_ms(CMD, optarg, &timeout_ms)))
				return rc;
		} else if (c == 'h') {
			return fputs(usage_text, stdout), CLI_OK;
		} else {
			return cli_usage_error(CMD, "unknown option");
		}
	}
	if (optind < argc)
		return cli_usage_error(CMD, "unexpected argument \"%s\"", argv[optind]);
	if (!addr)
		return cli_usage_error(CMD, "--broker HOST:PORT (the broker's --metrics address) is required");
	if ((rc = status(addr, timeout_ms, raw)))
		return cli_report(CMD, rc);
	return CLI_OK;
}
