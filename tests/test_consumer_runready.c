/* A version waits READY while the engine changes what it holds.
 *
 * A bind: an anchor staged into the consumer's own host copies is READY
 * (its event queued) when the engine binds a tensor to its memory.  The
 * bind drops the anchor (its bytes were in the copy that moves) and it is
 * fetched again; poll() must not give the queued READY of the dropped
 * version, which apply() would refuse, but the next one, which applies.
 *
 * A run change: run A's anchor is staged and
 * checked in a library consumer that has not applied it (an engine waiting
 * for its pause point).  The model then starts over as run B, with other
 * weights: once the broker restarted without a data dir, once deleted and
 * created again through the admin socket.  Run A's READY version must be
 * dropped before anything of run B is taken: the consumer ends at run B's
 * version 2, bit-exact, and never applies run A's weights as run B's. */
#include <inttypes.h>
#include <signal.h>
#include <sys/stat.h>
#include "check.h"
#include "consumer_harness.h"

#define BUDGET (8u << 20)

static char root[64] = "/tmp/dcast-runready.XXXXXX";

static dcast_consumer *open_held(const h_broker *b, const char *model)
{
	char dir[128];
	dcast_consumer_opts o;
	dcast_consumer *c = NULL;

	snprintf(dir, sizeof(dir), "%s/%s", root, model);
	dcast_consumer_opts_init(&o);
	o.auto_apply = 0;
	o.heartbeat_ms = 200;
	REQUIRE(dcast_consumer_open(b->consumers, model, dir, BUDGET, &o, &c) == 0);
	return c;
}

/* Wait (20 s at most) until READY reaches v or the run confirmed leaves
 * `run` for another, as `until` says. */
typedef struct waiter {
	dcast_consumer *c;
	uint64_t v, run;
} waiter;

static int ready_reached(void *arg)
{
	waiter *w = arg;
	uint64_t r = dcast_consumer_ready_version(w->c);
	dcast_event ev;

	while (dcast_consumer_poll(w->c, 0, &ev) == 0 && ev.type != DCAST_EV_NONE)
		;
	return r != DCAST_VERSION_NONE && r >= w->v;
}

static int run_moved(void *arg)
{
	waiter *w = arg;
	uint64_t run = dcast_consumer_run(w->c);

	return run && run != w->run;
}

/* Delete `model` through the broker's admin socket. */
static int admin_delete(const char *sock, const char *model)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "'%s/deltacast' model delete %s --admin-socket '%s' >/dev/null", tp_build(),
		 model, sock);
	return system(cmd);
}

enum { BY_RESTART, BY_DELETE };

static void run_change_case(h_broker *b, const char *model, int how, const char *sock)
{
	dcast_producer *p = NULL;
	dcast_consumer *c;
	h_model a, bm;
	waiter w = {0};
	int exact;

	REQUIRE(h_model_start(b, model, 71, 1, 100, &a, &p) == 0);
	c = open_held(b, model);
	w = (waiter){c, 1, 0};
	REQUIRE(tp_wait_until(20000, ready_reached, &w) > 0);
	CHECK(dcast_consumer_version(c) == DCAST_VERSION_NONE); /* READY, not applied */
	w.run = dcast_consumer_run(c);
	CHECK(w.run != 0);
	dcast_producer_close(&p);
	if (how == BY_RESTART) {
		tp_broker_kill(b, SIGKILL);
		REQUIRE(tp_broker_start(b) == 0);
	} else {
		CHECK(admin_delete(sock, model) == 0);
	}
	/* Run B: the same names and shapes, other weights, two versions. */
	REQUIRE(h_model_start(b, model, 72, 2, 100, &bm, &p) == 0);
	CHECK(tp_wait_until(20000, run_moved, &w) > 0);
	w.v = 2;
	CHECK(tp_wait_until(20000, ready_reached, &w) > 0);
	CHECK_ERR(dcast_consumer_apply(c, 2), 0);
	CHECK(dcast_consumer_version(c) == 2);
	exact = h_equal(c, &bm, 2);
	CHECK(exact);
	CHECK(!h_equal(c, &a, 1));
	printf("%s: run %016" PRIx64 " -> %016" PRIx64 ", version 2 %s\n", model, w.run, dcast_consumer_run(c),
	       exact ? "of the new run, bit-exact" : "NOT the new run's weights");
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&a);
	h_model_free(&bm);
}

static int ready_quiet(void *arg)
{
	waiter *w = arg;
	uint64_t r = dcast_consumer_ready_version(w->c);

	return r != DCAST_VERSION_NONE && r >= w->v;
}

/* The first READY event within ms: its version, or NONE. */
static uint64_t ready_within(dcast_consumer *c, int ms)
{
	dcast_event ev;

	for (int i = 0; i < ms / 50; i++)
		if (dcast_consumer_poll(c, 50, &ev) == 0 && ev.type == DCAST_EV_VERSION_READY)
			return ev.version;
	return DCAST_VERSION_NONE;
}

static void bind_case(h_broker *b)
{
	dcast_producer *p = NULL;
	dcast_consumer *c;
	h_model m;
	waiter w;
	uint64_t v;
	unsigned char *mine = NULL;

	REQUIRE(h_model_start(b, "m_bind", 73, 1, 100, &m, &p) == 0);
	c = open_held(b, "m_bind");
	w = (waiter){c, 1, 0};
	REQUIRE(tp_wait_until(20000, ready_quiet, &w) > 0); /* its READY event stays queued */
	REQUIRE((mine = calloc(1, m.bytes[0])) != NULL);
	tp_broker_kill(b, SIGSTOP); /* the anchor cannot come again before the polls below */
	CHECK_ERR(dcast_consumer_bind(c, m.name[0], mine, DCAST_MEM_HOST, m.bytes[0]), 0);
	CHECK(dcast_consumer_ready_version(c) == DCAST_VERSION_NONE); /* dropped: fetched again */
	CHECK(ready_within(c, 300) == DCAST_VERSION_NONE);          /* the queued READY is not given */
	tp_broker_kill(b, SIGCONT);
	v = ready_within(c, 20000);
	CHECK(v == 1);
	CHECK_ERR(dcast_consumer_apply(c, v), 0);
	CHECK(dcast_consumer_version(c) == 1);
	CHECK(h_equal(c, &m, 1));
	CHECK(!memcmp(mine, m.snap[1][0], m.bytes[0]));
	printf("m_bind: READY of the dropped anchor not given; version %" PRIu64 " applied\n", v);
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
	free(mine);
}

int main(void)
{
	char sock[128];
	char *extra[] = {"--admin-socket", sock, NULL};
	h_broker b;

	REQUIRE(mkdtemp(root));
	snprintf(sock, sizeof(sock), "%s/admin.sock", root);
	REQUIRE(h_broker_start_args(&b, extra) == 0);
	bind_case(&b);
	run_change_case(&b, "m_restart", BY_RESTART, sock);
	run_change_case(&b, "m_delete", BY_DELETE, sock);
	h_broker_stop(&b);
	return check_done("test_consumer_runready");
}
