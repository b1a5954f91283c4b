/* The broker's consumer endpoint as a producer reaches it: where a new
 * producer process fetches or checks its baseline.  The broker names the
 * endpoint as bound (WELCOME.x-consumers, docs/protocol.md); a wildcard host
 * there is no address to connect to, so the host of the producer's own
 * endpoint takes its place: the same broker, reached the same way. */
#include <string.h>
#include "dcast_endpoint.h"
#include "producer_shared.h"

#define TCP "tcp://"
#define LOOPBACK "127.0.0.1" /* the broker reached over ipc:// or inproc:// */

static int is_wildcard(const char *host, size_t n)
{
	static const char *const any[] = {"*", "0.0.0.0", "[::]", "::"};

	for (size_t i = 0; i < DCAST_ARRAY_LEN(any); i++)
		if (n == strlen(any[i]) && memcmp(host, any[i], n) == 0)
			return 1;
	return 0;
}

static int resolve(const dcast_producer *p, char *out, size_t cap, const char *what)
{
	const char *named = p->conn.consumers, *host = NULL, *ours = LOOPBACK;
	size_t n = dcast_tcp_host(named, &host), n_ours = dcast_tcp_host(p->endpoint, &ours);
	int len;

	if (!n || !is_wildcard(host, n))
		len = snprintf(out, cap, "%s", named);
	else
		len = snprintf(out, cap, TCP "%.*s%s", (int)(n_ours ? n_ours : strlen(LOOPBACK)),
			       ours, host + n);
	if (len < 0 || (size_t)len >= cap)
		return dcast_fail(DCAST_ETOO_LARGE, "%s: consumer endpoint %s: more than %zu bytes",
				  what, named, cap - 1);
	return 0;
}

int prod_consumer_endpoint(const dcast_producer *p, const char *given, char *out, size_t cap,
			   const char *what)
{
	if (given) {
		if (!*given || strlen(given) >= cap)
			return dcast_fail(DCAST_EINVAL, "%s: consumer endpoint \"%.64s\" is empty "
					  "or longer than %zu bytes", what, given, cap - 1);
		memcpy(out, given, strlen(given) + 1);
		return 0;
	}
	if (!p->conn.consumers[0])
		return dcast_fail(DCAST_ENOTFOUND, "%s: the broker at %s named no consumer "
				  "endpoint in its WELCOME (a broker from before WELCOME.x-consumers, "
				  "or one whose endpoint cannot be named): give the endpoint",
				  what, p->endpoint);
	return resolve(p, out, cap, what);
}

int dcast_producer_consumer_endpoint(const dcast_producer *p, char *out, size_t cap)
{
	if (!p || !out || !cap)
		return dcast_fail(DCAST_EINVAL, "consumer_endpoint: NULL producer or buffer");
	return prod_consumer_endpoint(p, NULL, out, cap, "consumer_endpoint");
}
