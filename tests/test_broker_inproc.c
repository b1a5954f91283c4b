/* The broker embedded: two brokers run in one process, each broker_run on
 * a thread of its own (all of a broker's state is in its
 * struct broker; signals are the program's, not the broker's).  Both have
 * a data dir, broker-made anchors, --metrics and --admin-socket, so every
 * part that used to keep file-scope state runs twice at once.  A library
 * producer publishes through each (different data), a library consumer
 * reads each back bit-exact; both brokers stop (b->stop) and close; the
 * first is opened again on its data dir and serves what it restored. */
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>
#include "../broker/broker.h"
#include "../broker/limits.h"
#include "check.h"
#include "deltacast/consumer.h"
#include "deltacast/producer.h"

#define N 20000 /* bf16 elements */

struct inproc {
	struct broker b;
	pthread_t th;
	int rc;
	char prod[128], cons[128], data[256], sock[256];
};

static void *run_main(void *arg)
{
	struct inproc *x = arg;

	x->rc = broker_run(&x->b);
	return NULL;
}

static void endpoint(void *sock, char *out, size_t cap)
{
	size_t len = cap;

	REQUIRE(zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, out, &len) == 0);
}

static void start(struct inproc *x)
{
	char *argv[] = {"deltacast-broker", "--producers", "tcp://127.0.0.1:*", "--consumers",
			"tcp://127.0.0.1:*", "--data-dir", x->data, "--metrics", "127.0.0.1:0",
			"--admin-socket", x->sock, "--anchor-every", "2", NULL};
	struct broker_config cfg;

	REQUIRE(broker_config_parse(&cfg, 13, argv) == 0 && broker_config_check(&cfg) == 0);
	broker_limits_memory(&cfg); /* --max-pending-total-bytes 0: a share of memory, as main.c */
	REQUIRE(broker_open(&x->b, &cfg) == 0); /* no --config: cfg owns no strings */
	endpoint(x->b.producers, x->prod, sizeof(x->prod));
	endpoint(x->b.consumers, x->cons, sizeof(x->cons));
	REQUIRE(pthread_create(&x->th, NULL, run_main, x) == 0);
}

static void stop(struct inproc *x)
{
	x->b.stop = 1; /* what main.c's signal callback does */
	pthread_join(x->th, NULL);
	CHECK(x->rc == 0);
	broker_close(&x->b);
}

static void fill(uint16_t *w, uint64_t seed, int every)
{
	for (uint64_t i = 0; i < N; i += (uint64_t)every)
		w[i] = (uint16_t)((i * 2654435761u) ^ seed);
}

/* Versions 1 (anchor) and 2 (a delta) of a tensor through x. */
static void publish(struct inproc *x, uint16_t *w, uint64_t seed)
{
	uint64_t shape[1] = {N};
	dcast_producer *p = NULL;

	fill(w, seed, 1);
	REQUIRE(dcast_producer_open(x->prod, "m", 0, 1, NULL, &p) == 0);
	REQUIRE(dcast_producer_register(p, "w", DCAST_DTYPE_BF16, 1, shape, w, DCAST_MEM_HOST, 0, N) == 0);
	CHECK_ERR(dcast_producer_publish(p, 1), 0);
	CHECK_ERR(dcast_producer_wait(p, 1, 20000), 0);
	fill(w, seed + 1, 7);
	CHECK_ERR(dcast_producer_publish(p, 2), 0);
	CHECK_ERR(dcast_producer_wait(p, 2, 20000), 0);
	dcast_producer_close(&p);
}

/* A consumer of x (state in dir) holds version 2, equal to w. */
static int read_back(const struct inproc *x, const char *dir, const uint16_t *w)
{
	dcast_consumer_opts o;
	dcast_consumer *c = NULL;
	void *ptr = NULL;
	int same;

	dcast_consumer_opts_init(&o);
	o.auto_apply = 1;
	REQUIRE(dcast_consumer_open(x->cons, "m", dir, 8 << 20, &o, &c) == 0);
	CHECK_ERR(dcast_consumer_wait_version(c, 2, 20000), 0);
	same = dcast_consumer_version(c) == 2 && dcast_consumer_tensor(c, "w", &ptr, NULL, NULL) == 0 &&
	       !memcmp(ptr, w, N * 2);
	dcast_consumer_close(&c);
	return same;
}

int main(void)
{
	static struct inproc x[2];
	static uint16_t w[2][N];
	char dir[] = "/tmp/dcast-test-inproc-XXXXXX", cdir[300];

	alarm(100);
	REQUIRE(mkdtemp(dir));
	for (int i = 0; i < 2; i++) {
		snprintf(x[i].data, sizeof(x[i].data), "%s/data%d", dir, i);
		snprintf(x[i].sock, sizeof(x[i].sock), "%s/admin%d.sock", dir, i);
		start(&x[i]);
	}
	CHECK(strcmp(x[0].prod, x[1].prod) != 0);
	for (int i = 0; i < 2; i++)
		publish(&x[i], w[i], 100 * (uint64_t)i + 5);
	CHECK(memcmp(w[0], w[1], sizeof(w[0])) != 0); /* two models apart */
	for (int i = 0; i < 2; i++) {
		snprintf(cdir, sizeof(cdir), "%s/c%d", dir, i);
		CHECK(read_back(&x[i], cdir, w[i]));
	}
	for (int i = 0; i < 2; i++)
		stop(&x[i]);
	CHECK(access(x[0].sock, F_OK) != 0 && access(x[1].sock, F_OK) != 0); /* unlinked at close */
	start(&x[0]); /* the same data dir: version 2 restored */
	snprintf(cdir, sizeof(cdir), "%s/c-again", dir);
	CHECK(read_back(&x[0], cdir, w[0]));
	stop(&x[0]);
	check_remove_dir(dir);
	return check_done("test_broker_inproc");
}
