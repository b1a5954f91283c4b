/* deltacast-broker configuration: one table row per flag, the same names on
 * the command line (--name VALUE) and in a --config file (`name = value`
 * lines, # comments).  Command-line flags win over the file whatever their
 * order, because the file is read first.  Adding a flag = a field in
 * struct broker_config + one row here (+ a row in docs/operations.md). */
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include "broker.h"
#include "dcast_common.h"
#include "fold.h" /* --anchor-fraction (broker/fold.c) */

enum flag_kind { FLAG_STR, FLAG_U64, FLAG_LIST, FLAG_BOOL }; /* FLAG_BOOL: no value on the command line */

struct flag {
	const char *name;
	enum flag_kind kind;
	size_t off;
	const char *def; /* default, as text; NULL: none */
	const char *help;
};

#define OFF(f) offsetof(struct broker_config, f)
static const struct flag flags[] = {
	{"producers", FLAG_STR, OFF(producers), NULL, "ENDPOINT producers connect to (ROUTER bind), required"},
	{"consumers", FLAG_STR, OFF(consumers), NULL, "ENDPOINT consumers connect to (ROUTER bind), required"},
	{"data-dir", FLAG_STR, OFF(data_dir), NULL, "DIR for durable segments (no durability without it)"},
	{"upstream", FLAG_STR, OFF(upstream), NULL, "ENDPOINT of an upstream broker's consumer socket: relay"},
	{"upstream-model", FLAG_LIST, OFF(upstream_models), NULL, "NAME of a model to relay (repeat; required with --upstream)"},
	{"retain-versions", FLAG_U64, OFF(retain_versions), "1024", "log entries per model (anchor + deltas) before an anchor is requested"},
	{"retain-bytes", FLAG_U64, OFF(retain_bytes), "17179869184", "bytes of memory per model log (payloads and overhead) before an anchor is requested"},
	{"max-pending-bytes", FLAG_U64, OFF(max_pending_bytes), "17179869184", "bytes of memory of one uncommitted version (payloads and overhead)"},
	{"max-pending-total-bytes", FLAG_U64, OFF(max_pending_total_bytes), "0", "memory held by the uncommitted versions of all models (0: a quarter of physical memory)"},
	{"producer-window-bytes", FLAG_U64, OFF(producer_window_bytes), "268435456", "credit granted to each producer part"},
	{"upstream-window-bytes", FLAG_U64, OFF(upstream_window_bytes), "1073741824", "credit granted to the upstream broker (relay)"},
	{"consumer-sndbuf-bytes", FLAG_U64, OFF(consumer_sndbuf_bytes), "0", "kernel send buffer (SO_SNDBUF) of each consumer connection, so the round-robin pump shares a slow uplink fairly (0: the kernel's autotuning)"},
	{"part-timeout-ms", FLAG_U64, OFF(part_timeout_ms), "30000", "a part silent this long mid-version aborts the version"},
	{"heartbeat-ms", FLAG_U64, OFF(heartbeat_ms), "1000", "heartbeat interval; peers silent 3x this are dropped"},
	{"io-threads", FLAG_U64, OFF(io_threads), "0", "ZeroMQ I/O threads (they do the sockets' TCP reads and writes); 0: half the CPUs, 2 to 8"},
	{"max-consumers", FLAG_U64, OFF(max_consumers), "4096", "consumer connections at once"},
	{"max-producers", FLAG_U64, OFF(max_producers), "4096", "producer part connections at once"},
	{"max-models", FLAG_U64, OFF(max_models), "64", "models at once (at most 256)"},
	{"model-idle-s", FLAG_U64, OFF(model_idle_s), "86400", "remove a model with no producer, no consumer and no open version for this long, files too (0: never)"},
	{"read-cache-bytes", FLAG_U64, OFF(read_cache_bytes), "67108864", "--data-dir: bytes of payloads read from the segments kept for the other consumers about to take them (0: off)"},
	{"admin-socket", FLAG_STR, OFF(admin_socket), NULL, "PATH of a UNIX socket (mode 0600) for `deltacast model delete` (off without it)"},
	{"bulk", FLAG_STR, OFF(bulk), NULL, "IPv4:PORT for anchors sent to consumers over plain TCP, outside ZeroMQ, with sendfile(2) or a copy (--bulk-send; port 0: any free one; not with --curve-secret)"},
	{"bulk-send", FLAG_STR, OFF(bulk_send), "auto", "how --bulk sends a payload kept in a file: sendfile (the page cache's pages handed to the kernel), copy (read into a buffer, then send(): the broker copies, a receiver on this host pays less) or auto (copy to a peer on this host, sendfile to others)"},
	{"bulk-no-local", FLAG_BOOL, OFF(bulk_no_local), NULL, "no unix socket for --bulk: consumers and relays on this host connect over TCP too (by default they connect to @deltacast-bulk-PORT, take the payloads in the data dir's files by reference and read them themselves: no copy in the broker)"},
	{"bulk-threads", FLAG_U64, OFF(bulk_threads), "0", "threads that write --bulk transfers, each connection on one (its sending off the event loop); 0: half the CPUs, 2 to 8"},
	{"upstream-no-bulk", FLAG_BOOL, OFF(upstream_no_bulk), NULL, "take anchors from --upstream over ZeroMQ only (by default over its --bulk connection when it offers one; never with CURVE)"},
	{"cut-through", FLAG_BOOL, OFF(cut_through), NULL, "forward an open version's chunks to consumers as they arrive, before its COMMIT (relay trees)"},
	{"log-level", FLAG_STR, OFF(log_level), "info", "error, warn, info or debug"},
	/* security and observability (broker/auth.c, broker/metrics.c) */
	{"curve-secret", FLAG_STR, OFF(curve_secret), NULL, "FILE with the broker's Z85 CURVE secret key: CURVE on both sockets"},
	{"producer-keys", FLAG_STR, OFF(producer_keys), NULL, "FILE of producer Z85 public keys to admit, one a line (required with --curve-secret)"},
	{"consumer-keys", FLAG_STR, OFF(consumer_keys), NULL, "FILE of consumer Z85 public keys to admit (default: any CURVE client)"},
	{"upstream-curve-secret", FLAG_STR, OFF(upstream_curve_secret), NULL, "FILE with the relay's own Z85 CURVE secret key: CURVE to --upstream (with --upstream-server-key)"},
	{"upstream-server-key", FLAG_STR, OFF(upstream_server_key), NULL, "KEY: the upstream broker's Z85 public key (with --upstream-curve-secret)"},
	{"metrics", FLAG_STR, OFF(metrics), NULL, "HOST:PORT for GET /metrics (Prometheus text), e.g. 127.0.0.1:9464"},
	/* broker-made anchors (broker/fold.c) */
	{"anchor-fraction", FLAG_STR, OFF(anchor_fraction), "0.5", "make an anchor once delta bytes since the last one exceed F x the model's size (0: off)"},
	{"anchor-every", FLAG_U64, OFF(anchor_every), "0", "make an anchor every K versions (0: off)"},
	{"no-anchor-deltas", FLAG_BOOL, OFF(no_anchor_deltas), NULL, "send a producer's anchor whole to consumers that hold the version before it (by default, with broker-made anchors on, the broker makes them a delta from it)"},
	{"anchor-delta-max-ms", FLAG_U64, OFF(anchor_delta_max_ms), "0", "give up a producer anchor's delta not made within MS ms of the anchor's commit: the consumers waiting for it take the anchor whole (0: no limit)"},
};
#undef OFF


void broker_config_usage(FILE *to)
{
	fprintf(to, "usage: deltacast-broker --producers ENDPOINT --consumers ENDPOINT [options]\n"
		    "  --config FILE  read `name = value` lines (names as the long flags)\n"
		    "  --help         this text\n"
		    "  --version      the program's version and wire protocol, then exit\n");
	for (size_t i = 0; i < DCAST_ARRAY_LEN(flags); i++)
		fprintf(to, "  --%-22s %s%s%s%s\n", flags[i].name, flags[i].help,
			flags[i].def ? " [" : "", flags[i].def ? flags[i].def : "",
			flags[i].def ? "]" : "");
}

static const struct flag *flag_find(const char *name)
{
	for (size_t i = 0; i < DCAST_ARRAY_LEN(flags); i++)
		if (!strcmp(flags[i].name, name))
			return &flags[i];
	return NULL;
}

static int set_u64(uint64_t *dst, const char *name, const char *val)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(val, &end, 10);
	if (!*val || *end || errno || val[0] == '-')
		return dcast_fail(DCAST_EINVAL, "--%s: \"%s\" is not an unsigned integer", name, val);
	*dst = v;
	return 0;
}

/* A switch: 1/0, true/false, yes/no, on/off (a --config line's value). */
static int set_bool(int *dst, const char *name, const char *val)
{
	static const char *const on[] = {"1", "true", "yes", "on"}, *const off[] = {"0", "false", "no", "off"};

	for (size_t i = 0; i < DCAST_ARRAY_LEN(on); i++) {
		if (!strcmp(val, on[i]) || !strcmp(val, off[i])) {
			*dst = !strcmp(val, on[i]);
			return 0;
		}
	}
	return dcast_fail(DCAST_EINVAL, "--%s: \"%s\" is not a switch (1/0, true/false, yes/no, on/off)",
			  name, val);
}

static int flag_set(struct broker_config *cfg, const struct flag *f, const char *val)
{
	char *base = (char *)cfg + f->off;

	switch (f->kind) {
	case FLAG_STR:
		*(const char **)base = val;
		return 0;
	case FLAG_U64:
		return set_u64((uint64_t *)base, f->name, val);
	case FLAG_BOOL:
		return set_bool((int *)base, f->name, val);
	case FLAG_LIST:
		if (cfg->n_upstream_models >= BROKER_MAX_UPSTREAM_MODELS)
			return dcast_fail(DCAST_EINVAL, "--%s: more than %d given", f->name,
					  BROKER_MAX_UPSTREAM_MODELS);
		((const char **)base)[cfg->n_upstream_models++] = val;
		return 0;
	}
	return dcast_fail(DCAST_EINVAL, "--%s: bad flag kind", f->name);
}

/* A copy of s that cfg owns until broker_config_free. */
static char *keep(struct broker_config *cfg, const char *s)
{
	char *d;

	if (cfg->n_owned >= BROKER_CONFIG_OWNED || !(d = strdup(s)))
		return NULL;
	cfg->owned[cfg->n_owned++] = d;
	return d;
}

static char *trim(char *s)
{
	char *e;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
		*--e = 0;
	return s;
}

static int config_line(struct broker_config *cfg, char *line, const char *path, int lineno)
{
	char *eq, *key, *val;
	const struct flag *f;

	key = trim(line);
	if (!*key || *key == '#')
		return 0;
	if (!(eq = strchr(key, '=')))
		return dcast_fail(DCAST_EINVAL, "%s:%d: expected `name = value`", path, lineno);
	*eq = 0;
	key = trim(key);
	val = trim(eq + 1);
	if (!(f = flag_find(key)))
		return dcast_fail(DCAST_EINVAL, "%s:%d: unknown setting \"%s\"", path, lineno, key);
	if (!(val = keep(cfg, val)))
		return dcast_fail(DCAST_ENOMEM, "%s:%d: out of memory", path, lineno);
	return flag_set(cfg, f, val);
}

static int config_file(struct broker_config *cfg, const char *path)
{
	char line[4096];
	int lineno = 0, rc = 0;
	FILE *f = fopen(path, "r");

	if (!f)
		return dcast_fail(DCAST_EIO, "--config %s: %s", path, strerror(errno));
	while (!rc && fgets(line, sizeof(line), f) && lineno < 100000) {
		lineno++;
		if (!strchr(line, '\n') && !feof(f))
			rc = dcast_fail(DCAST_EINVAL, "%s:%d: line too long", path, lineno);
		else
			rc = config_line(cfg, line, path, lineno);
	}
	fclose(f);
	return rc;
}

static int set_defaults(struct broker_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	for (size_t i = 0; i < DCAST_ARRAY_LEN(flags); i++)
		if (flags[i].def) {
			int rc = flag_set(cfg, &flags[i], flags[i].def);
			if (rc)
				return rc;
		}
	return 0;
}

/* --config first, so that the command line overrides the file. */
static int find_config(int argc, char **argv, const char **path)
{
	*path = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
			return BROKER_CONFIG_HELP;
		if (!strcmp(argv[i], "--version"))
			return BROKER_CONFIG_VERSION;
		if (!strcmp(argv[i], "--config")) {
			if (i + 1 >= argc)
				return dcast_fail(DCAST_EINVAL, "--config: needs a FILE");
			*path = argv[++i];
		}
	}
	return 0;
}

/* A fault's number after its "NAME:", at most max, into *v. */
static int fault_num(const char *f, size_t skip, unsigned long long max, uint64_t *v)
{
	unsigned long long n;
	char *end;

	errno = 0;
	n = strtoull(f + skip, &end, 10);
	if (errno || end == f + skip || *end || n > max)
		return dcast_fail(DCAST_EINVAL, "DELTACAST_BROKER_FAULT=%s: the number must be 0..%llu", f,
				  max);
	*v = n;
	return 0;
}

/* DELTACAST_BROKER_FAULT (tests only), read once, here:
 * - slowdisk:MS: the durable writer sleeps MS ms before each COMMIT
 *   record and after each fsync, a slow disk at the writer's seam
 *   (broker/durable.c);
 * - nomap: every mmap of a segment fails, as on a file system without
 *   mmap (broker/ondisk.c);
 * - relay_bulk_cut:K: a relay's bulk connection from its upstream is cut
 *   after K CHUNK frames, as a network that drops it (broker/relaybulk.c);
 * - relay_bulk_hold:MS: a relay reads no frame of a bulk connection for
 *   MS ms after it opened, as a relay busy elsewhere (broker/relaybulk.c);
 * - bulk_ref_off:BYTES: the first local transfer (the unix socket) names every
 *   file offset BYTES too far, as a file changed under its reader
 *   (broker/bulk.c);
 * - bulk_noproc: a local transfer cannot reopen its files read-only, as
 *   without /proc, and sends their payloads inline (broker/bulk.c);
 * - slowfold:MS: each share of a producer anchor's delta starts MS ms
 *   late, as a fold of a model far larger (broker/folddelta.c). */
static int fault_env(struct broker_config *cfg)
{
	const char *f = getenv("DELTACAST_BROKER_FAULT");

	if (!f || !*f)
		return 0;
	cfg->fault_nomap = !strcmp(f, "nomap");
	cfg->fault_bulk_noproc = !strcmp(f, "bulk_noproc");
	if (cfg->fault_nomap || cfg->fault_bulk_noproc)
		return 0;
	if (!strncmp(f, "slowdisk:", 9))
		return fault_num(f, 9, 600000, &cfg->fault_slowdisk_ms);
	if (!strncmp(f, "relay_bulk_cut:", 15))
		return fault_num(f, 15, UINT32_MAX, &cfg->fault_relay_bulk_cut);
	if (!strncmp(f, "relay_bulk_hold:", 16))
		return fault_num(f, 16, 600000, &cfg->fault_relay_bulk_hold_ms);
	if (!strncmp(f, "bulk_ref_off:", 13))
		return fault_num(f, 13, (uint64_t)1 << 50, &cfg->fault_bulk_ref_off);
	if (!strncmp(f, "slowfold:", 9))
		return fault_num(f, 9, 600000, &cfg->fault_slowfold_ms);
	return dcast_fail(DCAST_EINVAL, "DELTACAST_BROKER_FAULT=%s: only slowdisk:MS, nomap, "
			  "relay_bulk_cut:K, relay_bulk_hold:MS, bulk_ref_off:BYTES, bulk_noproc and "
			  "slowfold:MS are known", f);
}

int broker_config_parse(struct broker_config *cfg, int argc, char **argv)
{
	const char *path;
	int rc = set_defaults(cfg);

	if (!rc)
		rc = find_config(argc, argv, &path);
	if (!rc && path)
		rc = config_file(cfg, path);
	if (!rc)
		rc = fault_env(cfg);
	for (int i = 1; !rc && i < argc; i++) {
		const struct flag *f;

		if (!strcmp(argv[i], "--config")) {
			i++;
			continue;
		}
		if (strncmp(argv[i], "--", 2) || !(f = flag_find(argv[i] + 2)))
			return dcast_fail(DCAST_EINVAL, "unknown argument \"%s\" (see --help)", argv[i]);
		if (f->kind == FLAG_BOOL) {
			rc = flag_set(cfg, f, "1");
			continue;
		}
		if (i + 1 >= argc)
			return dcast_fail(DCAST_EINVAL, "%s: needs a value", argv[i]);
		rc = flag_set(cfg, f, argv[++i]);
	}
	return rc;
}

static int need(int cond, const char *what)
{
	return cond ? 0 : dcast_fail(DCAST_EINVAL, "%s", what);
}

/* The relay's CURVE client needs both halves: its own key pair and the
 * upstream's public key (either alone cannot make a handshake). */
static int upstream_curve_check(const struct broker_config *c)
{
	int secret = c->upstream_curve_secret != NULL, server = c->upstream_server_key != NULL;
	int rc = 0;

	if (!rc) rc = need(!(secret || server) || c->upstream,
			   secret ? "--upstream-curve-secret given without --upstream ENDPOINT"
				  : "--upstream-server-key given without --upstream ENDPOINT");
	if (!rc) rc = need(!server || secret, "--upstream-server-key needs --upstream-curve-secret "
				      "FILE (the relay's own CURVE secret key)");
	if (!rc) rc = need(!secret || server, "--upstream-curve-secret needs --upstream-server-key "
				      "KEY (the upstream broker's Z85 public key)");
	return rc;
}

int broker_config_check(const struct broker_config *c)
{
	int rc = 0;

	if (!rc) rc = need(c->producers && *c->producers, "--producers ENDPOINT is required");
	if (!rc) rc = need(c->consumers && *c->consumers, "--consumers ENDPOINT is required");
	if (!rc) rc = need(!c->upstream || c->n_upstream_models,
			   "--upstream needs at least one --upstream-model NAME");
	if (!rc) rc = need(c->upstream || !c->n_upstream_models,
			   "--upstream-model given without --upstream ENDPOINT");
	if (!rc) rc = upstream_curve_check(c);
	if (!rc) rc = need(c->heartbeat_ms >= 10 && c->heartbeat_ms <= 3600000,
			   "--heartbeat-ms must be in [10, 3600000]");
	if (!rc) rc = need(c->io_threads <= 64, "--io-threads must be in [0, 64] (0: half the CPUs, 2 to 8)");
	if (!rc) rc = need(c->bulk_threads <= BROKER_BULK_THREADS_MAX, "--bulk-threads must be in [0, 16] (0: half the CPUs, 2 to 8)");
	if (!rc) rc = need(c->part_timeout_ms >= 1, "--part-timeout-ms must be at least 1");
	if (!rc) rc = need(c->retain_versions >= 1, "--retain-versions must be at least 1");
	if (!rc) rc = need(c->max_models >= 1 && c->max_models <= BROKER_MAX_MODELS,
			   "--max-models must be in [1, 256]");
	if (!rc) rc = need(c->max_consumers >= 1 && c->max_consumers <= 1000000,
			   "--max-consumers must be in [1, 1000000]");
	if (!rc) rc = need(c->max_producers >= 1 && c->max_producers <= 1000000,
			   "--max-producers must be in [1, 1000000]");
	if (!rc) rc = need(c->producer_window_bytes >= 1 &&
			   c->producer_window_bytes <= DCAST_MAX_CREDIT_BYTES,
			   "--producer-window-bytes must be in [1, 2^40]");
	if (!rc) rc = need(c->upstream_window_bytes >= 1 &&
			   c->upstream_window_bytes <= DCAST_MAX_CREDIT_BYTES,
			   "--upstream-window-bytes must be in [1, 2^40]");
	if (!rc) rc = need(!c->consumer_sndbuf_bytes ||
			   (c->consumer_sndbuf_bytes >= 4096 && c->consumer_sndbuf_bytes <= INT32_MAX),
			   "--consumer-sndbuf-bytes must be 0 or in [4096, 2147483647]");
	if (!rc) rc = need(c->model_idle_s <= 10ull * 365 * 86400,
			   "--model-idle-s must be at most 315360000 (10 years; 0 = never)");
	if (!rc) rc = need(!c->admin_socket || (*c->admin_socket && strlen(c->admin_socket) < 108),
			   "--admin-socket PATH must be a path of 1 to 107 bytes (a UNIX socket address)");
	if (!rc) rc = need(c->read_cache_bytes <= BROKER_DISK_INFLIGHT_BYTES,
			   "--read-cache-bytes must be at most 67108864 (64 MiB: what it keeps counts "
			   "among the bytes read from the data dir and not yet sent)");
	if (!rc) rc = need(!strcmp(c->bulk_send, "auto") || !strcmp(c->bulk_send, "sendfile") ||
			   !strcmp(c->bulk_send, "copy"), "--bulk-send must be auto, sendfile or copy");
	if (!rc) rc = broker_fold_config_check(c);
	return rc;
}

void broker_config_free(struct broker_config *cfg)
{
	while (cfg->n_owned)
		free(cfg->owned[--cfg->n_owned]);
}
