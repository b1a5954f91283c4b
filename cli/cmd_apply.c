/* deltacast apply: check a patch file completely (whole-file checksum,
 * header, NEW's safetensors header, that BASE's tensors have the digests the
 * patch was made against, every chunk's bounds, order and checksum), then
 * write OUT through a temporary file: BASE's bytes, every chunk applied, NEW's
 * digests checked, rename.  On any error OUT is not created. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "deltacast/codec.h"
#include "patch.h"

#define CMD "apply"

static const char usage_text[] =
	"usage: deltacast apply BASE.safetensors PATCH -o OUT.safetensors\n"
	"Applies a patch made by `deltacast delta BASE NEW`; OUT equals NEW byte for\n"
	"byte.  A corrupt PATCH or a BASE other than the one the patch was made\n"
	"against is refused before anything is written; OUT is then not created.\n";

typedef struct patch_view {
	const char *path;
	const unsigned char *data;
	size_t size;
	patch_header h;
	dcast_st_file *layout;  /* NEW's header: names, shapes, offsets */
	patch_tensor *tensors;
	uint64_t chunks_at;     /* offset of the first chunk record */
	uint64_t chunks_end;    /* offset of the trailer */
} patch_view;

static int corrupt(const patch_view *v, const char *what)
{
	return cli_fail(DCAST_ECORRUPT, "%s: %s", v->path, what);
}

static int map_patch(patch_view *v)
{
	int fd = open(v->path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return cli_fail(errno == ENOENT ? DCAST_ENOTFOUND : DCAST_EIO, "%s: open: %s",
				  v->path, strerror(errno));
	struct stat st;
	int err = fstat(fd, &st) ? cli_fail(DCAST_EIO, "%s: stat: %s", v->path, strerror(errno)) : 0;
	if (!err && (uint64_t)st.st_size < PATCH_HEADER_BYTES + PATCH_TRAILER_BYTES)
		err = cli_fail(DCAST_ETRUNCATED, "%s: %lld bytes is too short for a patch", v->path,
				 (long long)st.st_size);
	if (!err) {
		void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED)
			err = cli_fail(DCAST_EIO, "%s: mmap: %s", v->path, strerror(errno));
		else
			v->data = m, v->size = (size_t)st.st_size;
	}
	close(fd);
	return err;
}

static int check_trailer(patch_view *v)
{
	const unsigned char *tr = v->data + v->size - PATCH_TRAILER_BYTES;
	if (memcmp(tr, PATCH_TRAILER_MAGIC, 8) != 0 || patch_get_le64(tr + 8) != v->size)
		return cli_fail(DCAST_ETRUNCATED, "%s: no valid trailer (truncated or not a patch)",
				  v->path);
	if (dcast_checksum(v->data, v->size - 8) != patch_get_le64(tr + 16))
		return cli_fail(DCAST_ECHECKSUM, "%s: whole-file checksum mismatch (file corrupt)",
				  v->path);
	v->chunks_end = v->size - PATCH_TRAILER_BYTES;
	return 0;
}

/* NEW's safetensors header embedded after the patch header. */
static int parse_layout(patch_view *v)
{
	uint64_t hb = v->h.new_header_bytes;
	if (hb < 10 || hb > v->chunks_end - PATCH_HEADER_BYTES || patch_get_le64(v->data + PATCH_HEADER_BYTES) != hb - 8)
		return corrupt(v, "bad embedded NEW header length");
	int err = dcast_st_parse_header(v->data + PATCH_HEADER_BYTES + 8, hb - 8, v->h.new_data_bytes,
					v->path, &v->layout);
	if (!err && dcast_st_count(v->layout) != v->h.tensor_count)
		err = corrupt(v, "tensor count differs from the embedded NEW header");
	return err;
}

static int read_tensor_table(patch_view *v)
{
	uint64_t at = PATCH_HEADER_BYTES + v->h.new_header_bytes + patch_pad(v->h.new_header_bytes);
	if (v->h.tensor_count > (v->chunks_end - at) / PATCH_TENSOR_BYTES)
		return corrupt(v, "tensor table runs past the end");
	v->tensors = calloc(v->h.tensor_count + 1, sizeof(*v->tensors));
	if (!v->tensors)
		return cli_fail(DCAST_ENOMEM, "out of memory");
	for (uint64_t i = 0; i < v->h.tensor_count; i++, at += PATCH_TENSOR_BYTES) {
		patch_tensor *pt = &v->tensors[i];
		const dcast_st_tensor *t = dcast_st_tensor_at(v->layout, i);
		patch_tensor_get(v->data + at, pt);
		if (pt->elem_size != cli_codec_elem_size(t) || pt->count != t->nbytes / pt->elem_size ||
		    pt->has_base > 1)
			return cli_fail(DCAST_ECORRUPT, "%s: tensor table entry of \"%s\" disagrees with its header",
					  v->path, t->name);
	}
	v->chunks_at = at;
	return 0;
}

static int parse_head(patch_view *v)
{
	if (patch_header_get(v->data, &v->h) != 0)
		return cli_fail(DCAST_EMALFORMED, "%s: not a deltacast patch (bad magic)", v->path);
	if (v->h.version != PATCH_VERSION || v->h.flags != 0)
		return cli_fail(DCAST_EPROTO_VERSION, "%s: patch version %u flags %u (this build reads %u, 0)",
				  v->path, v->h.version, v->h.flags, PATCH_VERSION);
	int err = parse_layout(v);
	return err ? err : read_tensor_table(v);
}

/* BASE must hold, for every tensor the patch has a base for, the same
 * dtype and shape and the digest the patch was made against. */
static int check_base(const patch_view *v, const dcast_st_file *base, const char *base_path)
{
	for (uint64_t i = 0; i < v->h.tensor_count; i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(v->layout, i);
		if (!v->tensors[i].has_base)
			continue;
		const dcast_st_tensor *b = dcast_st_find(base, t->name);
		if (!b)
			return cli_fail(DCAST_ENOTFOUND, "%s lacks tensor \"%s\" that the patch is based on",
					  base_path, t->name);
		if (b->dtype != t->dtype || b->nbytes != t->nbytes)
			return cli_fail(DCAST_ESHAPE, "%s: tensor \"%s\" has another dtype or size than "
					  "the patch's base", base_path, t->name);
		if (dcast_digest(b->data, b->nbytes) != v->tensors[i].base_digest)
			return cli_fail(DCAST_EDIGEST, "%s: tensor \"%s\" is not the one the patch was "
					  "made against (digest differs): wrong BASE", base_path, t->name);
	}
	return 0;
}

/* Read the chunk record at *at and check it follows the previous one:
 * same tensor from where it stopped, or the next tensor from 0. */
static int next_chunk(const patch_view *v, uint64_t *at, uint32_t *tensor, uint64_t *pos,
		      patch_chunk *c)
{
	if (v->chunks_end - *at < PATCH_CHUNK_BYTES)
		return corrupt(v, "chunk record runs past the end");
	patch_chunk_get(v->data + *at, c);
	*at += PATCH_CHUNK_BYTES;
	while (*tensor < v->h.tensor_count && *pos == v->tensors[*tensor].count && c->tensor_index != *tensor)
		(*tensor)++, *pos = 0;
	if (c->tensor_index != *tensor || c->begin != *pos || !c->count ||
	    c->count > DCAST_MAX_CHUNK_ELEMS || c->count > v->tensors[*tensor].count - *pos)
		return corrupt(v, "chunk records out of order, overlapping or out of range");
	if (c->payload_bytes > v->chunks_end - *at ||
	    patch_pad(c->payload_bytes) > v->chunks_end - *at - c->payload_bytes)
		return corrupt(v, "chunk payload runs past the end");
	if (dcast_checksum(v->data + *at, c->payload_bytes) != c->checksum)
		return cli_fail(DCAST_ECHECKSUM, "%s: chunk of tensor %u at element %llu: checksum "
				  "mismatch", v->path, c->tensor_index, (unsigned long long)c->begin);
	*pos += c->count;
	return 0;
}

static int apply_chunk(const patch_view *v, uint32_t tensor, const patch_chunk *c,
		       const unsigned char *payload, unsigned char *out)
{
	const patch_tensor *pt = &v->tensors[tensor];
	const dcast_st_tensor *t = dcast_st_tensor_at(v->layout, tensor);
	dcast_chunk_info info = {c->encoding, pt->elem_size, c->count, c->changed, c->payload_bytes};
	if (!pt->has_base && c->encoding != DCAST_ENC_DENSE)
		return corrupt(v, "a tensor without base has a non-dense chunk");
	return dcast_codec_apply(&info, payload, out + t->data_offset + c->begin * pt->elem_size, NULL);
}

/* Walk every chunk; with out != NULL apply each to the tensor's bytes there. */
static int walk_chunks(const patch_view *v, unsigned char *out)
{
	uint64_t at = v->chunks_at, pos = 0;
	uint32_t tensor = 0;
	int err = 0;
	for (uint64_t k = 0; k < v->h.chunk_count && !err; k++) {
		patch_chunk c;
		if ((err = next_chunk(v, &at, &tensor, &pos, &c)))
			break;
		if (out)
			err = apply_chunk(v, tensor, &c, v->data + at, out);
		at += c.payload_bytes + patch_pad(c.payload_bytes);
	}
	while (!err && tensor < v->h.tensor_count && pos == v->tensors[tensor].count)
		tensor++, pos = 0;
	if (!err && (tensor != v->h.tensor_count || at != v->chunks_end))
		err = corrupt(v, "chunks do not cover every tensor exactly");
	return err;
}

static int check_new_digests(const patch_view *v, const unsigned char *data)
{
	for (uint64_t i = 0; i < v->h.tensor_count; i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(v->layout, i);
		if (dcast_digest(data + t->data_offset, t->nbytes) != v->tensors[i].new_digest)
			return cli_fail(DCAST_EDIGEST, "tensor \"%s\" after applying %s differs from "
					  "NEW (digest)", t->name, v->path);
	}
	return 0;
}

/* BASE's bytes, then the chunks, into the mapped output's data area. */
static int fill_output(const patch_view *v, const dcast_st_file *base, unsigned char *map)
{
	memcpy(map, v->data + PATCH_HEADER_BYTES, v->h.new_header_bytes);
	unsigned char *data = map + v->h.new_header_bytes;
	for (uint64_t i = 0; i < v->h.tensor_count; i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(v->layout, i);
		if (v->tensors[i].has_base)
			memcpy(data + t->data_offset, dcast_st_find(base, t->name)->data, t->nbytes);
	}
	int err = walk_chunks(v, data);
	return err ? err : check_new_digests(v, data);
}

static int write_output(const patch_view *v, const dcast_st_file *base, const char *out_path)
{
	cli_out o;
	int err = cli_out_open(out_path, &o);
	if (err)
		return err;
	size_t size = (size_t)(v->h.new_header_bytes + v->h.new_data_bytes);
	void *map = MAP_FAILED;
	if (ftruncate(o.fd, (off_t)size) != 0)
		err = cli_fail(DCAST_EIO, "%s: ftruncate: %s", o.tmp, strerror(errno));
	else if ((map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, o.fd, 0)) == MAP_FAILED)
		err = cli_fail(DCAST_EIO, "%s: mmap: %s", o.tmp, strerror(errno));
	if (!err)
		err = fill_output(v, base, map);
	if (map != MAP_FAILED && msync(map, size, MS_SYNC) != 0 && !err)
		err = cli_fail(DCAST_EIO, "%s: msync: %s", o.tmp, strerror(errno));
	if (map != MAP_FAILED)
		munmap(map, size);
	if (err)
		cli_out_abort(&o);
	return err ? err : cli_out_commit(&o);
}

static int apply_patch(const char *base_path, const char *patch_path, const char *out_path)
{
	patch_view v = {.path = patch_path};
	dcast_st_file *base = NULL;
	int err = map_patch(&v);
	if (!err)
		err = check_trailer(&v);
	if (!err)
		err = parse_head(&v);
	if (!err)
		err = dcast_st_open(base_path, &base);
	if (!err)
		err = check_base(&v, base, base_path);
	if (!err)
		err = walk_chunks(&v, NULL);
	if (!err)
		err = write_output(&v, base, out_path);
	dcast_st_close(&base);
	dcast_st_close(&v.layout);
	free(v.tensors);
	if (v.data)
		munmap((void *)v.data, v.size);
	return err;
}

int cmd_apply(int argc, char **argv)
{
	const char *out;
	int rc = cli_parse_two_in_one_out(CMD, usage_text, "BASE, PATCH and -o OUT", argc, argv, &out);

	if (rc >= 0)
		return rc;
	int err = apply_patch(argv[optind], argv[optind + 1], out);
	return err ? cli_report(CMD, err) : CLI_OK;
}
