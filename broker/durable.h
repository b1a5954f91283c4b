/* Private to broker/: --data-dir durability (durable.c over segment.c). */
#ifndef DCAST_BROKER_DURABLE_H
#define DCAST_BROKER_DURABLE_H

#include "broker.h"

/* Write v's records to the model's segment (a new segment when v is an
 * anchor) and fsync them; 0 means v is durable and may be acknowledged.
 * No-op without --data-dir.  Errors: DCAST_EIO naming the file (nothing of
 * v is left on disk), DCAST_ESTATE (a delta with no segment). */
int broker_durable_commit(struct broker *b, struct broker_model *m, struct broker_version *v);

/* Open the store in --data-dir and re-insert every durable committed
 * version into the log with broker_log_append(), cutting torn tails.
 * No-op without --data-dir.  Errors: DCAST_EIO, DCAST_ENOMEM, log errors. */
int broker_durable_restore(struct broker *b);

/* Close the store (at shutdown).  Safe without one. */
void broker_durable_close(void);

#endif
