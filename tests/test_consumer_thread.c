/* The consumer lives on its own thread: with a real broker and
 * producer over loopback,
 * - a caller that does not call in for 10 s (5 heartbeat timeouts at the
 *   default 1 s) stays joined (no re-join, no HELLO again) and, when it
 *   finally calls apply(), takes the newest version bit-exact;
 * - wait_version() returns in a thread of its own while nobody polls and
 *   another thread only applies at its pause points;
 * - with auto_apply, nobody calls anything and wait_version() still
 *   returns, the tensors bit-exact;
 * - folding happens on the consumer's thread, never inside apply(): the
 *   log of applied deltas is folded by size and apply() of a delta never
 *   writes the model file;
 * - a fold runs from the disk without the consumer's lock: held at its
 *   start (test fault foldhold), deltas are applied meanwhile, bit-exact;
 *   released, it writes the anchor it was asked for (the model file at
 *   the version applied when it began, later versions still in the log),
 *   and a reopen rebuilds the newest (and removes a fold's torn temporary
 *   file); a fold that finds a damaged record file is done from the live
 *   tensors instead (the newest version);
 * - a fold from the disk across versions whose chunk ranges differ (a
 *   producer restarted with another chunk size) applies them in version
 *   order, in memory and through shared maps, and writes the newest
 *   version bit-exact; one that finds a record file damaged meanwhile is
 *   done from the live tensors instead, with the same result; one of 70
 *   record files, more than it keeps open, reads them all;
 * - a version announced READY stays applicable across a re-join: the
 *   broker stops (SIGSTOP), the consumer takes it for dead and joins again,
 *   and apply() of the READY version still succeeds, bit-exact;
 * - the run file is made durable before the anchor's seal: with it gone,
 *   nothing is sealed or folded. */
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "consumer_harness.h"

#define BUDGET (8u << 20)

static char root[64] = "/tmp/dcast-cthread.XXXXXX";

static const char *dir_for(const char *name)
{
	static char path[8][256];
	static int next;
	char *p = path[next++ % 8];

	snprintf(p, 256, "%s/%s", root, name);
	return p;
}

static dcast_consumer *open_with(const h_broker *b, const char *model, int auto_apply)
{
	dcast_consumer_opts o;
	dcast_consumer *c = NULL;

	dcast_consumer_opts_init(&o);
	o.auto_apply = auto_apply;
	CHECK(dcast_consumer_open(b->consumers, model, dir_for(model), BUDGET, &o, &c) == 0);
	return c;
}

/* Wait (bounded, 20 s) until `v` is READY; apply nothing. */
static int ready_within(dcast_consumer *c, uint64_t v)
{
	for (int i = 0; i < 200; i++) {
		dcast_event ev;
		uint64_t r = dcast_consumer_ready_version(c);
		if (r != DCAST_VERSION_NONE && r >= v)
			return 1;
		if (dcast_consumer_poll(c, 100, &ev))
			return 0;
	}
	return 0;
}

static void test_sleeping_caller(const h_broker *b)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;
	dcast_consumer_stats st;

	REQUIRE(h_model_start(b, "m_sleep", 51, 1, 100, &m, &p) == 0);
	REQUIRE((c = open_with(b, "m_sleep", 0)));
	REQUIRE(ready_within(c, 1));
	CHECK(dcast_consumer_apply(c, 1) == 0);
	/* The caller generates for 10 s without calling in; the trainer
	 * publishes a version every 2 s meanwhile.  The sleep is the scenario
	 * (time away), not a wait for anything. */
	for (uint64_t v = 2; v <= 6; v++) {
		tp_sleep_ms(2000);
		CHECK(h_publish(p, &m, v, 100) == 0);
	}
	CHECK(ready_within(c, 6));
	CHECK(dcast_consumer_apply(c, dcast_consumer_ready_version(c)) == 0);
	CHECK(dcast_consumer_version(c) == 6);
	CHECK(h_equal(c, &m, 6));
	dcast_consumer_stats_get(c, &st);
	printf("sleeping caller: version %llu after 10 s away, %llu re-joins\n",
	       (unsigned long long)st.version, (unsigned long long)st.rejoins);
	CHECK(st.rejoins == 0);
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* Nobody polls: one thread waits for `target`; the "engine" (this thread)
 * applies at its pause points, or with auto_apply does nothing at all. */
static void wait_case(const h_broker *b, const char *model, uint64_t seed, int auto_apply, uint64_t target)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;
	pthread_t t;

	h_model_init(&m, seed, 1);
	REQUIRE(h_producer_open(b, model, &m, &p) == 0);
	REQUIRE((c = open_with(b, model, auto_apply)));
	h_waiter w = {c, target, -1};
	REQUIRE(pthread_create(&t, NULL, h_wait_thread, &w) == 0);
	for (uint64_t v = 1; v <= target; v++)
		CHECK(h_publish(p, &m, v, 100) == 0);
	for (int i = 0; !auto_apply && i < 400 && dcast_consumer_version(c) != target; i++) {
		uint64_t r = dcast_consumer_ready_version(c);
		if (r != DCAST_VERSION_NONE)
			CHECK(dcast_consumer_apply(c, r) == 0);
		tp_sleep_ms(50); /* the scenario: the engine's work between pause points */
	}
	pthread_join(t, NULL);
	CHECK(w.rc == 0);
	CHECK(h_equal(c, &m, target));
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

static long mtime_ns(const char *path)
{
	struct stat st;

	return stat(path, &st) ? -1 : st.st_mtim.tv_sec * 1000000000L + st.st_mtim.tv_nsec;
}

/* The model file's inode (a fold renames a new one over it), -1: none. */
static long file_ino(const char *path)
{
	struct stat st;

	return stat(path, &st) ? -1 : (long)st.st_ino;
}

static long fold_before; /* the model file's inode before the fold waited for */

/* Ready: the model file at path has been replaced since fold_before. */
static int folded(void *path)
{
	return file_ino(path) != fold_before;
}

/* Bytes written to c's record log, from its stats. */
static uint64_t log_bytes(dcast_consumer *c)
{
	dcast_consumer_stats st;

	dcast_consumer_stats_get(c, &st);
	return st.log_write_bytes;
}

/* apply() of a delta never writes model.safetensors; the size policy folds
 * on the consumer's thread once the log written since the last fold passes
 * a quarter of the model, and only then: the test knows from the log's
 * bytes which applies are followed by a fold, and waits for those (the
 * file renamed over; a fold punches the old one as it goes, so only an
 * apply that no fold follows must leave its mtime as it was). */
static void test_fold_off_apply(const h_broker *b)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;
	char file[512];
	uint64_t folded_at;
	int folds = 0;

	REQUIRE(h_model_start(b, "m_fold", 54, 1, 100, &m, &p) == 0);
	REQUIRE((c = open_with(b, "m_fold", 0)));
	snprintf(file, sizeof(file), "%s/model.safetensors", dir_for("m_fold"));
	REQUIRE(ready_within(c, 1));
	fold_before = -1;
	CHECK(dcast_consumer_apply(c, 1) == 0);
	CHECK(tp_wait_until(5000, folded, file)); /* an applied anchor always folds */
	folded_at = log_bytes(c);
	for (uint64_t v = 2; v <= 12; v++) {
		int due;
		CHECK(h_publish(p, &m, v, 4) == 0); /* 25% density: a fold every few versions */
		REQUIRE(ready_within(c, v));
		due = (double)(log_bytes(c) - folded_at) > 0.25 * (double)h_model_bytes(&m);
		long mtime = mtime_ns(file);
		fold_before = file_ino(file);
		CHECK(dcast_consumer_apply(c, v) == 0);
		CHECK(file_ino(file) == fold_before); /* not inside apply() */
		CHECK(due || mtime_ns(file) == mtime); /* a fold due after it may punch the file already */
		if (!due)
			continue;
		CHECK(tp_wait_until(5000, folded, file)); /* on the consumer's thread */
		folded_at = log_bytes(c);
		folds++;
	}
	printf("fold policy: %d folds in 11 deltas of 25%% density\n", folds);
	CHECK(folds >= 1 && folds <= 10);
	CHECK(h_equal(c, &m, 12));
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

static int fold_state(dcast_consumer *c, uint64_t *folds)
{
	dcast_consumer_stats st;

	dcast_consumer_stats_get(c, &st);
	*folds = st.folds;
	return st.folding;
}

/* Wait (10 s at most, polling events) until a fold runs, or until `done`
 * folds are finished and none runs. */
static int fold_within(dcast_consumer *c, int running, uint64_t done)
{
	for (int i = 0; i < 100; i++) {
		dcast_event ev;
		uint64_t n;
		int now = fold_state(c, &n);
		if (running ? now : !now && n >= done)
			return 1;
		(void)dcast_consumer_poll(c, 100, &ev);
	}
	return 0;
}

/* Flip one byte in the middle of dir's file `name`. */
static void damage_file(const char *dir, const char *name)
{
	char path[512];
	struct stat st;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	REQUIRE(stat(path, &st) == 0);
	h_flip_byte(path, (long)(st.st_size / 2), SEEK_SET, 0x40);
}

/* A copy of dir_for(model) as a crash would leave it now, opened (it
 * reaches `want` with the broker's help; `loads`: the version it loads
 * from the copy itself, NONE for none).  Before the anchor's apply,
 * model.safetensors.new was never checked: the open removes it and the
 * broker sends the anchor again.  After it, while the seal waits,
 * model.safetensors.applied and the record files of deltas 2..4: the open
 * seals it (fdatasync, rename), the load checks its digest, and the
 * deltas replay on it, with nothing fetched. */
static void crash_copy(const h_broker *b, const h_model *m, const char *model, const char *tag, uint64_t loads,
		       uint64_t want)
{
	char crash[256], cmd[1200], path[512];
	dcast_consumer *c = NULL;
	dcast_consumer_opts o;
	dcast_consumer_stats st;

	snprintf(crash, sizeof(crash), "%s_%s", model, tag);
	snprintf(cmd, sizeof(cmd), "cp -a '%s' '%s'", dir_for(model), dir_for(crash));
	REQUIRE(system(cmd) == 0);
	dcast_consumer_opts_init(&o);
	o.auto_apply = 1;
	CHECK(dcast_consumer_open(b->consumers, model, dir_for(crash), BUDGET, &o, &c) == 0);
	REQUIRE(c);
	CHECK(dcast_consumer_version(c) == loads);
	snprintf(path, sizeof(path), "%s/model.safetensors.new", dir_for(crash));
	CHECK(access(path, F_OK) != 0);
	snprintf(path, sizeof(path), "%s/model.safetensors.applied", dir_for(crash));
	CHECK(access(path, F_OK) != 0);
	CHECK(dcast_consumer_wait_version(c, want, 20000) == 0 && h_equal(c, m, want));
	dcast_consumer_stats_get(c, &st);
	CHECK(loads == DCAST_VERSION_NONE ? st.total_bytes_received >= h_model_bytes(m) : st.total_bytes_received == 0);
	dcast_consumer_close(&c);
}

/* The anchor's seal (it was written straight to model.safetensors.new,
 * with no record file, renamed .applied at its apply), held at its start:
 * deltas 2..4 are applied while it waits (apply() does not wait for it);
 * crash copies taken before the apply and while the seal waits; released,
 * model.safetensors holds version 1.  A reopen reaches 4 from the file
 * and the records; or, when a byte of the .applied file was flipped while
 * the seal waited (the seal reads nothing back), the load refuses the
 * file's digest and the broker brings the consumer to 4. */
static void fold_held_case(const h_broker *b, const char *model, int damage)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;
	int hold[2], fd;
	char env[32], junk[512];
	dcast_consumer_stats st;
	uint64_t n;

	REQUIRE(pipe(hold) == 0);
	snprintf(env, sizeof(env), "foldhold:%d", hold[0]);
	setenv("DELTACAST_CONSUMER_FAULT", env, 1);
	REQUIRE(h_model_start(b, model, 55 + damage, 1, 100, &m, &p) == 0);
	c = open_with(b, model, 0);
	unsetenv("DELTACAST_CONSUMER_FAULT");
	REQUIRE(c);
	REQUIRE(ready_within(c, 1));
	if (!damage)
		crash_copy(b, &m, model, "ready", DCAST_VERSION_NONE, 1);
	CHECK(dcast_consumer_apply(c, 1) == 0);
	CHECK(fold_within(c, 1, 0)); /* the applied anchor's seal began, and waits */
	for (uint64_t v = 2; v <= 4; v++) {
		CHECK(h_publish(p, &m, v, 100) == 0);
		REQUIRE(ready_within(c, v));
		CHECK(dcast_consumer_apply(c, v) == 0);
		CHECK(h_equal(c, &m, v));
		CHECK(fold_state(c, &n) == 1 && n == 0); /* still held: apply() did not wait for it */
	}
	snprintf(junk, sizeof(junk), "%s/model.safetensors.applied", dir_for(model));
	CHECK(access(junk, F_OK) == 0); /* the anchor, written straight there, not sealed yet */
	CHECK(h_file_version(dir_for(model)) == 0 && !h_rec_exists(dir_for(model), 1));
	if (damage)
		damage_file(dir_for(model), "model.safetensors.applied");
	else
		crash_copy(b, &m, model, "applied", 4, 4);
	REQUIRE(write(hold[1], "g", 1) == 1); /* the seal */
	CHECK(fold_within(c, 0, 1)); /* and no fold after it: deltas 2..4 log far less than the policy's quarter */
	CHECK(h_file_version(dir_for(model)) == 1u); /* sealed: fdatasync and rename, nothing read back */
	CHECK(access(junk, F_OK) != 0);
	close(hold[1]); /* a fold still to come reads EOF: nothing holds it */
	dcast_consumer_close(&c);
	snprintf(junk, sizeof(junk), "%s/model.safetensors.fold", dir_for(model));
	REQUIRE((fd = open(junk, O_WRONLY | O_CREAT | O_TRUNC, 0644)) >= 0); /* as a fold killed midway */
	REQUIRE(write(fd, "torn", 4) == 4);
	close(fd);
	c = open_with(b, model, damage);
	REQUIRE(c);
	CHECK(access(junk, F_OK) != 0); /* the open removed it */
	/* damaged: the load refuses the file's digest, drops it, and the
	 * broker's anchor and deltas bring the consumer to 4 */
	CHECK(dcast_consumer_version(c) == (damage ? DCAST_VERSION_NONE : 4u));
	CHECK(dcast_consumer_wait_version(c, 4, 20000) == 0 && h_equal(c, &m, 4));
	dcast_consumer_stats_get(c, &st);
	CHECK(damage ? st.total_bytes_received >= h_model_bytes(&m) : st.total_bytes_received == 0);
	dcast_consumer_close(&c);
	close(hold[0]);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* Does dir's model.safetensors hold version v of m, byte for byte? */
static int file_equal(const char *dir, const h_model *m, uint64_t v)
{
	char path[512];
	dcast_st_file *f = NULL;
	size_t hdr = 0;
	int fd, same = 0;

	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	if (dcast_st_open(path, &f) != 0 || (fd = open(path, O_RDONLY)) < 0) {
		dcast_st_close(&f);
		return 0;
	}
	dcast_st_header_bytes(f, &hdr);
	for (int t = 0; t < H_TENSORS; t++) {
		const dcast_st_tensor *s = dcast_st_find(f, m->name[t]);
		unsigned char *buf = malloc(m->bytes[t]);
		same = s && buf && s->nbytes == m->bytes[t] &&
		       pread(fd, buf, m->bytes[t], (off_t)(hdr + s->data_offset)) == (ssize_t)m->bytes[t] &&
		       !memcmp(buf, m->snap[v][t], m->bytes[t]);
		free(buf);
		if (!same)
			break;
	}
	close(fd);
	dcast_st_close(&f);
	return same;
}

/* A fold from the disk across versions whose chunk ranges differ: deltas
 * in chunks of 32768 elements, then a restarted producer's in chunks of
 * 32767 (its first version an anchor, kept as a record file: the consumer
 * held a version), then its delta.  Every old range overlaps two new ones,
 * so each tensor is one group of overlapping ranges from all four record
 * files: the bf16 tensor's (12.6 MB) patched in memory, the f32 one's
 * (19.7 MB, over the fold's 16 MiB window) chunk by chunk through shared
 * maps.  Both must apply the chunks in version order.  The policy's fold
 * (every 4 records; held at its start, test fault foldhold) reads the disk
 * alone, and model.safetensors holds the newest version bit-exact.  With
 * `damage`, a byte of version 3's record file is flipped while the fold
 * is held: the fold refuses it and is done from the live tensors instead
 * (counted), with the same file in the end. */
static void fold_shifted_case(const h_broker *b, const char *model, int damage)
{
	dcast_consumer_opts o;
	dcast_consumer *c = NULL;
	dcast_consumer_stats st;
	dcast_producer *p = NULL;
	const char *dir = dir_for(model);
	int hold[2];
	char env[32];
	h_model m;

	dcast_consumer_opts_init(&o);
	o.auto_apply = 1;
	o.fold_fraction = 0;
	o.fold_every = 4;
	REQUIRE(pipe(hold) == 0 && write(hold[1], "g", 1) == 1); /* the anchor's seal goes through */
	snprintf(env, sizeof(env), "foldhold:%d", hold[0]);
	setenv("DELTACAST_CONSUMER_FAULT", env, 1);
	h_model_init(&m, 61 + damage, 24);
	REQUIRE(h_producer_open(b, model, &m, &p) == 0);
	REQUIRE(dcast_consumer_open(b->consumers, model, dir, BUDGET, &o, &c) == 0);
	unsetenv("DELTACAST_CONSUMER_FAULT");
	for (uint64_t v = 1; v <= 3; v++)
		CHECK(h_publish(p, &m, v, 100) == 0);
	CHECK(dcast_consumer_wait_version(c, 3, 20000) == 0 && h_equal(c, &m, 3));
	dcast_producer_close(&p);
	h_range_elems = 32767;
	REQUIRE(h_producer_open(b, model, &m, &p) == 0);
	h_range_elems = 32768;
	for (uint64_t v = 4; v <= 5; v++)
		CHECK(h_publish(p, &m, v, 100) == 0);
	CHECK(dcast_consumer_wait_version(c, 5, 20000) == 0 && h_equal(c, &m, 5));
	CHECK(fold_within(c, 1, 0)); /* the fold of versions 2..5, planned and held */
	if (damage)
		damage_file(dir, "model.dlog/00000000000000000003.rec");
	REQUIRE(write(hold[1], "g", 1) == 1);
	CHECK(fold_within(c, 0, 2)); /* the anchor's seal, then that fold */
	dcast_consumer_stats_get(c, &st);
	printf("fold over shifted ranges%s: file version %" PRIu64 ", %" PRIu64 " folds, %" PRIu64
	       " from the tensors\n", damage ? ", a record file damaged" : "", h_file_version(dir), st.folds,
	       st.folds_from_tensors);
	CHECK(h_file_version(dir) == 5 && file_equal(dir, &m, 5));
	CHECK(st.folds_from_tensors == (damage ? 1u : 0u));
	for (uint64_t v = 2; v <= 5; v++)
		CHECK(!h_rec_exists(dir, v));
	dcast_consumer_close(&c);
	close(hold[0]), close(hold[1]);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* A fold from the disk of 70 record files, more than it keeps open at
 * once (64): every group of chunk ranges needs a payload from each, so
 * files are closed and opened again along the way; the file ends as the
 * newest version, bit-exact, from the disk alone.  (The model's snapshots
 * hold 31 versions: the newest goes into the last one.) */
static void test_fold_many_files(const h_broker *b)
{
	dcast_consumer_opts o;
	dcast_consumer *c = NULL;
	dcast_consumer_stats st;
	dcast_producer *p = NULL;
	const char *dir = dir_for("m_many");
	h_model m;

	dcast_consumer_opts_init(&o);
	o.auto_apply = 1;
	o.fold_fraction = 0;
	o.fold_every = 70;
	h_model_init(&m, 62, 1);
	REQUIRE(h_producer_open(b, "m_many", &m, &p) == 0);
	REQUIRE(dcast_consumer_open(b->consumers, "m_many", dir, BUDGET, &o, &c) == 0);
	for (uint64_t v = 1; v <= 71; v++) {
		if (v > 1)
			h_model_step(&m, 100);
		CHECK(dcast_producer_publish(p, v) == 0 && dcast_producer_wait(p, v, 20000) == 0);
	}
	h_model_snap(&m, 31);
	CHECK(dcast_consumer_wait_version(c, 71, 20000) == 0 && h_equal(c, &m, 31));
	CHECK(fold_within(c, 0, 2)); /* the anchor's seal, then the fold of versions 2..71 */
	dcast_consumer_stats_get(c, &st);
	printf("fold of 70 record files: file version %" PRIu64 ", %" PRIu64 " folds, %" PRIu64
	       " from the tensors\n", h_file_version(dir), st.folds, st.folds_from_tensors);
	CHECK(h_file_version(dir) == 71 && file_equal(dir, &m, 31));
	CHECK(st.folds_from_tensors == 0 && !h_rec_exists(dir, 2) && !h_rec_exists(dir, 71));
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* Poll until an ERROR event with `code` (10 s at most). */
static int error_event_within(dcast_consumer *c, int code)
{
	for (int i = 0; i < 100; i++) {
		dcast_event ev;
		if (dcast_consumer_poll(c, 100, &ev) == 0 && ev.type == DCAST_EV_ERROR && ev.code == code) {
			printf("  event: %s: %s\n", dcast_errname(ev.code), ev.text);
			return 1;
		}
	}
	return 0;
}

/* A misconfigured consumer says so within seconds. */
static void test_misconfigured(const h_broker *b)
{
	dcast_consumer_opts o;
	dcast_consumer *c = NULL;
	char nobody[64];
	int port;

	printf("misconfigured consumers:\n");
	dcast_consumer_opts_init(&o);
	o.heartbeat_ms = 200;
	CHECK_ERR(dcast_consumer_open("127.0.0.1:5556", "m", dir_for("bad0"), BUDGET, &o, &c), DCAST_EINVAL);
	CHECK(strstr(dcast_last_error(), "not a ZeroMQ endpoint") != NULL);
	REQUIRE(sscanf(strrchr(b->consumers, ':') + 1, "%d", &port) == 1);
	snprintf(nobody, sizeof(nobody), "tcp://127.0.0.1:%d", port + 2); /* nothing listens */
	REQUIRE(dcast_consumer_open(nobody, "m", dir_for("bad1"), BUDGET, &o, &c) == 0);
	CHECK(error_event_within(c, DCAST_ETIMEDOUT));
	dcast_consumer_close(&c);
	REQUIRE(dcast_consumer_open(b->producers, "m", dir_for("bad2"), BUDGET, &o, &c) == 0);
	CHECK(error_event_within(c, DCAST_EFIELD_RANGE)); /* the producer endpoint */
	dcast_consumer_close(&c);
}

/* READY is a promise.  Before, a re-join dropped every
 * staged version and apply() of one announced READY gave DCAST_ESTATE. */
static void test_ready_survives_rejoin(h_broker *b)
{
	dcast_consumer_opts o;
	dcast_consumer *c = NULL;
	dcast_consumer_stats st = {0};
	dcast_producer *p = NULL;
	h_model m;

	REQUIRE(h_model_start(b, "m_rejoin", 54, 1, 100, &m, &p) == 0);
	dcast_consumer_opts_init(&o);
	o.heartbeat_ms = 200;
	REQUIRE(dcast_consumer_open(b->consumers, "m_rejoin", dir_for("m_rejoin"), BUDGET, &o, &c) == 0);
	REQUIRE(ready_within(c, 1));
	REQUIRE(kill(b->pid, SIGSTOP) == 0);
	for (int i = 0; i < 200 && st.rejoins == 0; i++) { /* silent 3 x 200 ms: joins again */
		tp_sleep_ms(50);
		dcast_consumer_stats_get(c, &st);
	}
	CHECK(st.rejoins >= 1);
	CHECK_ERR(dcast_consumer_apply(c, 1), 0); /* the broker is still stopped */
	CHECK(h_equal(c, &m, 1));
	REQUIRE(kill(b->pid, SIGCONT) == 0);
	CHECK(h_publish(p, &m, 2, 100) == 0);
	CHECK(ready_within(c, 2));
	CHECK(dcast_consumer_apply(c, 2) == 0);
	CHECK(h_equal(c, &m, 2));
	printf("ready across a re-join: %llu re-joins, version %llu\n", (unsigned long long)st.rejoins,
	       (unsigned long long)dcast_consumer_version(c));
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* The run file (DIR/run) is on the disk before any state beside it: the
 * WELCOME writes it without an fsync (none holds up the join), and the
 * anchor's seal syncs it first.  Held at its start (foldhold), the seal
 * finds the run file gone: it seals nothing, nor does the fold from the
 * tensors it falls back to, so no model.safetensors of an unnamed run is
 * made durable. */
static void run_file_case(const h_broker *b, const char *model)
{
	char env[32], run[512], saved[520];
	dcast_producer *p = NULL;
	dcast_consumer *c;
	uint64_t folds = 0;
	int hold[2];
	h_model m;

	REQUIRE(pipe(hold) == 0);
	snprintf(env, sizeof(env), "foldhold:%d", hold[0]);
	setenv("DELTACAST_CONSUMER_FAULT", env, 1);
	REQUIRE(h_model_start(b, model, 57, 1, 100, &m, &p) == 0);
	c = open_with(b, model, 0);
	unsetenv("DELTACAST_CONSUMER_FAULT");
	REQUIRE(c);
	REQUIRE(ready_within(c, 1));
	CHECK(dcast_consumer_apply(c, 1) == 0);
	CHECK(fold_within(c, 1, 0)); /* the seal began, and waits */
	snprintf(run, sizeof(run), "%s/run", dir_for(model));
	snprintf(saved, sizeof(saved), "%s.saved", run);
	REQUIRE(rename(run, saved) == 0);
	REQUIRE(write(hold[1], "g", 1) == 1);
	CHECK(fold_within(c, 0, 0));
	CHECK(fold_state(c, &folds) == 0 && folds == 0); /* neither the seal nor the fold from the tensors */
	CHECK(h_file_version(dir_for(model)) == 0);
	REQUIRE(rename(saved, run) == 0);
	close(hold[1]); /* nothing holds a fold at close */
	dcast_consumer_close(&c);
	close(hold[0]);
	dcast_producer_close(&p);
	h_model_free(&m);
}

int main(void)
{
	h_broker b;

	REQUIRE(mkdtemp(root));
	REQUIRE(h_broker_start_args(&b, NULL) == 0);
	wait_case(&b, "m_wait", 52, 0, 4);
	wait_case(&b, "m_auto", 53, 1, 5);
	test_fold_off_apply(&b);
	fold_held_case(&b, "m_hold", 0);
	fold_held_case(&b, "m_hold_bad", 1);
	fold_shifted_case(&b, "m_shift", 0);
	fold_shifted_case(&b, "m_shift_bad", 1);
	test_fold_many_files(&b);
	test_misconfigured(&b);
	test_sleeping_caller(&b);
	test_ready_survives_rejoin(&b);
	run_file_case(&b, "m_runfile");
	h_broker_stop(&b);
	return check_done("test_consumer_thread");
}
