/* Private: the parts of a ZeroMQ tcp:// endpoint that the project reads
 * itself (the producer names the broker's consumer endpoint; the consumer
 * connects to the broker's bulk port on the host of its endpoint). */
#ifndef DCAST_ENDPOINT_H
#define DCAST_ENDPOINT_H

#include <stddef.h>

/* The host of a tcp:// endpoint ("tcp://[SRC;]HOST:PORT"; an IPv6 HOST in
 * brackets, kept) at *host, its length returned; 0 for any other
 * transport or an endpoint without a port (*host then untouched). */
size_t dcast_tcp_host(const char *ep, const char **host);

#endif
