/* Private to broker/: operator requests on a local UNIX socket
 * (--admin-socket PATH, mode 0600, peers checked by SO_PEERCRED), served
 * from the loop without blocking it.  One request a connection, one line
 * each way: `delete MODEL\n` -> `ok ...\n` or `error DCAST_X: ...\n`.
 * docs/operations.md, "Removing models". */
#ifndef DCAST_BROKER_ADMIN_H
#define DCAST_BROKER_ADMIN_H

#include "broker.h"

/* Bind the socket at --admin-socket (a stale socket file there is
 * replaced; a live one, or anything else at the path, stops the start),
 * mode 0600, and add it to the poll set.  No-op without the flag.
 * Errors: DCAST_EIO naming the path and the cause, poll-set errors. */
int broker_admin_open(struct broker *b);

/* Close every client and the listener and unlink the socket file.  Safe
 * without one. */
void broker_admin_close(struct broker *b);

#endif
