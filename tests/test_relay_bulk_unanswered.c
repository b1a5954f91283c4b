/* A relay offered a bulk transfer on a port that never answers (broker/
 * relaybulk.c): this test plays the upstream (a ROUTER speaking the wire
 * format) to a real deltacast-broker started with --upstream, and names
 * in its BULK a port whose listener's accept queue is full (backlog 0, one
 * connection never accepted), so that the kernel drops the relay's SYNs,
 * as a firewall does.  The relay says x-bulk in its first HELLO; it gives
 * the connect up after DCAST_BULK_CONNECT_MS, logs that the port is
 * unanswered, and joins again without x-bulk, within 15 s (its transfer's
 * quiet limit alone would take 30 s). */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "check.h"
#include "chunk_fit_cases.h"
#include "dcast_bulkrx.h"
#include "dcast_wire.h"
#include "proc.h"
#include "router_peer.h"

#define MODEL "rbu"
#define WAIT_MS 15000

static void *ctx, *router;
static zmq_msg_t rid;

/* The relay's next HELLO within WAIT_MS (its heartbeats passed over), its
 * routing id kept: 1, or 0 when none came. */
static int next_hello(dcast_hello *h)
{
	long end = tp_now_ms() + WAIT_MS;
	dcast_wire_in in;

	while (tp_now_ms() < end) {
		if (dcast_wire_recv(router, 1, &in, 0)) {
			dcast_wire_in_close(&in);
			continue; /* the receive timeout: look at the clock again */
		}
		if (in.msg.type == DCAST_MSG_HELLO) {
			*h = in.msg.u.hello;
			zmq_msg_close(&rid);
			zmq_msg_init(&rid);
			zmq_msg_copy(&rid, &in.rid);
			dcast_wire_in_close(&in);
			return 1;
		}
		dcast_wire_in_close(&in);
	}
	return 0;
}

/* A loopback listener with a full accept queue: its port never answers. */
static int unanswered_port(uint32_t *port, int *filler)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(fd, 0) == 0);
	REQUIRE(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
	*port = ntohs(a.sin_port);
	*filler = socket(AF_INET, SOCK_STREAM, 0);
	REQUIRE(*filler >= 0 && connect(*filler, (struct sockaddr *)&a, sizeof(a)) == 0);
	return fd;
}

/* deltacast-broker relaying MODEL from ep, its stderr into log. */
static pid_t relay_start(const char *ep, const char *log)
{
	char path[512];
	int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	char *argv[] = {path, "--producers", "tcp://127.0.0.1:*", "--consumers", "tcp://127.0.0.1:*",
			"--upstream", (char *)ep, "--upstream-model", MODEL, "--heartbeat-ms", "2000", NULL};
	pid_t pid;

	snprintf(path, sizeof(path), "%s/deltacast-broker", tp_build());
	REQUIRE(fd >= 0);
	pid = tp_spawn(argv, -1, fd);
	close(fd);
	REQUIRE(pid > 0);
	return pid;
}

int main(void)
{
	char ep[128], log[] = "/tmp/dcast-test-rbu-XXXXXX";
	size_t len = sizeof(ep);
	int timeout_ms = 1000, lfd, filler, lg;
	uint32_t port;
	dcast_hello h;
	dcast_msg b;

	alarm(60);
	tp_install();
	REQUIRE((lg = mkstemp(log)) >= 0);
	close(lg);
	REQUIRE((ctx = zmq_ctx_new()) && (router = zmq_socket(ctx, ZMQ_ROUTER)));
	REQUIRE(zmq_setsockopt(router, ZMQ_RCVTIMEO, &timeout_ms, sizeof(timeout_ms)) == 0);
	REQUIRE(zmq_bind(router, "tcp://127.0.0.1:*") == 0);
	REQUIRE(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &len) == 0);
	zmq_msg_init(&rid);
	lfd = unanswered_port(&port, &filler);
	relay_start(ep, log);
	REQUIRE(next_hello(&h));
	CHECK(h.bulk == 1 && !strcmp(h.model, MODEL));
	rp_welcome(router, &rid, MODEL);
	dcast_msg_init(&b, DCAST_MSG_BULK);
	strcpy(b.u.bulk.model, MODEL);
	b.u.bulk.version = 1, b.u.bulk.port = port, b.u.bulk.token = 0x5eed;
	b.u.bulk.chunks = 1, b.u.bulk.bytes = 2 * CFC_ELEMS;
	rp_send(router, &rid, &b, NULL, 0);
	CHECK(next_hello(&h));
	CHECK(h.bulk == 0);
	CHECK(tp_wait_log(log, "is unanswered after", 1, 1000));
	CHECK(tp_wait_log(log, "bulk off until a version comes over ZeroMQ", 1, 1000));
	tp_kill_all();
	close(filler);
	close(lfd);
	zmq_msg_close(&rid);
	zmq_close(router);
	zmq_ctx_term(ctx);
	if (!check_failures)
		unlink(log);
	return check_done("test_relay_bulk_unanswered");
}
