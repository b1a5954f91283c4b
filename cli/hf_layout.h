/* Hugging Face sharded layouts in the CLI.  `deltacast publish DIR` (or
 * INDEX.json) sends every tensor of the layout's shards as one version plus
 * one U8 tensor, HF_LAYOUT_TENSOR, that carries the layout itself: the
 * index file's bytes, each shard's name and safetensors header, and the
 * files beside the shards that are not weights (config.json,
 * tokenizer.json, tokenizer.model, ...: see hf_layout_open).
 * `deltacast subscribe --layout hf` reads that tensor back and writes the
 * same files (byte for byte) from the live tensors.  The tensor is an
 * ordinary one on the wire (docs/protocol.md is unchanged); as long as the
 * layout does not change its deltas are empty.
 *
 * The record, little-endian:
 *   "DCHFLAY1" or "DCHFLAY2"                    magic (2: files follow)
 *   u32 n_shards
 *   u32 name_len, name, u64 json_len, json      the index file
 *   n_shards x (u32 name_len, name, u64 header_len, header JSON,
 *               u64 data_bytes)                 each shard, in sorted name order
 *   DCHFLAY2 only: u32 n_files,
 *   n_files x (u32 name_len, name, u64 len, bytes)  each file, in sorted name order
 * A layout without files is written as DCHFLAY1, which older readers read.
 * Both sides check the same things: the index parses
 * (dcast_st_index_parse), every shard header parses and tiles its data
 * area, every tensor is in exactly one shard and the index maps it there,
 * the index names no shard or tensor that is not there, and every file
 * passes the rule of hf_layout_open within HF_FILES_MAX and
 * HF_FILES_MAX_BYTES. */
#ifndef DCAST_CLI_HF_LAYOUT_H
#define DCAST_CLI_HF_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "deltacast/consumer.h"
#include "deltacast/safetensors.h"

/* The name of the tensor that carries the layout record. */
#define HF_LAYOUT_TENSOR "__deltacast_hf_layout__"
/* The file a written layout holds its version in ("V\n"), and the mark
 * that a directory is one subscribe may replace. */
#define HF_VERSION_FILE "deltacast.version"

/* The files beside the shards: at most this many, this many bytes in all. */
#define HF_FILES_MAX 1024u
#define HF_FILES_MAX_BYTES (64u << 20)

typedef struct hf_file {
	char *name;          /* plain file name */
	unsigned char *data; /* its bytes (owned) */
	size_t len;
} hf_file;

typedef struct hf_shard {
	char *name;          /* file name, as in the index */
	dcast_st_file *file; /* opened (publish) or its parsed header (subscribe) */
} hf_shard;

typedef struct hf_layout {
	char *label;               /* the index's path (publish) or "layout record" */
	char *index_name;          /* the index's file name */
	unsigned char *index_json; /* its bytes */
	size_t index_len;
	dcast_st_index *index;
	hf_shard *shards;          /* one per distinct file of the index, sorted by name */
	size_t n_shards;
	size_t n_tensors;          /* tensors in all shards */
	hf_file *files;            /* the other files, sorted by name */
	size_t n_files;
	uint64_t files_bytes;      /* their bytes together */
	unsigned char *record;     /* the encoded record (see above) */
	size_t record_len;
} hf_layout;

/* 1 when `path` names a layout rather than a safetensors file: a
 * directory, or a file whose name ends in ".safetensors.index.json". */
int hf_layout_wanted(const char *path);

/* Open the layout at `path`: a directory holding exactly one
 * *.safetensors.index.json, or that index file.  Reads the index, opens
 * every shard it names (mapped read-only; tensor data points into them),
 * refuses a *.safetensors file in the directory that the index does not
 * name, reads the files beside the shards, checks the layout (above) and
 * builds the record.  The files: every regular file of the index's
 * directory (a symbolic link to one included, as in a Hugging Face cache)
 * except hidden ones (".name"), the shards and the index, any other
 * *.index.json, HF_VERSION_FILE, and weights in other formats (*.bin,
 * *.pt, *.pth, *.ckpt, *.h5, *.msgpack, *.onnx, *.gguf); subdirectories
 * are not read.  Errors (cli_fail, naming the file and the tensor):
 * DCAST_ENOTFOUND (no index, a missing shard), DCAST_EMALFORMED /
 * DCAST_ECORRUPT / DCAST_ETRUNCATED (a bad index or shard header),
 * DCAST_ECORRUPT (a tensor in two shards, a tensor or shard the index does
 * not map, a mapping to a shard that lacks the tensor), DCAST_ETOO_LARGE
 * (more than HF_FILES_MAX files or HF_FILES_MAX_BYTES bytes of them: the
 * detail names the file at which it went over), DCAST_EIO, DCAST_ENOMEM.
 * On error *l is left closed. */
int hf_layout_open(const char *path, hf_layout *l);

/* Decode and check a record (rec, len bytes: the HF_LAYOUT_TENSOR tensor);
 * shard files get parsed headers only (tensor data pointers are NULL).
 * rec need not outlive *l.  Errors as hf_layout_open, DCAST_ECORRUPT for a
 * record that does not decode or carries a file the rule of
 * hf_layout_open leaves out.  On error *l is left closed. */
int hf_layout_decode(const void *rec, size_t len, hf_layout *l);

/* Tensors of all shards together (i < n_tensors, shard by shard in name
 * order, each in data-offset order), and a tensor by name (NULL if absent). */
const dcast_st_tensor *hf_layout_tensor_at(const hf_layout *l, size_t i);
const dcast_st_tensor *hf_layout_find(const hf_layout *l, const char *name);

/* Release everything and zero *l; a zeroed layout is a no-op. */
void hf_layout_close(hf_layout *l);

/* Write the layout of consumer c's live version into directory `out`:
 * every shard (its header as published, each tensor's bytes from c's live
 * host tensors, which must match the header's dtype and shape), the index
 * file and HF_VERSION_FILE, into `out`.deltacast-tmp first (fsynced), then
 * swapped in whole (renameat2 RENAME_EXCHANGE; where the filesystem cannot,
 * rename the old one away and the new one in), so that `out` is always
 * absent or a complete layout of one version; the one replaced is kept as
 * `out`.deltacast-old until the next (see hf_layout_export_end).  An existing `out` is
 * replaced only if it is empty or holds HF_VERSION_FILE.  The record is
 * read from c's HF_LAYOUT_TENSOR.  Errors (cli_fail, naming the file or
 * tensor): DCAST_ENOTFOUND (the model carries no layout), DCAST_ESHAPE
 * (a tensor unlike its header), DCAST_ECORRUPT (a bad record), DCAST_EIO
 * (nothing is swapped in), DCAST_ENOMEM. */
int hf_layout_export(dcast_consumer *c, const char *out);

/* The layout a swap replaced stays whole as `out`.deltacast-old until the
 * next swap (a loader that opened it just before reads it whole); at the
 * end of a run remove it.  Best effort: what cannot go is left, silently. */
void hf_layout_export_end(const char *out);

#endif
