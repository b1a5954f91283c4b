/* /metrics over real processes: after a producer publishes three versions
 * and a consumer applies and ACKs them, GET /metrics on --metrics shows the
 * versions, bytes in and out, the consumer with its version and lag 0;
 * another path gets 404.  Once the log is quiet the broker gives its freed
 * heap back (a trim, none due after it). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include "broker_harness.h"

static char dir[] = "/tmp/dcast_test_metrics_XXXXXX";

/* Ready: /metrics on *port shows the consumer of metrics/model at version 3
 * (its ACK has arrived). */
static int consumer_at_3(void *port)
{
	const char *p;

	if (tp_http_get(*(int *)port, "/metrics") <= 0)
		return 0;
	p = strstr(tp_page, "\ndeltacast_consumer_version{model=\"metrics/model\"");
	p = p ? strstr(p, "} ") : NULL;
	return p && strtoull(p + 2, NULL, 10) == 3;
}

int main(void)
{
	static struct h_client prod, cons;
	tp_broker br = {0};
	uint32_t rng = 7;
	dcast_msg ack;

	h_init();
	REQUIRE(mkdtemp(dir));
	snprintf(br.log, sizeof(br.log), "%s/broker.log", dir);
	br.with_metrics = 1;
	REQUIRE(h_broker_start(&br) == 0);
	CHECK(check_file_has(br.log, "metrics on http://"));

	h_client_open(&prod, br.pport, "metrics/model");
	REQUIRE(h_producer_join(&prod) == 0);
	for (uint64_t v = 1; v <= 3; v++) {
		h_mutate(&prod, &rng, v == 1 ? 1 : 30);
		CHECK(h_client_publish(&prod, v, v == 1, 100) == 0);
	}
	h_client_open(&cons, br.cport, "metrics/model");
	CHECK(h_consume_until(&cons, DCAST_VERSION_NONE, 3, 100) == 0);
	dcast_msg_init(&ack, DCAST_MSG_ACK);
	snprintf(ack.u.ack.model, sizeof(ack.u.ack.model), "metrics/model");
	ack.u.ack.version = 3;
	CHECK(h_send(&cons, &ack, NULL) == 0);

	/* The ACK travels asynchronously: wait until the page shows it. */
	CHECK(tp_wait_until(5000, consumer_at_3, &br.mport));
	CHECK(strncmp(tp_page, "HTTP/1.0 200 OK", 15) == 0);
	CHECK(tp_metric("deltacast_versions_committed_total") == 3);
	CHECK(tp_metric("deltacast_consumers_connected") == 1);
	CHECK(tp_metric("deltacast_consumer_joins_total") == 1); /* one HELLO, no re-join */
	CHECK(tp_metric("deltacast_producers_connected") == 1);
	CHECK(tp_metric("deltacast_bytes_in_total") > 0);
	CHECK(tp_metric("deltacast_bytes_out_total") == tp_metric("deltacast_bytes_in_total"));
	CHECK(tp_metric("deltacast_model_version{model=\"metrics/model\"}") == 3);
	CHECK(strstr(tp_page, "deltacast_consumer_lag_versions{model=\"metrics/model\"") != NULL);
	CHECK(strstr(tp_page, "# TYPE deltacast_bytes_in_total counter") != NULL);
	CHECK(tp_wait_metric(br.mport, "deltacast_heap_trims_total", 1, 5000));
	CHECK(tp_metric_now(br.mport, "deltacast_heap_trim_due") == 0); /* nothing changed since */
	CHECK(strstr(tp_page, "\ndeltacast_heap_trim_max_ms ") != NULL);
	CHECK(tp_http_get(br.mport, "/nope") > 0 && strstr(tp_page, "404") != NULL);
	if (check_failures)
		fprintf(stderr, "page:\n%s\n", tp_page);

	h_client_close(&prod);
	h_client_close(&cons);
	return h_finish(&br, dir, "test_broker_metrics");
}
