/* CHUNKs that do not fit their manifest, one per refusal of
 * docs/protocol.md's "Which refusal gets which code", with that code.  The
 * manifest is one BF16 tensor "w" of CFC_ELEMS elements.  The broker
 * (test_broker_malformed), the consumer (test_consumer_hostile) and the
 * check itself (test_schema) each refuse every case with its code. */
#ifndef DCAST_TEST_CHUNK_FIT_CASES_H
#define DCAST_TEST_CHUNK_FIT_CASES_H

#include <stdint.h>
#include "deltacast/schema.h"

#define CFC_ELEMS 64

typedef struct chunk_fit_case {
	const char *what;   /* the fault, in words */
	uint32_t tensor;
	uint64_t start, count;
	uint32_t elem_size;
	int code;           /* the refusal's code, on every side */
	const char *named;  /* what the error text names */
} chunk_fit_case;

extern const chunk_fit_case chunk_fit_cases[];
extern const unsigned chunk_fit_n_cases;

/* The manifest of the cases (model `model`) into m, its tensor into *t. */
void chunk_fit_manifest(dcast_msg *m, dcast_tensor_desc *t, const char *model);

/* Case k as a dense anchor CHUNK of `version` of `model` into m, sealed
 * with its payload (zero bytes, count * elem_size of them), which
 * *payload points to (static storage). */
void chunk_fit_chunk(dcast_msg *m, const chunk_fit_case *k, const char *model, uint64_t version,
		     const void **payload);

#endif
