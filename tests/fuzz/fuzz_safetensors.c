/* libFuzzer target for what deltacast reads from safetensors files on disk
 * (a consumer's model.safetensors at open, the CLI's inputs, Hugging Face
 * index files): any bytes either parse into a file whose every tensor lies
 * inside the data area, in order, without overlap, and whose lookups agree
 * with its listing, or fail with a message that says why.  The first byte
 * picks the parser: a whole file image, a header alone, or an index. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "deltacast/safetensors.h"

/* base..base+len: the file image (len 0: a header alone, no data). */
static void check_file(const dcast_st_file *f, const uint8_t *base, size_t len)
{
	uint64_t end = 0, data = dcast_st_data_bytes(f);
	size_t n = dcast_st_count(f), hdr = 0;
	const char *k, *v;

	if (dcast_st_header_bytes(f, &hdr) && len && hdr + data > len)
		abort(); /* tensors past the image */
	for (size_t i = 0; i < n; i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(f, i);
		if (!t || t->data_offset < end || t->nbytes != t->count * t->elem_size ||
		    t->data_offset + t->nbytes > data || dcast_st_find(f, t->name) != t)
			abort();
		if (len && ((const uint8_t *)t->data < base || (const uint8_t *)t->data + t->nbytes > base + len))
			abort();
		end = t->data_offset + t->nbytes;
	}
	if (dcast_st_tensor_at(f, n))
		abort();
	for (size_t i = 0; i < dcast_st_metadata_count(f); i++)
		if (dcast_st_metadata_at(f, i, &k, &v) || !k || !v || !dcast_st_metadata_get(f, k))
			abort();
}

static void check_index(const dcast_st_index *x)
{
	const char *t, *file;

	for (size_t i = 0; i < dcast_st_index_count(x); i++)
		if (dcast_st_index_at(x, i, &t, &file) || !t || !file || strchr(file, '/'))
			abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	dcast_st_file *f = NULL;
	dcast_st_index *x = NULL;
	int rc;

	if (size < 1)
		return 0;
	switch (data[0] % 3) {
	case 0:
		rc = dcast_st_parse(data + 1, size - 1, "fuzz", &f);
		break;
	case 1:
		rc = dcast_st_parse_header(data + 1, size - 1, size * 4, "fuzz", &f);
		break;
	default:
		rc = dcast_st_index_parse(data + 1, size - 1, "fuzz", &x);
		break;
	}
	if (rc != 0) {
		if (f || x || dcast_last_error()[0] == '\0')
			abort(); /* a refusal leaves nothing and says why */
		return 0;
	}
	if (f)
		check_file(f, data + 1, data[0] % 3 == 0 ? size - 1 : 0);
	if (x)
		check_index(x);
	dcast_st_close(&f);
	dcast_st_index_close(&x);
	return 0;
}
