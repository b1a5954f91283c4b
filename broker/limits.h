/* Private to broker/: operating-system limits an operator meets at scale
 * (docs/operations.md, "Limits at scale"): the open-file limit, raised at
 * start and checked against what the flags allow, and accept failures on
 * the ROUTERs (EMFILE), which libzmq retries in a busy loop. */
#ifndef DCAST_BROKER_LIMITS_H
#define DCAST_BROKER_LIMITS_H

#include "broker.h"

/* Raise the RLIMIT_NOFILE soft limit to the hard limit (capped by
 * /proc/sys/fs/nr_open) and log the result; warn, naming the numbers, when
 * it is below what --max-consumers, --max-producers and --max-models may
 * need.  Never fails: a broker with a low limit still runs. */
void broker_limits_nofile(const struct broker_config *c);

/* Resolve --max-pending-total-bytes 0 to a quarter of physical memory and
 * log the bound on open versions; make the heap one arena for all threads
 * (mallopt M_ARENA_MAX 1), allocations up to 32 MiB from it and its top
 * given back past 64 MiB free, each unless the environment sets it.  Call
 * before any thread starts (broker_open makes ZeroMQ's). */
void broker_limits_memory(struct broker_config *c);

/* Watch a bound ROUTER for accept failures (a socket monitor in the poll
 * set): each is counted and logged, at most once per 10 s, naming the
 * error, the descriptors open and the limit.  Errors: DCAST_EZMQ,
 * DCAST_EBUSY (poll set full). */
int broker_limits_watch(struct broker *b, void *sock, const char *which);

/* Close the monitors (before the sockets they watch). */
void broker_limits_close(struct broker *b);

#endif
