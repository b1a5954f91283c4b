/* The broker names its consumer endpoint, as bound, in every WELCOME to a
 * producer (WELCOME.x-consumers) and in none to a consumer.  A producer of
 * the library reads it back (dcast_producer_consumer_endpoint): the
 * endpoint a new producer process fetches its baseline from without being
 * told where. */
#include "broker_harness.h"
#include "deltacast/producer.h"

/* The next WELCOME on c into *w; 0 when none came within about 5 s. */
static int recv_welcome(struct h_client *c, dcast_welcome *w)
{
	for (int idle = 0; idle < 50;) {
		dcast_wire_in in;
		int got = 0;

		if (dcast_wire_recv(c->sock, 0, &in, 0)) {
			idle++;
			continue;
		}
		if (in.msg.type == DCAST_MSG_WELCOME) {
			*w = in.msg.u.welcome;
			got = 1;
		}
		dcast_wire_in_close(&in);
		if (got)
			return 1;
	}
	return 0;
}

static void check_library(const tp_broker *br)
{
	dcast_producer_opts o;
	dcast_producer *p = NULL;
	char ep[64];

	dcast_producer_opts_init(&o);
	REQUIRE(dcast_producer_open(br->producers, "wc/lib", 0, 1, &o, &p) == DCAST_OK);
	CHECK_ERR(dcast_producer_consumer_endpoint(p, ep, sizeof(ep)), DCAST_OK);
	CHECK(strcmp(ep, br->consumers) == 0);
	CHECK_ERR(dcast_producer_consumer_endpoint(p, ep, 8), DCAST_ETOO_LARGE);
	CHECK_ERR(dcast_producer_consumer_endpoint(NULL, ep, sizeof(ep)), DCAST_EINVAL);
	dcast_producer_close(&p);
}

int main(void)
{
	static struct h_client prod, cons;
	tp_broker br = {0};
	dcast_welcome w;
	char dir[] = "/tmp/dcast_test_welcome_consumers_XXXXXX";

	h_init();
	REQUIRE(mkdtemp(dir));
	snprintf(br.log, sizeof(br.log), "%s/broker.log", dir);
	REQUIRE(h_broker_start(&br) == 0);

	h_client_open(&prod, br.pport, "wc/model");
	h_hello(&prod, DCAST_ROLE_PRODUCER, DCAST_VERSION_NONE);
	REQUIRE(recv_welcome(&prod, &w));
	printf("WELCOME to a producer: consumers \"%s\"\n", w.consumers);
	CHECK(strcmp(w.consumers, br.consumers) == 0);

	h_client_open(&cons, br.cport, "wc/model");
	h_hello(&cons, DCAST_ROLE_CONSUMER, DCAST_VERSION_NONE);
	REQUIRE(recv_welcome(&cons, &w));
	CHECK(strcmp(w.consumers, "") == 0);

	check_library(&br);
	h_client_close(&cons);
	h_client_close(&prod);
	return h_finish(&br, dir, "test_broker_welcome_consumers");
}
