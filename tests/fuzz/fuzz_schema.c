/* libFuzzer target for the header parser: any bytes either decode to a
 * message that validates and re-encodes, or fail with a detail message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "deltacast/schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	dcast_msg m, back;
	void *buf;
	size_t len;

	if (dcast_msg_decode(data, size, &m) != DCAST_OK) {
		if (dcast_last_error()[0] == '\0')
			abort(); /* every rejection must say why */
		return 0;
	}
	if (dcast_msg_validate(&m) != DCAST_OK || dcast_msg_encode(&m, &buf, &len) != DCAST_OK)
		abort();
	if (dcast_msg_decode(buf, len, &back) != DCAST_OK)
		abort();
	dcast_msg_free(&back);
	free(buf);
	dcast_msg_free(&m);
	return 0;
}
