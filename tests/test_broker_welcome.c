/* A HELLO that finds the consumer's pipe full still gets its WELCOME.  A
 * consumer with a one-message receive queue and a small TCP buffer joins,
 * then stops reading while a producer publishes far more messages than
 * the broker's send queue holds (ZeroMQ's default high-water mark, 1000),
 * so the broker's sends to it fail with EAGAIN.  It then re-joins with a
 * second HELLO and drains: the second WELCOME must arrive, after the old
 * stream's messages and before the new stream's, which starts again from
 * the anchor and ends at the last version, bit-exact.  (A WELCOME sent
 * with ZMQ_DONTWAIT at HELLO time was lost there, and the consumer waited
 * for it with the new stream going by.) */
#include "broker_harness.h"

#define VERSIONS 600 /* x 9 messages: far past 1000 queued plus the TCP buffers */
#define MSGS_PER_VERSION 9 /* 8 chunks and a COMMIT */

struct drain {
	int welcomes;                   /* WELCOMEs received */
	uint64_t after_welcome_commits; /* COMMITs after the second WELCOME */
	uint64_t before_welcome_msgs;   /* messages between HELLO and WELCOME */
};

/* A consumer whose receive side holds little: one queued message, a
 * small TCP buffer. */
static void open_small_consumer(struct h_client *c, int port)
{
	int one = 1, small = 4096;

	h_client_socket(c, "welcome/model");
	zmq_setsockopt(c->sock, ZMQ_RCVHWM, &one, sizeof(one));
	zmq_setsockopt(c->sock, ZMQ_RCVBUF, &small, sizeof(small));
	h_client_connect(c, port);
}

static void send_heartbeat(struct h_client *c)
{
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_HEARTBEAT);
	REQUIRE(h_send(c, &m, NULL) == 0);
}

/* Read until 3 s pass without a message; count WELCOMEs and what follows. */
static void drain(struct h_client *c, struct drain *d)
{
	for (int idle = 0; idle < 30;) {
		dcast_wire_in in;

		if (dcast_wire_recv(c->sock, 0, &in, 0)) {
			idle++;
			if (idle % 5 == 0)
				send_heartbeat(c);
			continue;
		}
		idle = 0;
		if (in.msg.type == DCAST_MSG_WELCOME && ++d->welcomes == 2)
			memset(c->state, 0, sizeof(c->state)); /* the new stream starts at the anchor */
		else if (d->welcomes < 2)
			d->before_welcome_msgs++;
		if (d->welcomes == 2) {
			h_consumer_handle(c, &in);
			d->after_welcome_commits += in.msg.type == DCAST_MSG_COMMIT;
		}
		dcast_wire_in_close(&in);
	}
}

int main(void)
{
	static struct h_client prod, cons;
	tp_broker br = {0};
	struct drain d = {.welcomes = 1}; /* the first, read by h_pump */
	uint32_t rng = 777;
	char dir[] = "/tmp/dcast_test_welcome_XXXXXX";

	h_init();
	REQUIRE(mkdtemp(dir));
	snprintf(br.log, sizeof(br.log), "%s/broker.log", dir);
	br.extra[br.n_extra++] = "--heartbeat-ms";
	br.extra[br.n_extra++] = "3000";
	br.with_metrics = 1;
	REQUIRE(h_broker_start(&br) == 0);

	/* The producer creates the model first: a consumer that waited for it
	 * would get a second WELCOME naming its run (broker_rewelcome). */
	h_client_open(&prod, br.pport, "welcome/model");
	REQUIRE(h_producer_join(&prod) == 0);
	open_small_consumer(&cons, br.cport);
	h_hello(&cons, DCAST_ROLE_CONSUMER, DCAST_VERSION_NONE);
	CHECK(h_pump(&cons, 1, h_done_welcomed, 50));

	/* The consumer reads nothing from here on until its second HELLO. */
	for (uint64_t v = 1; v <= VERSIONS; v++) {
		h_mutate(&prod, &rng, v == 1 ? 1 : 50);
		CHECK(h_client_publish(&prod, v, v == 1, 100) == 0);
		if (v % 20 == 0)
			send_heartbeat(&cons); /* not silent: the broker keeps it */
	}
	/* the broker's sends to the consumer now fail with EAGAIN */
	CHECK(tp_wait_metric(br.mport, "deltacast_consumers_blocked", 1, 5000));

	h_hello(&cons, DCAST_ROLE_CONSUMER, DCAST_VERSION_NONE);
	drain(&cons, &d);
	printf("second WELCOME after %llu messages of the old stream; %llu COMMITs after it, last version %lld\n",
	       (unsigned long long)d.before_welcome_msgs, (unsigned long long)d.after_welcome_commits,
	       (long long)cons.version);
	CHECK(d.welcomes == 2);
	/* The pipe really was full at HELLO: the old stream stopped short. */
	CHECK(d.before_welcome_msgs > 1000 && d.before_welcome_msgs < VERSIONS * MSGS_PER_VERSION);
	CHECK(d.after_welcome_commits >= 1);
	CHECK(cons.version == VERSIONS);
	CHECK(cons.errors == 0 && cons.digest_mismatch == 0);
	CHECK(memcmp(cons.state, prod.state, sizeof(prod.state)) == 0);

	h_client_close(&cons);
	h_client_close(&prod);
	return h_finish(&br, dir, "test_broker_welcome");
}
