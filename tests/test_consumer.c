/* Consumer end to end with the real broker binary and the producer library
 * over loopback TCP: anchor then deltas applied bit-exact with a staging
 * budget smaller than the model (chunks spill to the on-disk log and apply
 * reads them back), a clean restart from the local checkpoint without the
 * anchor again, a corrupt chunk refused with live tensors untouched, a
 * digest failure rolled back exactly, a gap detected and healed.
 * tests/test_consumer_plain.sh runs it again with DELTACAST_IO_URING=0. */
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include "check.h"
#include "consumer_harness.h"
#include "dcast_common.h"
#include "dcast_reclog.h"

#define BUDGET (1u << 20)

static char root[] = "/tmp/dcast-consumer-XXXXXX";

/* Offset of the first CHUNK record's payload in a record file (the
 * layout of common/dcast_reclog.h: kind at 4, header_len at 8, payload_len
 * at 12), or -1. */
static long first_payload(FILE *f)
{
	uint8_t p[DCAST_REC_PREFIX];
	uint32_t hl, pl;

	for (long off = 0; fseek(f, off, SEEK_SET) == 0 && fread(p, 1, sizeof(p), f) == sizeof(p);) {
		memcpy(&hl, p + 8, 4);
		memcpy(&pl, p + 12, 4);
		if (p[4] == DCAST_REC_CHUNK && pl > 5)
			return off + (long)DCAST_REC_PREFIX + (long)hl;
		off += (long)DCAST_REC_PREFIX + (long)hl + (long)pl;
	}
	return -1;
}

static const char *dir_for(const char *name)
{
	static char path[256];
	snprintf(path, sizeof(path), "%s/%s", root, name);
	return path;
}

static dcast_consumer *open_consumer(const h_broker *b, const char *model, const char *dir)
{
	dcast_consumer *c = NULL;
	CHECK(dcast_consumer_open(b->consumers, model, dir, BUDGET, NULL, &c) == 0);
	return c;
}

/* open_consumer with the test fault `fault` (DELTACAST_CONSUMER_FAULT,
 * consumer/fault.c) armed; the variable is cleared again. */
static dcast_consumer *open_faulted(const h_broker *b, const char *model, const char *dir, const char *fault)
{
	dcast_consumer *c;

	setenv("DELTACAST_CONSUMER_FAULT", fault, 1);
	c = open_consumer(b, model, dir);
	unsetenv("DELTACAST_CONSUMER_FAULT");
	return c;
}

/* A file at path (a char *) with bytes in it: tp_wait_until's test. */
static int file_written(void *path)
{
	struct stat st;

	return stat(path, &st) == 0 && st.st_size > 0;
}

static int wait_ready(dcast_consumer *c, uint64_t v);

/* Does DIR(name)/model.dlog hold the record file of version v? */
static int rec_exists(const char *name, uint64_t v)
{
	return h_rec_exists(dir_for(name), v);
}

/* Anchor + deltas bit-exact, model larger than the budget, restart.  The
 * consumer holds no version and its tensors are its own, so the anchor is
 * received in place (docs/protocol.md, "Anchors received in place"). */
static void test_stream_and_restart(const h_broker *b)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;
	dcast_consumer_stats st;
	h_seen s = {0};

	h_model_init(&m, 11, 1);
	REQUIRE(h_model_bytes(&m) > BUDGET);
	REQUIRE(h_producer_open(b, "m_stream", &m, &p) == 0);
	REQUIRE(h_publish(p, &m, 1, 100) == 0);
	c = open_consumer(b, "m_stream", dir_for("stream"));
	REQUIRE(c);
	CHECK(dcast_consumer_version(c) == DCAST_VERSION_NONE);
	CHECK(h_drive(c, &m, 1, &s) == 0);
	CHECK(h_equal(c, &m, 1));
	dcast_consumer_stats_get(c, &st);
	CHECK(st.anchor == 1 && st.version == 1);
	CHECK(st.bytes == h_model_bytes(&m));
	CHECK(st.spilled_chunks == 0);           /* in place: nothing staged, nothing spilled */
	/* written behind from the tensors straight to model.safetensors.new
	 * (no record file), sealed in the background once applied, or here */
	CHECK(!rec_exists("stream", 1));
	CHECK(dcast_consumer_checkpoint(c) == 0 && h_file_version(dir_for("stream")) == 1);
	CHECK(st.pool_bytes <= BUDGET && st.peak_pool_bytes <= st.pool_bytes);
	CHECK(s.anchors == 1);
	CHECK(dcast_consumer_wait_version(c, 1, 0) == 0);
	CHECK_ERR(dcast_consumer_wait_version(c, 2, 10), DCAST_ETIMEDOUT);
	h_waiter w = {c, 3, -1};
	pthread_t th;
	REQUIRE(pthread_create(&th, NULL, h_wait_thread, &w) == 0);
	for (uint64_t v = 2; v <= 4; v++) {
		REQUIRE(h_publish(p, &m, v, 100) == 0);
		CHECK(h_drive(c, &m, v, &s) == 0);
		if (v == 3) {
			pthread_join(th, NULL);
			CHECK(w.rc == 0);
		}
		CHECK(h_equal(c, &m, v));
		dcast_consumer_stats_get(c, &st);
		CHECK(st.version == v && st.anchor == 0 && st.bytes < h_model_bytes(&m) / 4);
	}
	CHECK(s.gaps == 0 && s.errors == 0 && s.apply_failures == 0);
	dcast_consumer_close(&c);
	CHECK(c == NULL);

	/* Restart from the directory: version 4 at once, then only the delta. */
	REQUIRE(h_publish(p, &m, 5, 100) == 0);
	c = open_consumer(b, "m_stream", dir_for("stream"));
	REQUIRE(c);
	CHECK(dcast_consumer_version(c) == 4);
	CHECK(h_equal(c, &m, 4));
	CHECK(h_drive(c, &m, 5, &s) == 0);
	CHECK(h_equal(c, &m, 5));
	dcast_consumer_stats_get(c, &st);
	CHECK(st.total_bytes_received > 0 && st.total_bytes_received < h_model_bytes(&m) / 4);
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* With folds off the anchor is received in place all the same, written
 * once, straight to its file (no record file), which close seals if the
 * consumer's thread has not yet: a restart loads it from there. */
static void test_anchor_through_log(const h_broker *b)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c = NULL;
	dcast_consumer_opts o;
	dcast_consumer_stats st;
	h_seen s = {0};

	h_model_init(&m, 13, 1);
	REQUIRE(h_producer_open(b, "m_logged", &m, &p) == 0);
	REQUIRE(h_publish(p, &m, 1, 100) == 0);
	dcast_consumer_opts_init(&o);
	o.fold_fraction = 0;
	CHECK(dcast_consumer_open(b->consumers, "m_logged", dir_for("logged"), BUDGET, &o, &c) == 0);
	REQUIRE(c);
	CHECK(h_drive(c, &m, 1, &s) == 0 && h_equal(c, &m, 1));
	dcast_consumer_stats_get(c, &st);
	CHECK(st.anchor == 1 && st.spilled_chunks == 0); /* in place */
	CHECK(!rec_exists("logged", 1));
	dcast_consumer_close(&c);
	CHECK(h_file_version(dir_for("logged")) == 1);
	CHECK(dcast_consumer_open(b->consumers, "m_logged", dir_for("logged"), BUDGET, &o, &c) == 0);
	REQUIRE(c);
	CHECK(dcast_consumer_version(c) == 1 && h_equal(c, &m, 1)); /* loaded from its file */
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* THPeligible of the mapping that holds addr in /proc/self/smaps: 1 or 0,
 * -1 when no mapping holds it or the kernel does not say. */
static int thp_eligible(const void *addr)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[512];
	int in = 0, v = -1;
	uintptr_t a = (uintptr_t)addr;

	while (f && v < 0 && fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2)
			in = a >= lo && a < hi;
		else if (in)
			sscanf(line, "THPeligible: %d", &v);
	}
	if (f)
		fclose(f);
	return v;
}

/* The host copy of layers.0.w (a 5 MiB model: an arena of its own) of a
 * consumer that took the anchor, with DELTACAST_HUGE_PAGES=`env` (NULL:
 * unset): THP-eligible or not, and bit-exact either way. */
static int arena_thp(const h_broker *b, const h_model *m, const char *dir, const char *env)
{
	dcast_consumer *c;
	dcast_tensor_desc d;
	void *ptr = NULL;
	h_seen s = {0};
	int thp = -1;

	if (env)
		setenv("DELTACAST_HUGE_PAGES", env, 1);
	c = open_consumer(b, "m_thp", dir);
	unsetenv("DELTACAST_HUGE_PAGES");
	REQUIRE(c);
	CHECK(h_drive(c, m, 1, &s) == 0 && h_equal(c, m, 1));
	if (dcast_consumer_tensor(c, "layers.0.w", &ptr, &d, NULL) == 0)
		thp = thp_eligible(ptr);
	dcast_consumer_close(&c);
	return thp;
}

/* The host copies are advised into transparent huge pages, unless
 * DELTACAST_HUGE_PAGES=0 says not to (then out of them, whatever the
 * system's THP mode). */
static void test_huge_pages(const h_broker *b)
{
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
	char mode[128] = "";
	dcast_producer *p = NULL;
	h_model m;
	int on, off;

	if (f) {
		if (!fgets(mode, sizeof(mode), f))
			mode[0] = 0;
		fclose(f);
	}
	h_model_init(&m, 29, 4);
	REQUIRE(h_producer_open(b, "m_thp", &m, &p) == 0);
	REQUIRE(h_publish(p, &m, 1, 100) == 0);
	on = arena_thp(b, &m, dir_for("thp_on"), NULL);
	off = arena_thp(b, &m, dir_for("thp_off"), "0");
	CHECK(off == 0);
	if (strstr(mode, "[never]"))
		printf("huge pages: THP is off on this machine; the default's advice not checked\n");
	else
		CHECK(on == 1);
	printf("huge pages: THPeligible %d by default, %d with DELTACAST_HUGE_PAGES=0 (THP mode: %.*s)\n", on, off,
	       (int)strcspn(mode, "\n"), mode);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* A whole bind while an anchor received in place is READY and not applied:
 * the tensor's bytes move to the caller's memory, so the anchor is dropped
 * and fetched again (through the staging pool now), then applied
 * bit-exact into the bound buffer. */
static void test_bind_during_in_place(const h_broker *b)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;
	dcast_consumer_stats st;
	h_seen s = {0};
	unsigned char *mine;

	/* 4 MB and more a tensor: the host copies bind gives back are mappings */
	REQUIRE(h_model_start_sized(b, "m_bindip", 17, 8, 1, 100, &m, &p) == 0);
	c = open_consumer(b, "m_bindip", dir_for("bindip"));
	REQUIRE(c && (mine = malloc(m.bytes[0])));
	CHECK(wait_ready(c, 1) == 0);
	CHECK(dcast_consumer_bind(c, m.name[0], mine, DCAST_MEM_HOST, m.bytes[0]) == 0);
	CHECK(dcast_consumer_ready_version(c) == DCAST_VERSION_NONE); /* dropped */
	CHECK(h_drive(c, &m, 1, &s) == 0);
	CHECK(memcmp(mine, m.snap[1][0], m.bytes[0]) == 0);
	dcast_consumer_stats_get(c, &st);
	CHECK(st.version == 1 && st.anchor == 1 && st.spilled_chunks > 0); /* staged this time */
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
	free(mine);
}

/* A fault armed through the test hook, then driven to `target`. */
static void run_fault(const h_broker *b, const char *model, const char *fault, uint64_t versions,
		      unsigned density_inv, h_seen *s, int *exact)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;

	REQUIRE(h_model_start(b, model, 29, versions, density_inv, &m, &p) == 0);
	c = open_faulted(b, model, dir_for(model), fault);
	REQUIRE(c);
	CHECK(h_drive(c, &m, versions, s) == 0);
	*exact = h_equal(c, &m, versions);
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

static void test_corrupt_chunk(const h_broker *b)
{
	h_seen s = {0};
	int exact = 0;

	run_fault(b, "m_corrupt", "corrupt:2", 3, 100, &s, &exact);
	CHECK(s.errors >= 1 && s.last_error == DCAST_ECHECKSUM);
	CHECK(s.untouched_bad == 0);
	CHECK(exact); /* re-joined and healed */
}

/* An anchor of 10 MB, whose digests apply computes on several threads
 * (cs_par_for: 8 MiB and more), with its COMMIT's first digest wrong:
 * refused whichever thread computed that range, fetched again, applied
 * exactly.  Then its model.safetensors (file digest computed on threads
 * too) damaged in the middle: the reopen's load refuses it, the broker
 * heals the consumer. */
static void test_anchor_digests_threads(const h_broker *b)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;
	h_seen s = {0};
	char path[512];

	REQUIRE(h_model_start_sized(b, "m_anchorthreads", 73, 8, 1, 100, &m, &p) == 0);
	REQUIRE(h_model_bytes(&m) > (8u << 20));
	c = open_faulted(b, "m_anchorthreads", dir_for("anchorthreads"), "predigest:1");
	REQUIRE(c);
	CHECK(h_drive(c, &m, 1, &s) == 0 && h_equal(c, &m, 1));
	CHECK(s.apply_failures >= 1 && s.last_apply_error == DCAST_EDIGEST && s.anchors >= 2);
	REQUIRE(h_publish(p, &m, 2, 100) == 0);
	CHECK(h_drive(c, &m, 2, &s) == 0 && h_equal(c, &m, 2));
	CHECK(dcast_consumer_checkpoint(c) == 0 && h_file_version(dir_for("anchorthreads")) == 2);
	dcast_consumer_close(&c);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir_for("anchorthreads"));
	h_flip_byte(path, (long)(h_model_bytes(&m) / 2), SEEK_SET, 0x04);
	c = open_consumer(b, "m_anchorthreads", dir_for("anchorthreads"));
	REQUIRE(c);
	CHECK(dcast_consumer_version(c) == DCAST_VERSION_NONE); /* dropped, not served */
	CHECK(h_drive(c, &m, 2, &s) == 0 && h_equal(c, &m, 2));
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* Versions 1-2 applied, then 3 and 4 published while 2 is live, so that 3
 * is checked ahead; `fault` (DELTACAST_CONSUMER_FAULT) armed for 3, and
 * with `dense` 3 also rewrites the first chunk whole.  The consumer must
 * end bit-exact at 4; s says what it went through.  The model at scale 1
 * with 1% deltas, unless run_ahead_sized says otherwise. */
static void run_ahead_sized(const h_broker *b, const char *model, uint64_t seed, uint64_t scale,
			    unsigned density_inv, const char *fault, int dense, h_seen *s)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;

	REQUIRE(h_model_start_sized(b, model, seed, scale, 2, density_inv, &m, &p) == 0);
	c = open_faulted(b, model, dir_for(model), fault);
	REQUIRE(c);
	CHECK(h_drive(c, &m, 2, s) == 0);
	for (uint64_t i = 0; dense && i < h_range_elems * 2; i++) /* random bit patterns: dense is smallest */
		m.cur[0][i] = (unsigned char)h_rand(&m.rng);
	REQUIRE(h_publish(p, &m, 3, density_inv) == 0 && h_publish(p, &m, 4, density_inv) == 0);
	CHECK(h_drive(c, &m, 4, s) == 0);
	CHECK(h_equal(c, &m, 4));
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

static void run_ahead_fault(const h_broker *b, const char *model, uint64_t seed, const char *fault, int dense,
			    h_seen *s)
{
	run_ahead_sized(b, model, seed, 1, 100, fault, dense, s);
}

/* A wrong digest found when version 3 is checked ahead of apply (it
 * arrives while version 2 is live): refused before it touches the live
 * tensors, re-joined, healed. */
static void test_digest_ahead(const h_broker *b)
{
	h_seen s = {0};

	run_ahead_fault(b, "m_ahead", 31, "predigest:3", 0, &s);
	CHECK(s.errors >= 1 && s.last_error == DCAST_EDIGEST);
	CHECK(s.apply_failures == 0 && s.untouched_bad == 0);
}

/* The same at a size where the check ahead resolves and apply scatters on
 * several threads (a 10 MB model, 10% deltas: 360k changes a version):
 * the wrong digest still refused ahead, the good versions bit-exact. */
static void test_digest_ahead_threads(const h_broker *b)
{
	h_seen s = {0};

	run_ahead_sized(b, "m_aheadthreads", 83, 8, 10, "predigest:3", 0, &s);
	CHECK(s.errors >= 1 && s.last_error == DCAST_EDIGEST);
	CHECK(s.apply_failures == 0 && s.untouched_bad == 0);
}

/* An anchor received in place whose COMMIT carries a wrong digest: refused
 * (checked ahead or at apply), its model.safetensors.new removed with it
 * (only an applied anchor is sealed), fetched again and applied; close
 * seals that one, and a restart loads it. */
static void test_in_place_refused(const h_broker *b)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;
	h_seen s = {0};
	char path[512];

	REQUIRE(h_model_start(b, "m_iprefuse", 59, 1, 100, &m, &p) == 0);
	c = open_faulted(b, "m_iprefuse", dir_for("iprefuse"), "predigest:1");
	REQUIRE(c);
	CHECK(h_drive(c, &m, 1, &s) == 0 && h_equal(c, &m, 1));
	CHECK(s.errors + s.apply_failures >= 1 && s.anchors >= 2);
	dcast_consumer_close(&c);
	snprintf(path, sizeof(path), "%s/model.safetensors.new", dir_for("iprefuse"));
	CHECK(access(path, F_OK) != 0 && h_file_version(dir_for("iprefuse")) == 1);
	snprintf(path, sizeof(path), "%s/model.safetensors.applied", dir_for("iprefuse"));
	CHECK(access(path, F_OK) != 0);
	c = open_consumer(b, "m_iprefuse", dir_for("iprefuse"));
	REQUIRE(c);
	CHECK(dcast_consumer_version(c) == 1 && h_equal(c, &m, 1));
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* Version 3, checked ahead while version 2 is live, fails halfway through
 * its apply (the test hook refuses a chunk): the chunks already written
 * are undone from their saved old values, the tensors are exactly version
 * 2 again, and the consumer re-joins and heals. */
static void test_ahead_rollback(const h_broker *b)
{
	h_seen s = {0};

	run_ahead_fault(b, "m_aheadfail", 37, "aheadfail:3", 0, &s);
	CHECK(s.apply_failures >= 1 && s.last_apply_error == DCAST_ECORRUPT);
	CHECK(s.untouched_ok >= 1 && s.untouched_bad == 0);
}

/* Version 3 is checked ahead while version 2 is live, its chunks resolved
 * against version 2's values; then a slice of a tensor is bound before its
 * apply.  The resolved writes would miss the slice: apply decodes again,
 * and the slice holds version 3 as the tensor does. */
static void test_bind_after_ahead(const h_broker *b)
{
	static const uint64_t off[2] = {16, 0}, ext[2] = {32, 1024};
	uint64_t bytes = ext[0] * ext[1] * 2;
	unsigned char *box = malloc(bytes);
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;
	h_seen s = {0};
	dcast_event ev;

	REQUIRE(box && h_model_start(b, "m_bindahead", 61, 2, 100, &m, &p) == 0);
	c = open_consumer(b, "m_bindahead", dir_for("bindahead"));
	REQUIRE(c);
	CHECK(h_drive(c, &m, 2, &s) == 0);
	REQUIRE(h_publish(p, &m, 3, 100) == 0);
	for (int i = 0; i < 200 && dcast_consumer_ready_version(c) != 3; i++)
		CHECK(dcast_consumer_poll(c, 100, &ev) == 0);
	REQUIRE(dcast_consumer_ready_version(c) == 3);
	CHECK_ERR(dcast_consumer_bind_slice(c, m.name[0], box, DCAST_MEM_HOST, 2, off, ext, bytes), 0);
	CHECK(memcmp(box, m.snap[2][0] + off[0] * ext[1] * 2, bytes) == 0);
	CHECK_ERR(dcast_consumer_apply(c, 3), 0);
	CHECK(h_equal(c, &m, 3));
	CHECK(memcmp(box, m.snap[3][0] + off[0] * ext[1] * 2, bytes) == 0);
	CHECK(memcmp(m.snap[2][0] + off[0] * ext[1] * 2, m.snap[3][0] + off[0] * ext[1] * 2, bytes) != 0);
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
	free(box);
}

/* close() while an anchor streams in place (the test fault cut:1 keeps it
 * half received): close returns and frees what the intake held (the
 * sanitizer and valgrind runs check that), leaving at most the anchor's
 * .new file; the next open removes it, fetches the anchor again and
 * applies it, and close seals that one as model.safetensors. */
static void test_close_mid_anchor(const h_broker *b)
{
	const char *dir = dir_for("midclose");
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;
	h_seen s = {0};
	char path[512];

	REQUIRE(h_model_start(b, "m_midclose", 67, 1, 100, &m, &p) == 0);
	c = open_faulted(b, "m_midclose", dir, "cut:1");
	REQUIRE(c);
	snprintf(path, sizeof(path), "%s/model.safetensors.new", dir);
	CHECK(tp_wait_until(10000, file_written, path)); /* the first chunk's range, written behind */
	CHECK(dcast_consumer_version(c) == DCAST_VERSION_NONE && dcast_consumer_ready_version(c) == DCAST_VERSION_NONE);
	dcast_consumer_close(&c);
	CHECK(c == NULL);
	c = open_consumer(b, "m_midclose", dir);
	REQUIRE(c);
	CHECK(h_drive(c, &m, 1, &s) == 0 && h_equal(c, &m, 1));
	dcast_consumer_close(&c);
	CHECK(access(path, F_OK) != 0 && h_file_version(dir) == 1);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* As test_ahead_rollback, with version 3 also rewriting the whole first
 * chunk (sent dense: apply saves its old values in the undo region, after
 * the arrays of the chunks the check ahead resolved) ahead of the chunk
 * refused: every chunk comes back, the resolved ones from their arrays,
 * the dense one from the undo region. */
static void test_ahead_rollback_dense(const h_broker *b)
{
	h_seen s = {0};

	run_ahead_fault(b, "m_aheaddense", 71, "aheadfail:3", 1, &s);
	CHECK(s.apply_failures >= 1 && s.last_apply_error == DCAST_ECORRUPT);
	CHECK(s.untouched_ok >= 1 && s.untouched_bad == 0);
}

static void test_digest_rollback(const h_broker *b)
{
	h_seen s = {0};
	int exact = 0;

	run_fault(b, "m_digest", "digest:3", 4, 100, &s, &exact);
	CHECK(s.apply_failures >= 1);
	CHECK(s.last_apply_error == DCAST_EDIGEST);
	CHECK(s.untouched_ok >= 1 && s.untouched_bad == 0); /* exactly version 2 after the refusal */
	CHECK(exact);
}

/* A delta whose old values do not fit the undo region (a third of the
 * model changes, the region is a quarter of a 1 MiB budget) fails its
 * digest: the previous version comes back from the local checkpoint. */
static void test_digest_restore(const h_broker *b)
{
	h_seen s = {0};
	int exact = 0;

	run_fault(b, "m_restore", "digest:3", 4, 3, &s, &exact);
	CHECK(s.apply_failures >= 1 && s.last_apply_error == DCAST_EDIGEST);
	CHECK(s.untouched_ok >= 1 && s.untouched_bad == 0);
	CHECK(exact);
}

/* Every chunk of version 2 arrives twice: staged once, applied bit-exact. */
static void test_duplicates(const h_broker *b)
{
	h_seen s = {0};
	int exact = 0;

	run_fault(b, "m_dup", "dup:2", 3, 100, &s, &exact);
	CHECK(s.errors == 0 && s.gaps == 0 && s.apply_failures == 0);
	CHECK(exact);
}

static void test_gap(const h_broker *b)
{
	h_seen s = {0};
	int exact = 0;

	run_fault(b, "m_gap", "skip:2", 3, 100, &s, &exact);
	CHECK(s.gaps >= 1);
	CHECK(exact);
}

/* A record file corrupted on disk (one payload byte) is found at open: the
 * checkpoint is cut back to the version before it, which the tensors hold
 * exactly, and the broker supplies the rest. */
static void test_corrupt_log(const h_broker *b)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;
	h_seen s = {0};
	char path[512];

	REQUIRE(h_model_start(b, "m_log", 41, 3, 100, &m, &p) == 0);
	dcast_consumer_opts o;
	dcast_consumer_opts_init(&o);
	o.fold_fraction = 0; /* no fold: every version stays in the record log */
	c = NULL;
	CHECK(dcast_consumer_open(b->consumers, "m_log", dir_for("log"), BUDGET, &o, &c) == 0);
	REQUIRE(c);
	CHECK(h_drive(c, &m, 3, &s) == 0);
	dcast_consumer_close(&c);
	snprintf(path, sizeof(path), "%s/model.dlog/%020d.rec", dir_for("log"), 2);
	FILE *f = fopen(path, "rb");
	REQUIRE(f);
	long at = first_payload(f) + 5; /* inside the first chunk's payload */
	fclose(f);
	REQUIRE(at > 5);
	int ch = h_flip_byte(path, at, SEEK_SET, 0x01);
	REQUIRE(h_publish(p, &m, 4, 100) == 0);
	c = open_consumer(b, "m_log", dir_for("log"));
	REQUIRE(c);
	CHECK(dcast_consumer_version(c) == 1);
	CHECK(h_equal(c, &m, 1));
	f = fopen(path, "rb"); /* cut: gone, or staged afresh by the consumer's thread */
	CHECK(!f || (fseek(f, at, SEEK_SET) == 0 && fgetc(f) == ch));
	if (f)
		fclose(f);
	CHECK(h_drive(c, &m, 4, &s) == 0);
	CHECK(h_equal(c, &m, 4));
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* A bit flipped in the tensor data of the checkpoint's safetensors anchor
 * (which its own header cannot show) is caught by the model digest in its
 * metadata: the consumer drops the checkpoint (logged) instead of serving
 * weights that are not any committed version, and fetches the newest
 * version from the broker by itself. */
static void test_corrupt_anchor_file(const h_broker *b)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;
	h_seen s = {0};
	char path[512];
	dcast_consumer_opts o;

	dcast_consumer_opts_init(&o);
	o.fold_every = 1; /* every applied version folds into model.safetensors */
	REQUIRE(h_model_start(b, "m_anchor", 43, 2, 100, &m, &p) == 0);
	c = NULL;
	REQUIRE(dcast_consumer_open(b->consumers, "m_anchor", dir_for("anchor"), BUDGET, &o, &c) == 0);
	CHECK(h_drive(c, &m, 2, &s) == 0);
	CHECK(dcast_consumer_checkpoint(c) == 0); /* model.safetensors at version 2 */
	dcast_consumer_close(&c);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir_for("anchor"));
	h_flip_byte(path, -3, SEEK_END, 0x10); /* tensor data, not the header */
	c = NULL;
	REQUIRE(dcast_consumer_open(b->consumers, "m_anchor", dir_for("anchor"), BUDGET, &o, &c) == 0);
	CHECK(dcast_consumer_version(c) == DCAST_VERSION_NONE); /* dropped, not served */
	CHECK(access(path, F_OK) != 0 || dcast_consumer_version(c) == DCAST_VERSION_NONE);
	CHECK(h_drive(c, &m, 2, &s) == 0 && h_equal(c, &m, 2)); /* fetched again by itself */
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* Version v changes only head.b (tensor 2): one byte in 50. */
static int publish_head(dcast_producer *p, h_model *m, uint64_t v)
{
	for (uint64_t i = 0; i < m->bytes[2]; i += 50)
		m->cur[2][i] ^= 0x3;
	h_model_snap(m, v);
	return dcast_producer_publish(p, v) ? -1 : dcast_producer_wait(p, v, 20000);
}

static dcast_consumer *open_verify(const h_broker *b, const char *dir, int verify)
{
	dcast_consumer_opts o;
	dcast_consumer *c = NULL;

	dcast_consumer_opts_init(&o);
	o.verify_digests = verify;
	o.fold_fraction = 0; /* every version stays in the log: a reopen replays them all */
	CHECK(dcast_consumer_open(b->consumers, "m_verify", dir, BUDGET, &o, &c) == 0);
	return c;
}

static uint64_t verified_bytes(dcast_consumer *c)
{
	dcast_consumer_stats st;
	dcast_consumer_stats_get(c, &st);
	return st.verify_bytes;
}

/* Verification reads only the old and new values of the elements a version
 * changed (1), or the whole model (2); a wrong digest of a range it did not
 * write is still caught. */
static void test_verify_incremental(const h_broker *b)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *inc, *full;
	h_seen s = {0};
	int exact = 0;

	REQUIRE(h_model_start(b, "m_verify", 47, 1, 100, &m, &p) == 0);
	inc = open_verify(b, dir_for("verify_inc"), 1);
	full = open_verify(b, dir_for("verify_full"), 2);
	REQUIRE(inc && full);
	CHECK(h_drive(inc, &m, 1, &s) == 0 && h_drive(full, &m, 1, &s) == 0);
	CHECK(verified_bytes(inc) == h_model_bytes(&m)); /* nothing to reuse yet */
	REQUIRE(publish_head(p, &m, 2) == 0);
	CHECK(h_drive(inc, &m, 2, &s) == 0 && h_drive(full, &m, 2, &s) == 0);
	CHECK(h_equal(inc, &m, 2) && h_equal(full, &m, 2));
	/* old and new value of each changed bf16 element, one every 25 */
	CHECK(verified_bytes(inc) == 2 * 2 * ((m.bytes[2] + 49) / 50));
	CHECK(verified_bytes(full) == h_model_bytes(&m));
	REQUIRE(h_publish(p, &m, 3, 100) == 0);
	CHECK(h_drive(inc, &m, 3, &s) == 0 && h_equal(inc, &m, 3));
	CHECK(s.errors == 0 && s.apply_failures == 0);
	dcast_consumer_close(&inc);
	dcast_consumer_close(&full);
	REQUIRE(publish_head(p, &m, 4) == 0);
	setenv("DELTACAST_CONSUMER_FAULT", "digest:4", 1); /* digests[0]: a range v4 did not write */
	inc = open_verify(b, dir_for("verify_fault"), 1);
	unsetenv("DELTACAST_CONSUMER_FAULT");
	REQUIRE(inc);
	CHECK(h_drive(inc, &m, 4, &s) == 0);
	CHECK(s.apply_failures >= 1 && s.last_apply_error == DCAST_EDIGEST && s.untouched_bad == 0);
	exact = h_equal(inc, &m, 4);
	CHECK(exact);
	dcast_consumer_close(&inc);
	/* Reopened at 3, it replays 1 to 3 from its record files (2 and 3
	 * checked after apply from their saved old values), so 4 moves cached
	 * digests. */
	inc = open_verify(b, dir_for("verify_inc"), 1);
	REQUIRE(inc);
	CHECK(dcast_consumer_version(inc) == 3);
	CHECK(h_drive(inc, &m, 4, &s) == 0 && h_equal(inc, &m, 4));
	CHECK(verified_bytes(inc) == 2 * 2 * ((m.bytes[2] + 49) / 50));
	dcast_consumer_close(&inc);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* Poll until version v is READY (bounded). */
static int wait_ready(dcast_consumer *c, uint64_t v)
{
	dcast_event ev;

	for (int i = 0; i < 300; i++) {
		if (dcast_consumer_poll(c, 100, &ev))
			return -1;
		if (ev.type == DCAST_EV_VERSION_READY && ev.version == v)
			return 0;
	}
	return -1;
}

/* Double fault: version 3 (a third of the model changes: its old values do
 * not fit in memory) fails its digest, and the local checkpoint that should
 * bring version 2 back has a flipped data bit.  The consumer must not claim
 * version 2 (or any) for tensors that are not exactly it: version() becomes
 * NONE, the checkpoint is dropped, and the broker's anchor heals it. */
static void test_double_fault(const h_broker *b)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c = NULL;
	dcast_consumer_opts o;
	h_seen s = {0};
	char path[512];

	dcast_consumer_opts_init(&o);
	o.fold_every = 1;
	REQUIRE(h_model_start(b, "m_double", 53, 2, 100, &m, &p) == 0);
	setenv("DELTACAST_CONSUMER_FAULT", "digest:3", 1);
	REQUIRE(dcast_consumer_open(b->consumers, "m_double", dir_for("double"), BUDGET, &o, &c) == 0);
	unsetenv("DELTACAST_CONSUMER_FAULT");
	CHECK(h_drive(c, &m, 2, &s) == 0);
	CHECK(dcast_consumer_checkpoint(c) == 0); /* model.safetensors at version 2, no record files */
	snprintf(path, sizeof(path), "%s/model.safetensors", dir_for("double"));
	h_flip_byte(path, -3, SEEK_END, 0x10);
	REQUIRE(h_publish(p, &m, 3, 3) == 0);
	REQUIRE(wait_ready(c, 3) == 0);
	CHECK_ERR(dcast_consumer_apply(c, 3), DCAST_EDIGEST);
	fprintf(stderr, "refused as: %s\n", dcast_last_error());
	uint64_t have = dcast_consumer_version(c);
	CHECK(have == DCAST_VERSION_NONE || h_equal(c, &m, have)); /* never a version it does not hold */
	CHECK(have == DCAST_VERSION_NONE);                         /* here: the checkpoint was corrupt */
	CHECK(strstr(dcast_last_error(), "no valid version") != NULL);
	CHECK(access(path, F_OK) != 0);                            /* dropped, not loaded again */
	CHECK(h_drive(c, &m, 3, &s) == 0 && h_equal(c, &m, 3));    /* healed from the broker's anchor */
	CHECK(s.untouched_bad == 0);
	dcast_consumer_close(&c);
	REQUIRE(dcast_consumer_open(b->consumers, "m_double", dir_for("double"), BUDGET, &o, &c) == 0);
	CHECK(dcast_consumer_version(c) == 3 && h_equal(c, &m, 3)); /* the new checkpoint is whole */
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* A checkpoint of one model opened against a broker whose MANIFEST has
 * other shapes: after reading the MANIFEST again (one could have been
 * damaged on the way), the consumer reports DCAST_ESHAPE naming the
 * directory, and nothing of the other model is applied. */
static void test_manifest_mismatch(const h_broker *b)
{
	h_model m1, m2;
	dcast_producer *p1 = NULL, *p2 = NULL;
	dcast_consumer *c;
	dcast_event ev = {0};
	h_seen seen = {0};
	h_broker b2;
	int err = 0, ready = 0;

	h_model_init(&m1, 41, 1);
	h_model_init(&m2, 43, 2);
	REQUIRE(h_producer_open(b, "m_shape", &m1, &p1) == 0);
	REQUIRE(h_publish(p1, &m1, 1, 100) == 0);
	REQUIRE(h_broker_start_args(&b2, NULL) == 0); /* where m_shape has other tensors */
	REQUIRE(h_producer_open(&b2, "m_shape", &m2, &p2) == 0);
	REQUIRE(h_publish(p2, &m2, 1, 100) == 0);
	c = open_consumer(b, "m_shape", dir_for("shape"));
	REQUIRE(c);
	CHECK(h_drive(c, &m1, 1, &seen) == 0); /* applied, so the checkpoint holds it */
	dcast_consumer_close(&c);
	c = open_consumer(&b2, "m_shape", dir_for("shape"));
	REQUIRE(c);
	for (int i = 0; i < 100 && !err; i++) {
		if (dcast_consumer_poll(c, 100, &ev))
			break;
		if (ev.type == DCAST_EV_ERROR)
			err = ev.code;
		ready |= ev.type == DCAST_EV_VERSION_READY;
	}
	CHECK_ERR(err, DCAST_ESHAPE);
	CHECK(strstr(ev.text, "2 times in a row") != NULL);
	CHECK(strstr(ev.text, dir_for("shape")) != NULL);
	CHECK(!ready);
	dcast_consumer_close(&c);
	dcast_producer_close(&p1);
	dcast_producer_close(&p2);
	h_broker_stop(&b2);
	h_model_free(&m1);
	h_model_free(&m2);
}

static int copy_file(const char *from, const char *to)
{
	char cmd[2048];

	snprintf(cmd, sizeof(cmd), "mkdir -p \"$(dirname '%s')\" && cp '%s' '%s'", to, from, to);
	return system(cmd);
}

/* Open m_own_b on dir: refused, naming both models and what showed it. */
static void check_refused(const h_broker *b, const char *dir, const char *what)
{
	dcast_consumer *c = NULL;

	CHECK_ERR(dcast_consumer_open(b->consumers, "m_own_b", dir, BUDGET, NULL, &c), DCAST_ESTATE);
	CHECK(c == NULL);
	CHECK(strstr(dcast_last_error(), "m_own_a") && strstr(dcast_last_error(), "m_own_b"));
	CHECK(strstr(dcast_last_error(), what) != NULL);
}

/* A directory holding another model's checkpoint, with the same tensors
 * (so the broker's MANIFEST cannot tell): the open is refused and the
 * files are left as they were, whether the anchor file, a record file or
 * an anchor file not sealed (.applied) shows it; the owner opens it
 * afterwards at its version. */
static void test_foreign_dir(const h_broker *b)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c = NULL;
	dcast_consumer_opts o;
	h_seen s = {0};
	char from[512], to[512];

	dcast_consumer_opts_init(&o);
	o.fold_fraction = 0; /* version 2 stays a record file */
	REQUIRE(h_model_start(b, "m_own_a", 47, 1, 100, &m, &p) == 0);
	REQUIRE(dcast_consumer_open(b->consumers, "m_own_a", dir_for("own"), BUDGET, &o, &c) == 0);
	CHECK(h_drive(c, &m, 1, &s) == 0);
	CHECK(dcast_consumer_checkpoint(c) == 0); /* model.safetensors at version 1 */
	REQUIRE(h_publish(p, &m, 2, 100) == 0);
	CHECK(h_drive(c, &m, 2, &s) == 0);
	dcast_consumer_close(&c);
	REQUIRE(rec_exists("own", 2));
	check_refused(b, dir_for("own"), "model.safetensors");
	snprintf(from, sizeof(from), "%s/model.dlog/%020d.rec", dir_for("own"), 2);
	snprintf(to, sizeof(to), "%s/model.dlog/%020d.rec", dir_for("own_log"), 2);
	REQUIRE(copy_file(from, to) == 0);
	check_refused(b, dir_for("own_log"), "record file");
	CHECK(rec_exists("own_log", 2) && rec_exists("own", 2));
	snprintf(from, sizeof(from), "%s/model.safetensors", dir_for("own"));
	snprintf(to, sizeof(to), "%s/model.safetensors.applied", dir_for("own_new"));
	REQUIRE(copy_file(from, to) == 0); /* as an anchor applied and not sealed when it died */
	check_refused(b, dir_for("own_new"), "model.safetensors.applied");
	CHECK(access(to, F_OK) == 0);
	REQUIRE(dcast_consumer_open(b->consumers, "m_own_a", dir_for("own"), BUDGET, &o, &c) == 0);
	CHECK(dcast_consumer_version(c) == 2 && h_equal(c, &m, 2));
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

static void test_bad_args(void)
{
	dcast_consumer *c = (dcast_consumer *)1;
	dcast_consumer_opts o;

	CHECK_ERR(dcast_consumer_open("tcp://127.0.0.1:1", "m", dir_for("x"), 1000, NULL, &c), DCAST_EINVAL);
	CHECK(c == NULL);
	dcast_consumer_opts_init(&o);
	o.curve_server_key = "0123456789012345678901234567890123456789";
	CHECK_ERR(dcast_consumer_open("tcp://127.0.0.1:1", "m", dir_for("x"), BUDGET, &o, &c), DCAST_EINVAL);
	CHECK(strstr(dcast_last_error(), "curve_public_key") != NULL);
}

int main(void)
{
	h_broker b;

	REQUIRE(mkdtemp(root));
	test_bad_args();
	REQUIRE(h_broker_start_args(&b, NULL) == 0);
	test_stream_and_restart(&b);
	test_anchor_through_log(&b);
	test_huge_pages(&b);
	test_bind_during_in_place(&b);
	test_corrupt_chunk(&b);
	test_digest_rollback(&b);
	test_digest_ahead(&b);
	test_in_place_refused(&b);
	test_anchor_digests_threads(&b);
	test_digest_ahead_threads(&b);
	test_ahead_rollback(&b);
	test_ahead_rollback_dense(&b);
	test_bind_after_ahead(&b);
	test_close_mid_anchor(&b);
	test_digest_restore(&b);
	test_gap(&b);
	test_duplicates(&b);
	test_corrupt_log(&b);
	test_corrupt_anchor_file(&b);
	test_verify_incremental(&b);
	test_double_fault(&b);
	test_manifest_mismatch(&b);
	test_foreign_dir(&b);
	h_broker_stop(&b);
	check_remove_dir(root);
	return check_done("test_consumer");
}
