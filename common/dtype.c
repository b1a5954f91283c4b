/* The dtypes of the wire (include/deltacast/schema.h: dcast_dtype): one
 * table of names and sizes, below every folder that names a dtype (the
 * schema's messages, the safetensors reader and writer, the codec). */
#include <string.h>
#include "deltacast/schema.h"

static const struct {
	const char *name;
	unsigned size;  /* of a wire element */
	unsigned lanes; /* wire elements per value */
} dtypes[DCAST_DTYPE_COUNT] = {
	[DCAST_DTYPE_BF16] = {"BF16", 2, 1},   [DCAST_DTYPE_F16] = {"F16", 2, 1},
	[DCAST_DTYPE_F32] = {"F32", 4, 1},     [DCAST_DTYPE_F8_E4M3] = {"F8_E4M3", 1, 1},
	[DCAST_DTYPE_F8_E5M2] = {"F8_E5M2", 1, 1}, [DCAST_DTYPE_I8] = {"I8", 1, 1},
	[DCAST_DTYPE_U8] = {"U8", 1, 1},       [DCAST_DTYPE_I16] = {"I16", 2, 1},
	[DCAST_DTYPE_U16] = {"U16", 2, 1},     [DCAST_DTYPE_I32] = {"I32", 4, 1},
	[DCAST_DTYPE_U32] = {"U32", 4, 1},     [DCAST_DTYPE_BOOL] = {"BOOL", 1, 1},
	[DCAST_DTYPE_I64] = {"I64", 4, 2},     [DCAST_DTYPE_U64] = {"U64", 4, 2},
	[DCAST_DTYPE_F64] = {"F64", 4, 2},
};

const char *dcast_dtype_name(int dtype)
{
	if (dtype < 0 || dtype >= DCAST_DTYPE_COUNT)
		return "?";
	return dtypes[dtype].name;
}

int dcast_dtype_from_name(const char *name)
{
	for (int i = 0; i < DCAST_DTYPE_COUNT; i++)
		if (strcmp(dtypes[i].name, name) == 0)
			return i;
	return -1;
}

unsigned dcast_dtype_size(int dtype)
{
	if (dtype < 0 || dtype >= DCAST_DTYPE_COUNT)
		return 0;
	return dtypes[dtype].size;
}

unsigned dcast_dtype_lanes(int dtype)
{
	if (dtype < 0 || dtype >= DCAST_DTYPE_COUNT)
		return 0;
	return dtypes[dtype].lanes;
}
