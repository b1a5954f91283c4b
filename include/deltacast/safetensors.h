/* deltacast safetensors: a strict reader and an atomic writer for the
 * safetensors checkpoint format (8-byte little-endian header length, a JSON
 * header naming every tensor's dtype, shape and data_offsets, then the data
 * area).  The reader checks everything: header length bounds, the JSON
 * itself (own strict parser: no duplicate keys, no trailing bytes), dtypes,
 * shapes and that the tensors tile the data area exactly.  The writer pads
 * the header with spaces to a multiple of 8 bytes, as the reference
 * implementation does, and writes through a temporary file, fsync and rename.
 * A third part reads the index of a Hugging Face sharded checkpoint
 * (model.safetensors.index.json: which shard file holds each tensor).
 *
 * Thread safety: a dcast_st_file is read-only after open and may be shared;
 * every function is reentrant. */
#ifndef DELTACAST_SAFETENSORS_H
#define DELTACAST_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "deltacast/err.h"
#include "deltacast/schema.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Limits the reader enforces before it allocates. */
#define DCAST_ST_MAX_HEADER_BYTES (100u << 20) /* JSON header length */
#define DCAST_ST_MAX_DIMS 8                    /* dimensions of a tensor */
#define DCAST_ST_MAX_NAME_BYTES 4096           /* tensor name or metadata key */

/* Tensor dtypes, by their safetensors names: the wire's dcast_dtype
 * (deltacast/schema.h), whose one table holds the names and sizes of both,
 * so a file's dtype is a manifest's as it is. */
enum dcast_st_dtype {
	DCAST_ST_BOOL = DCAST_DTYPE_BOOL,
	DCAST_ST_U8 = DCAST_DTYPE_U8,
	DCAST_ST_I8 = DCAST_DTYPE_I8,
	DCAST_ST_F8_E4M3 = DCAST_DTYPE_F8_E4M3,
	DCAST_ST_F8_E5M2 = DCAST_DTYPE_F8_E5M2,
	DCAST_ST_I16 = DCAST_DTYPE_I16,
	DCAST_ST_U16 = DCAST_DTYPE_U16,
	DCAST_ST_F16 = DCAST_DTYPE_F16,
	DCAST_ST_BF16 = DCAST_DTYPE_BF16,
	DCAST_ST_I32 = DCAST_DTYPE_I32,
	DCAST_ST_U32 = DCAST_DTYPE_U32,
	DCAST_ST_F32 = DCAST_DTYPE_F32,
	DCAST_ST_I64 = DCAST_DTYPE_I64,
	DCAST_ST_U64 = DCAST_DTYPE_U64,
	DCAST_ST_F64 = DCAST_DTYPE_F64,
	DCAST_ST_COUNT = DCAST_DTYPE_COUNT
};

/* Safetensors name of a dtype ("BF16"); "?" when unknown. Static string.
 * The same as dcast_dtype_name. */
DCAST_API const char *dcast_st_dtype_name(int dtype);

/* Bytes of one element of a dtype in a file (8 for I64, U64, F64: a
 * dcast_dtype_size wire element times its dcast_dtype_lanes); 0 when
 * unknown. */
DCAST_API unsigned dcast_st_dtype_size(int dtype);

/* Parse a dtype name of `len` bytes ("F8_E4M3"); -1 when unknown. */
DCAST_API int dcast_st_dtype_from_name(const char *name, size_t len);

/* One tensor of a file (or of a layout being written). */
typedef struct dcast_st_tensor {
	const char *name;                   /* NUL-terminated, owned by the file */
	int dtype;                          /* enum dcast_st_dtype */
	unsigned elem_size;                 /* bytes per element */
	unsigned ndim;                      /* 0 (a scalar) .. DCAST_ST_MAX_DIMS */
	uint64_t shape[DCAST_ST_MAX_DIMS];
	uint64_t count;                     /* elements: product of shape */
	uint64_t nbytes;                    /* count * elem_size */
	uint64_t data_offset;               /* start, relative to the data area */
	const void *data;                   /* the bytes; NULL for a header only */
} dcast_st_tensor;

/* An opened file or a parsed header. */
typedef struct dcast_st_file dcast_st_file;

/* Open and check the safetensors file at `path`; it is mapped read-only and
 * tensor data pointers point into the mapping.  On success *out owns the
 * mapping (release with dcast_st_close).  Errors name the file and problem:
 * DCAST_EIO (open/stat/mmap), DCAST_ENOTFOUND (no such file),
 * DCAST_ETRUNCATED (shorter than its header says), DCAST_EMALFORMED (header
 * length, JSON, missing or mistyped fields), DCAST_EDTYPE (unknown dtype),
 * DCAST_ESHAPE (too many dims, size overflow), DCAST_ECORRUPT (offsets out of
 * range, wrong size, overlapping, gaps), DCAST_ETOO_LARGE, DCAST_ENOMEM.
 * On error *out is NULL. */
DCAST_API int dcast_st_open(const char *path, dcast_st_file **out);

/* The same checks on a whole file image already in memory (len bytes).
 * The file borrows buf: buf must outlive *out.  `label` names the source in
 * error messages (may be NULL). */
DCAST_API int dcast_st_parse(const void *buf, size_t len, const char *label, dcast_st_file **out);

/* Parse only a JSON header of hdr_len bytes (without the 8-byte length
 * prefix) describing a data area of data_bytes bytes.  Tensor data pointers
 * are NULL.  The JSON is copied; hdr need not outlive *out. */
DCAST_API int dcast_st_parse_header(const void *hdr, size_t hdr_len, uint64_t data_bytes,
			  const char *label, dcast_st_file **out);

/* Release a file and set *f to NULL; NULL or *f == NULL is a no-op. */
DCAST_API void dcast_st_close(dcast_st_file **f);

/* Number of tensors. */
DCAST_API size_t dcast_st_count(const dcast_st_file *f);

/* Tensor i (0 <= i < count), in order of data offsets; NULL when out of
 * range.  The pointer lives as long as f. */
DCAST_API const dcast_st_tensor *dcast_st_tensor_at(const dcast_st_file *f, size_t i);

/* Tensor by name; NULL when absent (O(log n)). */
DCAST_API const dcast_st_tensor *dcast_st_find(const dcast_st_file *f, const char *name);

/* Number of __metadata__ entries, and entry i (key/value owned by f, in
 * header order); dcast_st_metadata_at returns DCAST_EINVAL when out of range. */
DCAST_API size_t dcast_st_metadata_count(const dcast_st_file *f);
DCAST_API int dcast_st_metadata_at(const dcast_st_file *f, size_t i, const char **key,
			 const char **value);

/* Value of __metadata__ key, or NULL. */
DCAST_API const char *dcast_st_metadata_get(const dcast_st_file *f, const char *key);

/* The raw header as it appears in the file: the 8-byte length followed by
 * the JSON (and its padding); *len gets its size.  Owned by f. */
DCAST_API const void *dcast_st_header_bytes(const dcast_st_file *f, size_t *len);

/* Size of the data area in bytes (end of the last tensor). */
DCAST_API uint64_t dcast_st_data_bytes(const dcast_st_file *f);

/* ---- writing ---- */

/* What the writer writes for one tensor: data points at nbytes of
 * contiguous little-endian elements (ignored by dcast_st_layout_compute). */
typedef struct dcast_st_spec {
	const char *name;
	int dtype;
	unsigned ndim;
	uint64_t shape[DCAST_ST_MAX_DIMS];
	const void *data;
} dcast_st_spec;

/* One __metadata__ entry. */
typedef struct dcast_st_meta {
	const char *key;
	const char *value;
} dcast_st_meta;

/* Where everything of a file goes, computed without touching data: the
 * header bytes (length prefix + JSON + space padding to 8 bytes) and each
 * tensor's absolute file offset; the data area starts at header_bytes and
 * tensors follow in the order given, without gaps. */
typedef struct dcast_st_layout {
	unsigned char *header;  /* header_bytes bytes, owned by the layout */
	size_t header_bytes;    /* multiple of 8, includes the 8-byte prefix */
	size_t count;           /* tensors */
	uint64_t *file_offsets; /* count absolute offsets, owned by the layout */
	uint64_t *nbytes;       /* count sizes in bytes, owned by the layout */
	uint64_t file_bytes;    /* total file size */
} dcast_st_layout;

/* Compute the layout of a file holding specs[0..n) and meta[0..n_meta).
 * Checks names (unique, and each valid on the wire: dcast_tensor_name_check
 * in deltacast/schema.h, so a file written here holds only tensors a
 * producer can publish), dtypes, shapes.
 * On success *out owns its arrays (dcast_st_layout_free); on error *out is
 * zeroed.  Errors: DCAST_EINVAL, DCAST_EDTYPE, DCAST_ESHAPE, DCAST_ENOMEM. */
DCAST_API int dcast_st_layout_compute(const dcast_st_spec *specs, size_t n, const dcast_st_meta *meta,
			    size_t n_meta, dcast_st_layout *out);

/* Free a layout's arrays and zero it; a zeroed layout is a no-op. */
DCAST_API void dcast_st_layout_free(dcast_st_layout *layout);

/* Write a whole file: header then every spec's data, to `path`.tmp.<pid>,
 * fsync, rename over `path`, fsync the directory.  On error no file is left
 * at the temporary path and `path` is untouched.  Errors: those of
 * dcast_st_layout_compute, DCAST_EINVAL (a NULL data pointer for a non-empty
 * tensor), DCAST_EIO naming the file. */
DCAST_API int dcast_st_write(const char *path, const dcast_st_spec *specs, size_t n,
		   const dcast_st_meta *meta, size_t n_meta);

/* ---- Hugging Face sharded checkpoints ---- */

/* A parsed model.safetensors.index.json: its "weight_map" names, for each
 * tensor, the shard file that holds it.  Read-only after parse. */
typedef struct dcast_st_index dcast_st_index;

/* Parse an index of len bytes (the file's contents; label names it in
 * errors, may be NULL).  Checks: a JSON object (the strict parser above:
 * integers only, no duplicate keys, so a tensor listed twice is refused),
 * "metadata" an object if present (not interpreted), "weight_map" a
 * non-empty object whose values are plain file names ending in
 * ".safetensors" (no '/', not starting with '.', at most 255 bytes).
 * The JSON is copied; json need not outlive *out.  On success *out owns
 * the index (dcast_st_index_close); on error *out is NULL.  Errors:
 * DCAST_EMALFORMED (naming the byte offset or the entry), DCAST_ETOO_LARGE
 * (over DCAST_ST_MAX_HEADER_BYTES), DCAST_ENOMEM. */
DCAST_API int dcast_st_index_parse(const void *json, size_t len, const char *label,
				   dcast_st_index **out);

/* Release an index and set *x to NULL; NULL or *x == NULL is a no-op. */
DCAST_API void dcast_st_index_close(dcast_st_index **x);

/* Number of weight_map entries (tensors), and entry i in file order:
 * *tensor and *file are owned by x.  DCAST_EINVAL when i is out of range. */
DCAST_API size_t dcast_st_index_count(const dcast_st_index *x);
DCAST_API int dcast_st_index_at(const dcast_st_index *x, size_t i, const char **tensor,
				const char **file);

/* The shard file that holds `tensor`, or NULL when the index does not
 * list it (O(log n)).  Owned by x. */
DCAST_API const char *dcast_st_index_file_of(const dcast_st_index *x, const char *tensor);

/* Number of distinct shard files, and file i of them in sorted order
 * (NULL when out of range).  Owned by x. */
DCAST_API size_t dcast_st_index_file_count(const dcast_st_index *x);
DCAST_API const char *dcast_st_index_file_at(const dcast_st_index *x, size_t i);

#ifdef __cplusplus
}
#endif
#endif
