/* Bulk anchors, --bulk HOST:PORT (bulk.c; docs/protocol.md, "Bulk
 * anchors"): a committed anchor to a consumer that asked, over a plain TCP
 * connection with sendfile(2), outside ZeroMQ, or to one on this host over
 * a unix socket, its payloads as references to the files that hold them. */
#ifndef BROKER_BULK_H
#define BROKER_BULK_H

#include "broker.h"

/* Listen on --bulk (nothing without it), and unless --bulk-no-local on the
 * unix socket @deltacast-bulk-PORT (one that cannot be bound is logged and
 * left out): the listeners and their connections join the loop's poll
 * set.  Errors: DCAST_EINVAL (a bad address, or
 * --curve-secret too: bulk bytes would travel in the clear), DCAST_EIO
 * (bind or listen refused), DCAST_ENOMEM, DCAST_EBUSY (poll set full). */
int broker_bulk_open(struct broker *b);

/* Close the listener and every connection (each drops its version
 * reference), the bulk threads stopped first.  Idempotent. */
void broker_bulk_close(struct broker *b);

/* The loop's timer turn: the bytes of transfers under way counted into
 * b->stats, and those whose consumer re-joined or left cancelled. */
void broker_bulk_timers(struct broker *b);

/* 1 when p's next version, v (p->cur, not started), should go over bulk:
 * --bulk is on, p asked (HELLO x-bulk), v is a committed anchor whose every
 * chunk fits p's window, and fewer than BROKER_BULK_CLIENTS transfers are
 * offered or under way.  O(consumers + chunks of v). */
int broker_bulk_wanted(const struct broker *b, const struct broker_peer *p,
		       const struct broker_version *v);

/* Offer p->cur to p: send BULK with a fresh random token, after which p's
 * ZeroMQ stream waits (p->bulk_token set) until a connection that names the
 * token has taken every frame, or p re-joins or leaves.  Errors:
 * DCAST_EBUSY (the BULK could not be sent now: nothing changed),
 * DCAST_EIO (no random bytes). */
int broker_bulk_offer(struct broker *b, struct broker_peer *p);

#endif
