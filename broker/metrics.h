/* Private to broker/: GET /metrics in Prometheus text format on --metrics
 * HOST:PORT, from struct broker_stats, the models and the consumers. */
#ifndef DCAST_BROKER_METRICS_H
#define DCAST_BROKER_METRICS_H

#include <stddef.h>
#include "broker.h"

/* Open the listening socket (non-blocking) and add it to the broker's poll
 * set; clients are served from the loop without blocking it (metrics.c,
 * b->metrics_clients: the loop's timer turn closes those past
 * METRICS_CLIENT_MS).  No-op without --metrics, but always sets up the
 * table.  Errors: DCAST_EINVAL (not HOST:PORT with a numeric IPv4 host),
 * DCAST_EIO (socket / bind / listen, naming the address), DCAST_ENOMEM,
 * poll-set errors. */
int broker_metrics_open(struct broker *b);

/* Close every client and the listener, free the page.  Safe after a
 * failed or no open. */
void broker_metrics_close(struct broker *b);

/* Write the metrics text into buf (cap bytes, NUL-terminated, truncated at
 * a line boundary when full).  Returns its length. */
size_t broker_metrics_render(const struct broker *b, char *buf, size_t cap);

#endif
