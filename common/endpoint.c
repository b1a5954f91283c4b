/* The parts of tcp:// endpoints the project reads itself
 * (dcast_endpoint.h). */
#include <string.h>
#include "dcast_endpoint.h"

#define TCP "tcp://"

size_t dcast_tcp_host(const char *ep, const char **host)
{
	const char *a, *semi, *colon;

	if (strncmp(ep, TCP, strlen(TCP)) != 0)
		return 0;
	a = ep + strlen(TCP);
	if ((semi = strchr(a, ';')))
		a = semi + 1;
	if (!(colon = strrchr(a, ':')))
		return 0;
	*host = a;
	return (size_t)(colon - a);
}
