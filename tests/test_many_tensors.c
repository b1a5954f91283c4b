/* Models of tens of thousands of tensors (mixture-of-experts layers: one
 * tensor per expert and projection), with a real broker, producer and
 * consumer over loopback:
 * - the name index (common/dcast_names.h) finds each of 100,000 names at
 *   its position, finds no name it was not given (names that differ in
 *   one byte, a prefix, a longer one), and keeps working after the
 *   caller's array moves;
 * - 138,240 tensors of a few hundred elements each, named as Kimi K2's
 *   fp8 expert tensors are (60 layers of 384 experts, three projections
 *   with their block scales; more than 2^16, the MANIFEST limit until
 *   2026-11-27), an anchor then deltas
 *   that touch a third of them, every version re-registered at new
 *   memory as `deltacast publish` does: the consumer, which runs itself,
 *   holds each version bit-exact, looked up tensor by tensor by name;
 *   tensors bind to the caller's memory by name; an unknown name is
 *   refused with DCAST_ENOTFOUND; a second consumer opened on the first
 *   one's directory loads the newest version from its checkpoint; the
 *   broker, on a data dir, killed and restarted, serves that version to a
 *   consumer that joins then.
 * Registering or looking up n tensors used to compare names linearly:
 * O(n^2) per version (70% of `deltacast publish`'s time at 20,000
 * tensors, docs/benchmarks.md "Many tensors"). */
#include <inttypes.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "consumer_harness.h"
#include "dcast_names.h"

#define NT (60u * 384u * 6u) /* Kimi K2's fp8 expert tensors: over 2^16 */
#define BUDGET (16u << 20)

static char root[64] = "/tmp/dcast-many.XXXXXX";

/* ---- the name index alone ---- */

typedef struct name_row {
	char name[48];
} name_row;

static const char *row_name(const void *ctx, uint32_t i)
{
	return ((const name_row *)ctx)[i].name;
}

static void test_index(void)
{
	enum { N = 100000 };
	name_row *rows = calloc(N, sizeof(*rows)), *moved;
	dcast_names x = {0};
	uint32_t found = 0, absent = 0;

	REQUIRE(rows);
	for (uint32_t i = 0; i < N; i++) {
		snprintf(rows[i].name, sizeof(rows[i].name), "model.layers.%u.mlp.experts.%u.w%u", i / 384,
			 i / 3 % 128, i % 3);
		CHECK(dcast_names_get(&x, rows[i].name, row_name, rows) == -1);
		REQUIRE(dcast_names_put(&x, rows[i].name, i) == 0);
	}
	REQUIRE((moved = malloc(N * sizeof(*moved)))); /* the array moves: positions stay */
	memcpy(moved, rows, N * sizeof(*rows));
	memset(rows, 0, N * sizeof(*rows));
	free(rows);
	for (uint32_t i = 0; i < N; i++) {
		char other[64];
		found += dcast_names_get(&x, moved[i].name, row_name, moved) == (int64_t)i;
		snprintf(other, sizeof(other), "%sx", moved[i].name);          /* longer */
		absent += dcast_names_get(&x, other, row_name, moved) == -1;
		snprintf(other, sizeof(other), "%.*s", (int)strlen(moved[i].name) - 1, moved[i].name);
		absent += dcast_names_get(&x, other, row_name, moved) == -1 ||  /* a prefix: */
			  strcmp(other, "model.layers.0.mlp.experts.0.w") == 0; /* not in the set */
		snprintf(other, sizeof(other), "%s", moved[i].name);
		other[0] = 'M';                                                /* one byte */
		absent += dcast_names_get(&x, other, row_name, moved) == -1;
	}
	CHECK(found == N);
	CHECK(absent == 3u * N);
	CHECK(x.n == N && x.cap >= 2u * N);
	dcast_names_free(&x);
	CHECK(dcast_names_get(&x, "model.layers.0.mlp.experts.0.w0", row_name, moved) == -1);
	free(moved);
	printf("name index: %u names found at their positions, %u absent ones not found\n", found, absent);
}

/* ---- 20,000 tensors end to end ---- */

typedef struct many {
	char (*name)[64];
	uint64_t *elems;
	uint16_t **cur;   /* bf16, the producer's memory of the version being published */
	uint16_t **truth; /* the last published version */
	uint64_t rng;
} many;

static void many_init(many *m)
{
	static const char *proj[] = { "gate", "up", "down" };

	m->name = calloc(NT, sizeof(*m->name));
	m->elems = calloc(NT, sizeof(*m->elems));
	m->cur = calloc(NT, sizeof(*m->cur));
	m->truth = calloc(NT, sizeof(*m->truth));
	REQUIRE(m->name && m->elems && m->cur && m->truth);
	m->rng = 977;
	for (uint32_t i = 0; i < NT; i++) {
		snprintf(m->name[i], sizeof(m->name[i]), "model.layers.%u.mlp.experts.%u.%s_proj.weight%s",
			 1 + i / 2304, i / 6 % 384, proj[i / 2 % 3], i % 2 ? "_scale_inv" : "");
		m->elems[i] = 64 + h_rand(&m->rng) % 512;
		REQUIRE((m->cur[i] = malloc(m->elems[i] * 2)) && (m->truth[i] = malloc(m->elems[i] * 2)));
		for (uint64_t e = 0; e < m->elems[i]; e++)
			m->cur[i][e] = (uint16_t)h_rand(&m->rng);
	}
}

static void many_free(many *m)
{
	for (uint32_t i = 0; i < NT; i++)
		free(m->cur[i]), free(m->truth[i]);
	free(m->name), free(m->elems), free(m->cur), free(m->truth);
}

/* Register every tensor at fresh memory holding the current values (as
 * `deltacast publish` does for each file), then publish v. */
static int many_publish(dcast_producer *p, many *m, uint64_t v)
{
	int err = 0;

	for (uint32_t i = 0; i < NT && !err; i++) {
		uint16_t *fresh = malloc(m->elems[i] * 2);
		REQUIRE(fresh);
		memcpy(fresh, m->cur[i], m->elems[i] * 2);
		free(m->cur[i]);
		m->cur[i] = fresh;
		memcpy(m->truth[i], fresh, m->elems[i] * 2);
		err = dcast_producer_register(p, m->name[i], DCAST_DTYPE_BF16, 1, &m->elems[i], fresh,
					      DCAST_MEM_HOST, 0, m->elems[i]);
	}
	if (!err)
		err = dcast_producer_publish(p, v);
	return err ? err : dcast_producer_wait(p, v, 30000);
}

/* A third of the tensors: one element each, one ulp or more. */
static void many_step(many *m)
{
	for (uint32_t i = 0; i < NT; i += 3)
		m->cur[i][h_rand(&m->rng) % m->elems[i]] ^= (uint16_t)(1 + h_rand(&m->rng) % 7);
}

/* Tensors of c equal to the truth, looked up by name. */
static uint32_t many_equal(dcast_consumer *c, const many *m)
{
	uint32_t same = 0;

	for (uint32_t i = 0; i < NT; i++) {
		dcast_tensor_desc d;
		void *ptr;
		same += dcast_consumer_tensor(c, m->name[i], &ptr, &d, NULL) == 0 && d.shape[0] == m->elems[i] &&
			!memcmp(ptr, m->truth[i], m->elems[i] * 2);
	}
	return same;
}

static dcast_consumer *many_open(const h_broker *b, const char *dir)
{
	dcast_consumer_opts o;
	dcast_consumer *c = NULL;

	dcast_consumer_opts_init(&o);
	o.auto_apply = 1;
	CHECK(dcast_consumer_open(b->consumers, "many", dir, BUDGET, &o, &c) == 0);
	return c;
}

/* The broker killed (SIGKILL) and restarted on its data dir: a consumer
 * that joins then gets the newest version from what the broker logged
 * (its MANIFEST of NT tensors among it), bit-exact. */
static void restart_join(h_broker *b, const many *m, uint64_t v)
{
	dcast_consumer *c;
	char dir[128];

	tp_broker_kill(b, SIGKILL);
	REQUIRE(tp_broker_start(b) == 0);
	snprintf(dir, sizeof(dir), "%s/c3", root);
	REQUIRE((c = many_open(b, dir)));
	CHECK(dcast_consumer_wait_version(c, v, 60000) == 0);
	CHECK(many_equal(c, m) == NT);
	printf("many tensors: the restarted broker served version %" PRIu64 " of %u tensors bit-exact\n",
	       dcast_consumer_version(c), NT);
	dcast_consumer_close(&c);
}

static void test_many(h_broker *b)
{
	dcast_producer_opts po;
	dcast_producer *p = NULL;
	dcast_consumer *c, *c2;
	uint16_t *mine[3];
	dcast_consumer_stats st;
	char dir[128];
	many m;

	many_init(&m);
	dcast_producer_opts_init(&po);
	REQUIRE(dcast_producer_open(b->producers, "many", 0, 1, &po, &p) == 0);
	snprintf(dir, sizeof(dir), "%s/c1", root);
	REQUIRE((c = many_open(b, dir)));
	for (uint64_t v = 1; v <= 3; v++) {
		if (v > 1)
			many_step(&m);
		CHECK(many_publish(p, &m, v) == 0);
		CHECK(dcast_consumer_wait_version(c, v, 30000) == 0);
		CHECK(many_equal(c, &m) == NT);
	}
	for (int k = 0; k < 3; k++) { /* bound to the caller's memory, by name */
		uint32_t i = (uint32_t)k * 7919 % NT;
		REQUIRE((mine[k] = malloc(m.elems[i] * 2)));
		CHECK(dcast_consumer_bind(c, m.name[i], mine[k], DCAST_MEM_HOST, m.elems[i] * 2) == 0);
		CHECK(!memcmp(mine[k], m.truth[i], m.elems[i] * 2));
	}
	CHECK(dcast_consumer_bind(c, "model.layers.0.mlp.experts.0.w", mine[0], DCAST_MEM_HOST, 2) ==
	      DCAST_ENOTFOUND);
	many_step(&m);
	CHECK(many_publish(p, &m, 4) == 0);
	CHECK(dcast_consumer_wait_version(c, 4, 30000) == 0);
	CHECK(many_equal(c, &m) == NT);
	for (int k = 0; k < 3; k++)
		CHECK(!memcmp(mine[k], m.truth[(uint32_t)k * 7919 % NT], m.elems[(uint32_t)k * 7919 % NT] * 2));
	dcast_consumer_close(&c);
	REQUIRE((c2 = many_open(b, dir))); /* the checkpoint: model.safetensors and its log */
	CHECK(dcast_consumer_version(c2) == 4);
	CHECK(many_equal(c2, &m) == NT);
	dcast_consumer_stats_get(c2, &st);
	CHECK(st.total_bytes_received == 0); /* loaded, not fetched */
	printf("many tensors: %u tensors, 4 versions, every one bit-exact by name; reloaded at %" PRIu64 "\n",
	       NT, dcast_consumer_version(c2));
	dcast_consumer_close(&c2);
	restart_join(b, &m, 4);
	dcast_producer_close(&p);
	for (int k = 0; k < 3; k++)
		free(mine[k]);
	many_free(&m);
}

/* 100,000 tensors with names of 200 bytes: a MANIFEST of about 21 MB,
 * over DCAST_MAX_HEADER_BYTES.  publish() says so and sends nothing (the
 * broker would refuse the header), and the broker runs on. */
static void test_manifest_too_large(const h_broker *b)
{
	enum { N = 100000 };
	dcast_producer_opts po;
	dcast_producer *p = NULL;
	uint16_t *one = calloc(N, sizeof(*one));
	uint64_t shape = 1;
	char name[256];
	int err = 0;

	REQUIRE(one);
	dcast_producer_opts_init(&po);
	REQUIRE(dcast_producer_open(b->producers, "toolarge", 0, 1, &po, &p) == 0);
	memset(name, 'n', 200);
	for (uint32_t i = 0; i < N && !err; i++) {
		snprintf(name + 200, sizeof(name) - 200, "%u", i);
		err = dcast_producer_register(p, name, DCAST_DTYPE_BF16, 1, &shape, &one[i], DCAST_MEM_HOST, 0, 1);
	}
	CHECK(err == 0);
	CHECK_ERR(dcast_producer_publish(p, 1), DCAST_ETOO_LARGE);
	CHECK(strstr(dcast_last_error(), "MANIFEST") && strstr(dcast_last_error(), "DCAST_MAX_HEADER_BYTES"));
	printf("too large: %s\n", dcast_last_error());
	dcast_producer_close(&p);
	free(one);
	CHECK(waitpid(b->pid, NULL, WNOHANG) == 0); /* the broker still runs */
}

int main(void)
{
	h_broker b;
	char cmd[128], data[96];
	char *args[] = { "--data-dir", data, NULL };

	tp_install();
	alarm(180); /* stuck: killed, never hung */
	REQUIRE(mkdtemp(root));
	snprintf(data, sizeof(data), "%s/data", root);
	test_index();
	if (tp_under_valgrind())
		TEST_SKIP("the name index checked; under valgrind the producer of 138,240 tensors misses "
			  "the broker's heartbeats, and the rest cannot run");
	REQUIRE(h_broker_start_args(&b, args) == 0);
	test_many(&b);
	test_manifest_too_large(&b);
	h_broker_stop(&b);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", root);
	return check_done("test_many_tensors");
}
