/* Bounded local clients of one listener (broker.h, "clients.c"): the
 * table the metrics page and the admin socket share.  Each protocol keeps
 * its own per-client state after the struct broker_client at the head of
 * its slot, and its own readiness callback; this file takes connections
 * into free slots, closes them at their deadline or on request, and owns
 * the listener. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "broker.h"
#include "dcast_common.h"

struct broker_client *broker_clients_slot(const struct broker_clients *t, uint32_t i)
{
	return (struct broker_client *)(t->slots + (size_t)i * t->slot_bytes);
}

void broker_clients_close(struct broker *b, struct broker_clients *t, struct broker_client *c)
{
	DCAST_ASSERT(c->used && !c->busy);
	if (t->on_free)
		t->on_free(c);
	broker_poll_del(b, c->fd);
	close(c->fd);
	memset(c, 0, t->slot_bytes);
}

void broker_clients_timers(struct broker *b, struct broker_clients *t, uint64_t now_ms)
{
	for (uint32_t i = 0; t->slots && i < t->cap; i++) {
		struct broker_client *c = broker_clients_slot(t, i);
		if (c->used && !c->busy && now_ms >= c->deadline_ms)
			broker_clients_close(b, t, c);
	}
}

/* A new connection into a free slot; with none free (or a full poll set)
 * it is closed at once. */
static void client_take(struct broker *b, struct broker_clients *t, int fd)
{
	struct broker_client *c = NULL;

	for (uint32_t i = 0; !c && i < t->cap; i++)
		c = broker_clients_slot(t, i)->used ? NULL : broker_clients_slot(t, i);
	if (!c || broker_poll_add(b, fd, t->on_client, c)) {
		close(fd);
		return;
	}
	memset(c, 0, t->slot_bytes);
	*c = (struct broker_client){.used = 1, .fd = fd, .deadline_ms = dcast_now_ms() + t->client_ms};
	if (t->on_accept)
		t->on_accept(b, c);
}

static void on_listener(struct broker *b, int lfd, void *arg)
{
	struct broker_clients *t = arg;

	for (uint32_t i = 0; i < t->burst; i++) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		client_take(b, t, fd);
	}
}

int broker_clients_start(struct broker *b, struct broker_clients *t, int listen_fd)
{
	int rc;

	DCAST_ASSERT(t->listen_fd < 0 && t->cap && t->slot_bytes >= sizeof(struct broker_client));
	if (!(t->slots = calloc(t->cap, t->slot_bytes))) {
		close(listen_fd);
		return dcast_fail(DCAST_ENOMEM, "%s: %u client slots", t->what, t->cap);
	}
	if ((rc = broker_poll_add(b, listen_fd, on_listener, t))) {
		close(listen_fd);
		free(t->slots);
		t->slots = NULL;
		return rc;
	}
	t->listen_fd = listen_fd;
	return 0;
}

void broker_clients_stop(struct broker *b, struct broker_clients *t)
{
	for (uint32_t i = 0; t->slots && i < t->cap; i++)
		if (broker_clients_slot(t, i)->used)
			broker_clients_close(b, t, broker_clients_slot(t, i));
	free(t->slots);
	t->slots = NULL;
	if (t->listen_fd < 0)
		return;
	broker_poll_del(b, t->listen_fd);
	close(t->listen_fd);
	t->listen_fd = -1;
}

static int parse_addr(const char *flag, const char *s, struct sockaddr_in *sa)
{
	char host[64];
	const char *colon = strrchr(s, ':');
	char *end;
	unsigned long port;

	if (!colon || (size_t)(colon - s) >= sizeof(host))
		return dcast_fail(DCAST_EINVAL, "%s \"%s\": want HOST:PORT", flag, s);
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = '\0';
	port = strtoul(colon + 1, &end, 10);
	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	sa->sin_port = htons((uint16_t)port);
	if (*end || end == colon + 1 || port > 65535 || inet_pton(AF_INET, host, &sa->sin_addr) != 1)
		return dcast_fail(DCAST_EINVAL, "%s \"%s\": want IPv4-HOST:PORT (0..65535; 0: "
				  "any free port, named in the log)", flag, s);
	return 0;
}

int broker_tcp_listen(const char *flag, const char *addr, uint16_t *port)
{
	struct sockaddr_in sa;
	int fd, one = 1, rc;

	if ((rc = parse_addr(flag, addr, &sa)))
		return -rc;
	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(fd, (const struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 64)) {
		rc = dcast_fail(DCAST_EIO, "%s %s: %s", flag, addr, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -rc;
	}
	if (port)
		*port = broker_tcp_bound(fd).port;
	return fd;
}

struct broker_addr broker_tcp_bound(int fd)
{
	struct broker_addr a = {"?", 0};
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	char host[INET_ADDRSTRLEN] = "?";

	if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0) {
		inet_ntop(AF_INET, &sa.sin_addr, host, sizeof(host));
		a.port = ntohs(sa.sin_port);
	}
	snprintf(a.text, sizeof(a.text), "%s:%u", host, (unsigned)a.port);
	return a;
}
