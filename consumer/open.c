/* The consumer object's life: options, open (pool, checkpoint, connect,
 * the session thread) and close.  At the top of consumer/: the calls on a
 * live consumer are api.c's. */
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>
#include "consumer_impl.h"
#include "dcast_slab.h" /* dcast_huge_pages */
#include "dcast_common.h"
#include "store/store.h"
#include "dcast_wire.h"

#define MIN_BUDGET (1u << 20)

void dcast_consumer_opts_init(dcast_consumer_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->verify_digests = 1;
	o->fold_every = 0;
	o->fold_fraction = 0.25;
	o->max_staged = 4;
	o->bulk = 1;
}

static int check_args(const char *endpoint, const char *model, const char *dir, uint64_t budget,
		      const dcast_consumer_opts *o)
{
	if (!endpoint || !*endpoint || !model || !*model || strlen(model) > DCAST_MAX_NAME || !dir || !*dir)
		return dcast_fail(DCAST_EINVAL, "dcast_consumer_open: endpoint, model (1..%d bytes) and dir "
				  "are required", DCAST_MAX_NAME);
	if (!strstr(endpoint, "://"))
		return dcast_fail(DCAST_EINVAL, "dcast_consumer_open: endpoint \"%s\" is not a ZeroMQ "
				  "endpoint (tcp://HOST:PORT, ipc://PATH or inproc://NAME)", endpoint);
	if (budget < MIN_BUDGET)
		return dcast_fail(DCAST_EINVAL, "dcast_consumer_open: staging budget %" PRIu64
				  " below the minimum of %u bytes", budget, MIN_BUDGET);
	if (o->curve_server_key && (!o->curve_public_key || !o->curve_secret_key))
		return dcast_fail(DCAST_EINVAL, "dcast_consumer_open: curve_server_key set but the "
				  "consumer's curve_public_key/curve_secret_key are missing");
	if (o->curve_server_key && (strlen(o->curve_server_key) != 40 || strlen(o->curve_public_key) != 40 ||
				    strlen(o->curve_secret_key) != 40))
		return dcast_fail(DCAST_EINVAL, "dcast_consumer_open: CURVE keys must be 40 Z85 characters");
	if (!(o->fold_fraction >= 0))
		return dcast_fail(DCAST_EINVAL, "dcast_consumer_open: fold_fraction %g is not >= 0",
				  o->fold_fraction);
	if (!o->curve_server_key && (o->curve_public_key || o->curve_secret_key))
		return dcast_fail(DCAST_EINVAL, "dcast_consumer_open: curve_public_key/curve_secret_key "
				  "given without curve_server_key (the broker's public key)");
	return 0;
}

static int make_paths(dcast_consumer *c, const char *dir, const char *endpoint)
{
	c->dir = strdup(dir);
	c->endpoint = strdup(endpoint);
	if (!c->dir || !c->endpoint)
		return dcast_fail(DCAST_ENOMEM, "paths");
	if (mkdir(dir, 0755) && errno != EEXIST)
		return dcast_fail(DCAST_EIO, "%s: mkdir: %s", dir, strerror(errno));
	return 0;
}

/* The pid DIR/lock names ("unknown" when it names none yet), into pid. */
static void lock_holder(int fd, char *pid, size_t cap)
{
	ssize_t n = pread(fd, pid, cap - 1, 0);

	pid[n > 0 ? n : 0] = '\0';
	pid[strspn(pid, "0123456789")] = '\0';
	if (!*pid)
		snprintf(pid, cap, "unknown");
}

/* One consumer per directory: DIR/lock is flock()ed for the consumer's
 * life (released at close, or when its process dies) and names its pid.
 * flock, not fcntl: two consumers in one process conflict too. */
static int dir_lock(dcast_consumer *c)
{
	char path[4096], pid[32];
	int fd, n;

	snprintf(path, sizeof(path), "%s/lock", c->dir);
	if ((fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0)
		return dcast_fail(DCAST_EIO, "%s: open: %s", path, strerror(errno));
	if (flock(fd, LOCK_EX | LOCK_NB)) {
		int e = errno;

		lock_holder(fd, pid, sizeof(pid));
		close(fd);
		if (e != EWOULDBLOCK)
			return dcast_fail(DCAST_EIO, "%s: flock: %s", path, strerror(e));
		return dcast_fail(DCAST_EBUSY, "dcast_consumer_open: %s is in use by another consumer "
				  "(pid %s holds %s); one consumer per directory", c->dir, pid, path);
	}
	n = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
	if (ftruncate(fd, 0))
		DCAST_LOG_W("consumer %s: %s: pid not written: %s", c->model, path, strerror(errno));
	else if (dcast_pwrite_full(fd, pid, (size_t)n, 0, path))
		DCAST_LOG_W("consumer %s: pid not written: %s", c->model, dcast_last_error());
	c->lock_fd = fd;
	return 0;
}

/* What the store reports: its replay (the version the tensors hold, and
 * each record file's version, applied) and its chunk records written, into
 * the version state machine (intake.c), and a failure of its fold thread,
 * kept for the next poll() as the session thread's own are; the run file
 * made durable before any state beside it (run.c). */
static const cs_store_sink store_sink = {cs_manifest_take, cs_intake_holds, cs_intake_replay_chunk,
					 cs_intake_replay_commit, cs_intake_apply, cs_intake_written,
					 cs_session_failed, cs_run_durable};

/* A local checkpoint that does not load (damaged, another format) is
 * dropped, not a reason to refuse to start: the broker has every committed
 * version, and the consumer fetches an anchor itself. */
static int load_or_drop(dcast_consumer *c)
{
	int err = cs_ckpt_load(c);

	if (err != DCAST_ECORRUPT && err != DCAST_EMALFORMED && err != DCAST_EPROTO_VERSION &&
	    err != DCAST_ESHAPE && err != DCAST_ETRUNCATED && err != DCAST_ETOO_LARGE && err != DCAST_EDTYPE)
		return err;
	DCAST_LOG_W("consumer %s: local checkpoint in %s dropped: %s; fetching an anchor", c->model,
		    c->dir, dcast_last_error());
	cs_forget_state(c);
	return 0;
}

static int connect_broker(dcast_consumer *c)
{
	if (!(c->ss.zctx = zmq_ctx_new()))
		return dcast_fail(DCAST_EZMQ, "zmq_ctx_new: %s", zmq_strerror(errno));
	return cs_session_start(c);
}

#define COMMIT_TIMEOUT_DEFAULT_MS 60000

/* opts.commit_timeout_ms 0: DELTACAST_COMMIT_TIMEOUT_MS, else the default.
 * Errors: DCAST_EINVAL naming the variable (not 1..2^32-1 ms). */
static int commit_timeout(dcast_consumer *c)
{
	const char *e = getenv("DELTACAST_COMMIT_TIMEOUT_MS");
	unsigned long long ms;
	char *end;

	if (c->opts.commit_timeout_ms)
		return 0;
	c->opts.commit_timeout_ms = COMMIT_TIMEOUT_DEFAULT_MS;
	if (!e || !*e)
		return 0;
	errno = 0;
	ms = strtoull(e, &end, 10);
	if (errno || *end || e[0] == '-' || !ms || ms > UINT32_MAX)
		return dcast_fail(DCAST_EINVAL, "DELTACAST_COMMIT_TIMEOUT_MS=%s: not a number of "
				  "milliseconds in [1, 4294967295]", e);
	c->opts.commit_timeout_ms = (uint32_t)ms;
	return 0;
}

/* DELTACAST_BULK=0 turns opts.bulk off (1 leaves it as given).  Errors:
 * DCAST_EINVAL naming the variable (neither 0 nor 1). */
static int bulk_option(dcast_consumer *c)
{
	const char *e = getenv("DELTACAST_BULK");

	if (!e || !*e || !strcmp(e, "1"))
		return 0;
	if (strcmp(e, "0"))
		return dcast_fail(DCAST_EINVAL, "DELTACAST_BULK=%s: neither 0 (anchors over ZeroMQ only) "
				  "nor 1", e);
	c->opts.bulk = 0;
	return 0;
}

/* The session uses the option strings long after open (HELLO.client at
 * every join, the CURVE keys on every new socket): c keeps copies, since
 * the caller's may be gone by then (a buffer on its stack). */
static void opts_keep(dcast_consumer *c)
{
	const char **keys[3] = {&c->opts.curve_server_key, &c->opts.curve_public_key,
				&c->opts.curve_secret_key};

	snprintf(c->opt_client, sizeof(c->opt_client), "%s", c->opts.client ? c->opts.client : "");
	c->opts.client = c->opt_client;
	for (int i = 0; i < 3; i++)
		if (*keys[i]) {
			snprintf(c->opt_curve[i], sizeof(c->opt_curve[i]), "%s", *keys[i]);
			*keys[i] = c->opt_curve[i];
		}
}

int dcast_consumer_open(const char *endpoint, const char *model, const char *dir,
			uint64_t staging_budget_bytes, const dcast_consumer_opts *opts,
			dcast_consumer **out)
{
	dcast_consumer *c = NULL;
	dcast_consumer_opts def;
	int err;

	if (!out)
		return dcast_fail(DCAST_EINVAL, "dcast_consumer_open: out is NULL");
	*out = NULL;
	if (!opts)
		dcast_consumer_opts_init(&def), opts = &def;
	if ((err = check_args(endpoint, model, dir, staging_budget_bytes, opts)))
		return err;
	if (!(c = calloc(1, sizeof(*c))))
		return dcast_fail(DCAST_ENOMEM, "consumer");
	c->opts = *opts;
	opts_keep(c);
	if (!c->opts.max_staged || c->opts.max_staged > CS_MAX_STAGED - 2)
		c->opts.max_staged = CS_MAX_STAGED - 2;
	snprintf(c->model, sizeof(c->model), "%s", model);
	c->budget = staging_budget_bytes;
	c->ss.drop_version = DCAST_VERSION_NONE;
	atomic_init(&c->applied, DCAST_VERSION_NONE);
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->ev_cv, NULL);
	pthread_mutex_init(&c->run_mu, NULL);
	c->ob.wake_fd = -1;
	c->lock_fd = -1;
	cs_bulk_init(c);
	cs_staged_open(c);
	cs_fault_parse(c);
	c->arena_huge = dcast_huge_pages(); /* the host copies (docs/operations.md, "Huge pages") */
	if ((err = commit_timeout(c)) || (err = bulk_option(c)) || (err = make_paths(c, dir, endpoint)) || (err = dir_lock(c)) ||
	    (err = cs_pool_open(&c->pool, staging_budget_bytes)))
		goto fail;
	if ((err = cs_store_open(c, &store_sink)) || (err = dcast_io_open(&c->io, CS_IO_DEPTH)))
		goto fail;
	cs_pool_attach(&c->pool, c->io);
	c->ss.window_bytes = c->pool.region_bytes;
	c->stats.version = DCAST_VERSION_NONE;
	cs_run_load(c);
	cs_bulk_resolve(c);
	if ((err = load_or_drop(c)) || (err = connect_broker(c)))
		goto fail;
	*out = c;
	return 0;
fail:
	dcast_consumer_close(&c);
	return err;
}

void dcast_consumer_close(dcast_consumer **cp)
{
	dcast_consumer *c = cp ? *cp : NULL;

	if (!c)
		return;
	cs_session_stop(c); /* the socket is ours again */
	cs_bulk_close(c);
	if (c->ss.sock) { /* BYE first: a fold below sends no heartbeats */
		dcast_msg m;
		dcast_msg_init(&m, DCAST_MSG_BYE);
		snprintf(m.u.bye.reason, sizeof(m.u.bye.reason), "consumer closing");
		dcast_wire_send(c->ss.sock, NULL, 0, &m, NULL, ZMQ_DONTWAIT);
	}
	cs_store_close(c, c->ss.fold_due); /* durable: what was committed, an anchor applied */
	if (c->ss.sock)
		zmq_close(c->ss.sock);
	if (c->ss.zctx)
		zmq_ctx_term(c->ss.zctx);
	cs_staged_close(c);
	dcast_io_close(&c->io);
	cs_dcache_clear(&c->dcache);
	cs_pool_close(&c->pool);
	cs_tensors_free(c);
	free(c->vs.pos), free(c->vs.ch), free(c->vs.buf);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->ev_cv);
	pthread_mutex_destroy(&c->run_mu);
	if (c->ob.wake_fd >= 0)
		close(c->ob.wake_fd);
	if (c->lock_fd >= 0)
		close(c->lock_fd); /* the directory is free for the next consumer */
	free(c->dir), free(c->endpoint);
	free(c);
	*cp = NULL;
}
