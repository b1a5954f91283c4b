/* fault_digest FILE...: print "DIGEST FILE" per safetensors file, DIGEST
 * being the model digest of tests/tools/fault_digest.h (16 hex digits).
 * The fault suite and the demo compare it with what consumers report.
 * Exit 0, or 1 naming the file that could not be read. */
#include <inttypes.h>
#include <stdio.h>
#include "deltacast/safetensors.h"
#include "fault_digest.h"

static fault_entry entries[FAULT_MAX_TENSORS];

static int digest_file(const char *path)
{
	dcast_st_file *f = NULL;
	int rc = dcast_st_open(path, &f);
	size_t n;

	if (rc) {
		fprintf(stderr, "fault_digest: %s: %s\n", path, dcast_last_error());
		return 1;
	}
	n = dcast_st_count(f);
	if (n > FAULT_MAX_TENSORS) {
		fprintf(stderr, "fault_digest: %s: %zu tensors, at most %d\n", path, n,
			FAULT_MAX_TENSORS);
		dcast_st_close(&f);
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(f, i);
		fault_entry_set(&entries[i], t->name, t->data, t->nbytes);
	}
	printf("%016" PRIx64 " %s\n", fault_model_digest(entries, n), path);
	dcast_st_close(&f);
	return 0;
}

int main(int argc, char **argv)
{
	int rc = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: fault_digest FILE.safetensors...\n");
		return 2;
	}
	for (int i = 1; i < argc; i++)
		rc |= digest_file(argv[i]);
	return rc;
}
