/* One listener per ZeroMQ I/O thread on a TCP endpoint.
 *
 * ZeroMQ gives each accepted connection to the I/O thread with the least
 * load, but a thread's load grows only once it has taken the connection
 * over (a command it processes later): a burst of consumers joining at
 * once, a restarted fleet, lands on one or two threads, and those move
 * every byte to all of them while the others idle (16 receive-only
 * consumers of a 201 MB anchor, 8 I/O threads: one thread did 47 of 82
 * ticks of their sending, four did none).  So an endpoint tcp://IPV4:PORT
 * or tcp:// * :PORT (PORT a number, or * for one the kernel picks) is
 * bound once per I/O thread: each listener is a TCP socket of ours on the
 * same address and port with SO_REUSEPORT, so that the kernel spreads the
 * incoming connections over them (by a hash of each connection's
 * addresses), handed to ZeroMQ (ZMQ_USE_FD) with ZMQ_AFFINITY naming its
 * thread, whose connections then all run there.
 *
 * SO_REUSEPORT would also let a second broker of the same user bind the
 * port and take half the connections: a plain bind of the address first
 * (ZeroMQ's own way, SO_REUSEADDR only) refuses a port that anything holds,
 * a broker's group of listeners included, and picks the port for "*".
 * Other endpoints (host names, interface names, IPv6, ipc://), and a
 * single I/O thread, are bound by ZeroMQ as they are. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "broker.h"

#define LISTEN_BACKLOG 100 /* ZeroMQ's default ZMQ_BACKLOG */

/* "tcp://HOST:PORT" with HOST "*" or an IPv4 address, PORT "*" or
 * 1..65535, into *sa (port 0 for "*") and host; -1 for anything else. */
static int parse_tcp4(const char *ep, struct sockaddr_in *sa, char *host, size_t cap)
{
	const char *colon = strrchr(ep, ':'), *h;
	char *end;
	unsigned long port = 0;

	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	if (strncmp(ep, "tcp://", 6))
		return -1;
	h = ep + 6;
	if (!colon || colon <= h || (size_t)(colon - h) >= cap)
		return -1;
	memcpy(host, h, (size_t)(colon - h));
	host[colon - h] = '\0';
	if (strcmp(colon + 1, "*")) {
		port = strtoul(colon + 1, &end, 10);
		if (end == colon + 1 || *end || !port || port > 65535)
			return -1;
	}
	sa->sin_port = htons((uint16_t)port);
	if (!strcmp(host, "*"))
		sa->sin_addr.s_addr = htonl(INADDR_ANY);
	else if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
		return -1;
	return 0;
}

/* A TCP socket bound to *sa (SO_REUSEPORT when `group`), listening when
 * `group`; fd, or -1 with errno set. */
static int tcp_socket(const struct sockaddr_in *sa, int group)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, e;

	if (fd < 0)
		return -1;
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    (group && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one))) ||
	    bind(fd, (const struct sockaddr *)sa, sizeof(*sa)) || (group && listen(fd, LISTEN_BACKLOG))) {
		e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

/* The plain bind of the address: fails when anything holds the port;
 * for port 0, picks one (into sa). */
static int probe_port(struct sockaddr_in *sa, const char *endpoint, const char *which)
{
	socklen_t len = sizeof(*sa);
	int fd = tcp_socket(sa, 0);

	if (fd < 0)
		return dcast_fail(DCAST_EZMQ, "--%s %s: bind: %s", which, endpoint, strerror(errno));
	if (!sa->sin_port && getsockname(fd, (struct sockaddr *)sa, &len)) {
		int e = errno;
		close(fd);
		return dcast_fail(DCAST_EZMQ, "--%s %s: getsockname: %s", which, endpoint, strerror(e));
	}
	close(fd);
	return 0;
}

/* ZeroMQ sets ZMQ_SNDBUF on the listeners it makes, and the connections
 * they accept inherit it; on a listener of ours (ZMQ_USE_FD) it sets
 * nothing, so the socket's ZMQ_SNDBUF (-1: the kernel's) is set here. */
static int listener_sndbuf(void *sock, int fd)
{
	int bytes = -1;
	size_t len = sizeof(bytes);

	if (zmq_getsockopt(sock, ZMQ_SNDBUF, &bytes, &len) || bytes < 0)
		return 0;
	return setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
}

/* Listener i of the group: its socket, handed to ZeroMQ for thread i. */
static int bind_one(void *sock, const struct sockaddr_in *sa, const char *host, unsigned i, const char *which)
{
	char ep[64];
	uint64_t affinity = 1ull << i;
	int fd = tcp_socket(sa, 1);

	snprintf(ep, sizeof(ep), "tcp://%s:%u", host, (unsigned)ntohs(sa->sin_port));
	if (fd < 0)
		return dcast_fail(DCAST_EZMQ, "--%s %s: listener %u: %s", which, ep, i, strerror(errno));
	if (listener_sndbuf(sock, fd)) {
		int e = errno;
		close(fd);
		return dcast_fail(DCAST_EZMQ, "--%s %s: listener %u: SO_SNDBUF: %s", which, ep, i, strerror(e));
	}
	if (zmq_setsockopt(sock, ZMQ_USE_FD, &fd, sizeof(fd)) ||
	    zmq_setsockopt(sock, ZMQ_AFFINITY, &affinity, sizeof(affinity)) || zmq_bind(sock, ep)) {
		int e = errno;
		close(fd); /* ZeroMQ owns it only once bound */
		return dcast_fail(DCAST_EZMQ, "--%s %s: listener %u: %s", which, ep, i, zmq_strerror(e));
	}
	return 0;
}

int broker_bind(struct broker *b, void *sock, const char *endpoint, const char *which)
{
	struct sockaddr_in sa;
	char host[INET_ADDRSTRLEN + 1];
	int n = zmq_ctx_get(b->ctx, ZMQ_IO_THREADS), none = -1, rc;
	uint64_t any = 0;
	unsigned bound = 0;

	if (n < 2 || n > 64 || parse_tcp4(endpoint, &sa, host, sizeof(host)))
		return zmq_bind(sock, endpoint) ? dcast_fail(DCAST_EZMQ, "--%s %s: bind: %s", which, endpoint,
							     zmq_strerror(errno)) : 0;
	if ((rc = probe_port(&sa, endpoint, which)))
		return rc;
	while (bound < (unsigned)n && !(rc = bind_one(sock, &sa, host, bound, which)))
		bound++;
	zmq_setsockopt(sock, ZMQ_USE_FD, &none, sizeof(none)); /* back to ZeroMQ's defaults */
	zmq_setsockopt(sock, ZMQ_AFFINITY, &any, sizeof(any));
	if (!bound)
		return rc;
	if (rc) /* the listeners bound serve; the connections spread over fewer threads */
		DCAST_LOG_W("%s: %u of %d listeners: %s", which, bound, n, dcast_last_error());
	DCAST_LOG_D("%s: %u listeners on one port, one per ZeroMQ I/O thread", which, bound);
	return 0;
}
