/* deltacast delta: encode NEW against BASE into a patch file
 * (docs/patch-format.md), chunk by chunk with the smallest encoding.  Tensors
 * of NEW that BASE lacks (or holds with another dtype or shape) go dense. */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cli.h"
#include "deltacast/codec.h"
#include "patch.h"

#define CMD "delta"

static const char usage_text[] =
	"usage: deltacast delta BASE.safetensors NEW.safetensors -o PATCH\n"
	"Writes NEW as a delta on BASE (layout: docs/patch-format.md), with per-chunk\n"
	"checksums, a whole-file checksum and the per-tensor digests of BASE and NEW.\n";

typedef struct patch_writer {
	cli_out out;
	uint64_t pos;
	unsigned char *payload;
	size_t payload_cap;
} patch_writer;

static int put(patch_writer *w, const void *buf, uint64_t len)
{
	static const unsigned char zeros[8];
	int err = cli_pwrite_all(w->out.fd, buf, (size_t)len, w->pos, w->out.tmp);
	w->pos += len;
	uint64_t pad = patch_pad(w->pos);
	if (!err && pad)
		err = cli_pwrite_all(w->out.fd, zeros, (size_t)pad, w->pos, w->out.tmp);
	w->pos += pad;
	return err;
}

static int write_head(patch_writer *w, const cli_pair *p, uint64_t chunks)
{
	size_t hlen = 0;
	const void *hdr = dcast_st_header_bytes(p->cur, &hlen);
	patch_header h = {PATCH_VERSION, 0, dcast_st_count(p->cur), chunks, hlen,
			  dcast_st_data_bytes(p->cur)};
	unsigned char buf[PATCH_HEADER_BYTES];
	patch_header_put(buf, &h);
	int err = put(w, buf, sizeof(buf));
	return err ? err : put(w, hdr, hlen);
}

static int write_tensor_table(patch_writer *w, const cli_pair *p)
{
	int err = 0;
	for (size_t i = 0; i < dcast_st_count(p->cur) && !err; i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(p->cur, i), *b = p->base_of[i];
		unsigned es = cli_codec_elem_size(t);
		patch_tensor pt = {b ? dcast_digest(b->data, b->nbytes) : 0,
				   dcast_digest(t->data, t->nbytes), b != NULL, es, t->nbytes / es};
		unsigned char buf[PATCH_TENSOR_BYTES];
		patch_tensor_put(buf, &pt);
		err = put(w, buf, sizeof(buf));
	}
	return err;
}

static int write_chunk(patch_writer *w, uint32_t index, const dcast_st_tensor *t,
		       const dcast_st_tensor *b, uint64_t begin, uint64_t n)
{
	unsigned es = cli_codec_elem_size(t);
	dcast_chunk_info info;
	const unsigned char *cur = (const unsigned char *)t->data + begin * es;
	/* Without DCAST_ENCODE_UPDATE_BASE the base is only read. */
	void *base = b ? (unsigned char *)b->data + begin * es : NULL;
	int err = dcast_codec_encode(cur, base, n, es, -1, 0, w->payload, w->payload_cap, &info);
	if (err)
		return err;
	patch_chunk c = {index, info.encoding, begin, n, info.changed, info.payload_bytes,
			 dcast_checksum(w->payload, info.payload_bytes)};
	unsigned char buf[PATCH_CHUNK_BYTES];
	patch_chunk_put(buf, &c);
	err = put(w, buf, sizeof(buf));
	return err ? err : put(w, w->payload, info.payload_bytes);
}

static int write_chunks(patch_writer *w, const cli_pair *p)
{
	int err = 0;
	for (size_t i = 0; i < dcast_st_count(p->cur) && !err; i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(p->cur, i);
		uint64_t count = t->nbytes / cli_codec_elem_size(t);
		for (uint64_t at = 0; at < count && !err; at += CLI_CHUNK_ELEMS) {
			uint64_t n = count - at < CLI_CHUNK_ELEMS ? count - at : CLI_CHUNK_ELEMS;
			err = write_chunk(w, (uint32_t)i, t, p->base_of[i], at, n);
		}
	}
	return err;
}

/* Trailer: magic, file size, XXH3 of every byte before the checksum field. */
static int write_trailer(patch_writer *w)
{
	unsigned char tr[PATCH_TRAILER_BYTES];
	uint64_t size = w->pos + PATCH_TRAILER_BYTES;
	memcpy(tr, PATCH_TRAILER_MAGIC, 8);
	patch_put_le64(tr + 8, size);
	int err = cli_pwrite_all(w->out.fd, tr, 16, w->pos, w->out.tmp);
	if (err)
		return err;
	void *map = mmap(NULL, (size_t)(w->pos + 16), PROT_READ, MAP_SHARED, w->out.fd, 0);
	if (map == MAP_FAILED)
		return cli_fail(DCAST_EIO, "%s: mmap: %s", w->out.tmp, strerror(errno));
	uint64_t sum = dcast_checksum(map, (size_t)(w->pos + 16));
	munmap(map, (size_t)(w->pos + 16));
	patch_put_le64(tr + 16, sum);
	return cli_pwrite_all(w->out.fd, tr + 16, 8, w->pos + 16, w->out.tmp);
}

static uint64_t count_chunks(const dcast_st_file *f)
{
	uint64_t n = 0;
	for (size_t i = 0; i < dcast_st_count(f); i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(f, i);
		n += (t->nbytes / cli_codec_elem_size(t) + CLI_CHUNK_ELEMS - 1) / CLI_CHUNK_ELEMS;
	}
	return n;
}

static int write_patch(const cli_pair *p, const char *out_path)
{
	patch_writer w = {0};
	w.payload_cap = dcast_codec_bound(CLI_CHUNK_ELEMS, 4);
	w.payload = malloc(w.payload_cap);
	if (!w.payload)
		return cli_fail(DCAST_ENOMEM, "out of memory");
	int err = cli_out_open(out_path, &w.out);
	if (!err)
		err = write_head(&w, p, count_chunks(p->cur));
	if (!err)
		err = write_tensor_table(&w, p);
	if (!err)
		err = write_chunks(&w, p);
	if (!err)
		err = write_trailer(&w);
	if (!err)
		err = cli_out_commit(&w.out);
	else if (w.out.tmp)
		cli_out_abort(&w.out);
	free(w.payload);
	return err;
}

int cmd_delta(int argc, char **argv)
{
	const char *out;
	int rc = cli_parse_two_in_one_out(CMD, usage_text, "BASE, NEW and -o PATCH", argc, argv, &out);

	if (rc >= 0)
		return rc;
	cli_pair p;
	int err = cli_pair_open(argv[optind], argv[optind + 1], 0, &p);
	if (!err)
		err = write_patch(&p, out);
	cli_pair_close(&p);
	return err ? cli_report(CMD, err) : CLI_OK;
}
