/* Bounded local clients of one listener (broker.h, "clients.c"): the
 * table the metrics page and the admin socket share.  Each protocol keeps
 * its own per-client state after the struct broker_client at the head of
 * its slot, and its own readiness callback; this file takes connections
 * into free slots, closes them at their deadline or on request, and owns
 * the listener. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "broker.h"
#include "dcast_common.h"

static struct broker_client *slot_at(const struct broker_clients *t, uint32_t i)
{
	return (struct broker_client *)(t->slots + (size_t)i * t->slot_bytes);
}

void broker_clients_close(struct broker *b, struct broker_clients *t, struct broker_client *c)
{
	DCAST_ASSERT(c->used);
	if (t->on_free)
		t->on_free(c);
	broker_poll_del(b, c->fd);
	close(c->fd);
	memset(c, 0, t->slot_bytes);
}

void broker_clients_timers(struct broker *b, struct broker_clients *t, uint64_t now_ms)
{
	for (uint32_t i = 0; t->slots && i < t->cap; i++) {
		struct broker_client *c = slot_at(t, i);
		if (c->used && now_ms >= c->deadline_ms)
			broker_clients_close(b, t, c);
	}
}

/* A new connection into a free slot; with none free (or a full poll set)
 * it is closed at once. */
static void client_take(struct broker *b, struct broker_clients *t, int fd)
{
	struct broker_client *c = NULL;

	for (uint32_t i = 0; !c && i < t->cap; i++)
		c = slot_at(t, i)->used ? NULL : slot_at(t, i);
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
		if (slot_at(t, i)->used)
			broker_clients_close(b, t, slot_at(t, i));
	free(t->slots);
	t->slots = NULL;
	if (t->listen_fd < 0)
		return;
	broker_poll_del(b, t->listen_fd);
	close(t->listen_fd);
	t->listen_fd = -1;
}
