/* The CHUNKs that do not fit their manifest (tests/chunk_fit_cases.h). */
#include <stdio.h>
#include <string.h>
#include "../chunk_fit_cases.h"
#include "deltacast/codec.h"

const chunk_fit_case chunk_fit_cases[] = {
	{"tensor outside the manifest", 7, 0, 8, 2, DCAST_EFIELD_RANGE, "CHUNK.tensor: 7"},
	{"range past the tensor's end", 0, 60, 8, 2, DCAST_ESHAPE, "[60, +8)"},
	{"elem_size not the dtype's", 0, 0, 8, 4, DCAST_ESHAPE, "CHUNK.elem_size: 4"},
};
const unsigned chunk_fit_n_cases = sizeof(chunk_fit_cases) / sizeof(chunk_fit_cases[0]);

void chunk_fit_manifest(dcast_msg *m, dcast_tensor_desc *t, const char *model)
{
	memset(t, 0, sizeof(*t));
	strcpy(t->name, "w");
	t->dtype = DCAST_DTYPE_BF16;
	t->ndim = 1;
	t->shape[0] = CFC_ELEMS;
	dcast_msg_init(m, DCAST_MSG_MANIFEST);
	snprintf(m->u.manifest.model, sizeof(m->u.manifest.model), "%s", model);
	m->u.manifest.n_tensors = 1;
	m->u.manifest.tensors = t;
}

void chunk_fit_chunk(dcast_msg *m, const chunk_fit_case *k, const char *model, uint64_t version,
		     const void **payload)
{
	static const uint8_t zeros[CFC_ELEMS * 4];
	dcast_chunk *c = &m->u.chunk;

	dcast_msg_init(m, DCAST_MSG_CHUNK);
	snprintf(c->model, sizeof(c->model), "%s", model);
	c->version = version;
	c->anchor = 1;
	c->tensor = k->tensor;
	c->start = k->start;
	c->count = c->changed = k->count;
	c->elem_size = k->elem_size;
	c->encoding = DCAST_ENC_DENSE;
	c->payload_bytes = k->count * k->elem_size;
	dcast_chunk_seal(c, zeros);
	*payload = zeros;
}
