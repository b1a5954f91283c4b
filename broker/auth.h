/* Private to broker/: CURVE on the broker's sockets and the ZAP handler that
 * admits listed keys (--curve-secret, --producer-keys, --consumer-keys), and
 * the relay's CURVE client (--upstream-curve-secret, --upstream-server-key). */
#ifndef DCAST_BROKER_AUTH_H
#define DCAST_BROKER_AUTH_H

#include <stdint.h>
#include "broker.h"

/* Set CURVE server options on a broker socket before bind (which:
 * "producers", "consumers"), or CURVE client options on an "upstream"
 * DEALER before connect (with --upstream-server-key: that public key and
 * the key pair of --upstream-curve-secret; plain without it, warned about
 * when the broker's own sockets are CURVE).  The first server-side
 * call with --curve-secret loads the key files and starts the ZAP handler
 * thread on inproc://zeromq.zap.01 in b->ctx (state in b->auth); it runs
 * until the context terminates.  Without --curve-secret: no-op, but key lists given without
 * it are refused.  Errors: DCAST_EINVAL (a key file without
 * --curve-secret, --curve-secret without --producer-keys, an
 * --upstream-server-key that is not a Z85 key), key file errors
 * (DCAST_EIO / DCAST_EMALFORMED naming flag, file and line), DCAST_EZMQ. */
int broker_auth_socket(struct broker *b, void *sock, const char *which);

/* May the producer connection whose messages carry ZAP user id `user_id`
 * (dcast_wire_in.user_id: its Z85 CURVE key) publish `model`?  The key
 * must be listed, and its --producer-keys line
 * must name the model or none (any model).  0 without --curve-secret.
 * Errors: DCAST_EAUTH, the text naming the key, the model and the list. */
int broker_auth_producer_model(const struct broker *b, const char *user_id, const char *model);

/* Peers refused by the ZAP handler so far (for metrics). */
uint64_t broker_auth_refused(const struct broker *b);

/* After the context terminated (the ZAP thread's recv ends there): join
 * the thread and free the key lists.  No-op when CURVE was off. */
void broker_auth_close(struct broker *b);

#endif
