/* The peer delta format that RL frameworks ship today (NeMo-RL, slime):
 * per tensor, the XOR of the new bit patterns with the old, compressed
 * with zstd at level 1.  `make bench-cluster` serves these files from
 * nginx and every worker fetches one per version with curl and applies it
 * to its own checkpoint, as the row beside deltacast's deltas.
 *
 *   xor_zstd make OLD.safetensors NEW.safetensors PATCH
 *   xor_zstd apply MODEL.safetensors PATCH      (MODEL changed in place)
 *
 * PATCH: "XZP1", u32 tensor count, then per tensor of NEW in file order:
 * u32 index in the file, u64 bytes, u64 compressed bytes, the zstd frame
 * (little-endian).  OLD and NEW must have the same tensors, shapes and
 * dtypes; apply checks that PATCH matches MODEL's tensors and sizes. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>
#include "deltacast/err.h"
#include "deltacast/safetensors.h"

#define MAGIC "XZP1"

static int die(const char *what)
{
	fprintf(stderr, "xor_zstd: %s\n", what);
	return 1;
}

static int st_open(const char *path, dcast_st_file **f)
{
	if (dcast_st_open(path, f) == 0)
		return 0;
	fprintf(stderr, "xor_zstd: %s: %s\n", path, dcast_last_error());
	return -1;
}

/* XOR of t_new's bytes with t_old's, compressed, appended to out. */
static int put_tensor(FILE *out, uint32_t i, const dcast_st_tensor *o, const dcast_st_tensor *n, void *x,
		      void *z, size_t zcap)
{
	const uint8_t *a = o->data, *b = n->data;
	uint8_t *d = x;
	size_t zn;
	uint64_t len = n->nbytes;

	for (uint64_t k = 0; k < len; k++)
		d[k] = a[k] ^ b[k];
	zn = ZSTD_compress(z, zcap, x, len, 1);
	if (ZSTD_isError(zn))
		return die(ZSTD_getErrorName(zn));
	return fwrite(&i, 4, 1, out) != 1 || fwrite(&len, 8, 1, out) != 1 || fwrite(&(uint64_t){zn}, 8, 1, out) != 1 ||
	       fwrite(z, 1, zn, out) != zn;
}

/* The bytes of f's largest tensor. */
static size_t largest(const dcast_st_file *f)
{
	size_t cap = 0;

	for (size_t i = 0; i < dcast_st_count(f); i++)
		if (dcast_st_tensor_at(f, i)->nbytes > cap)
			cap = dcast_st_tensor_at(f, i)->nbytes;
	return cap;
}

static int same_layout(const dcast_st_tensor *o, const dcast_st_tensor *n)
{
	return o && o->nbytes == n->nbytes && o->dtype == n->dtype && !strcmp(o->name, n->name);
}

static int make(const char *old_path, const char *new_path, const char *patch)
{
	dcast_st_file *fo = NULL, *fn = NULL;
	size_t n, cap;
	void *x = NULL, *z = NULL;
	FILE *out = NULL;
	int err = 1;

	if (st_open(old_path, &fo) || st_open(new_path, &fn))
		goto done;
	n = dcast_st_count(fn);
	if (n != dcast_st_count(fo) || n > UINT32_MAX) {
		die("OLD and NEW hold different tensors");
		goto done;
	}
	cap = largest(fn);
	if (!(x = malloc(cap ? cap : 1)) || !(z = malloc(ZSTD_compressBound(cap))) || !(out = fopen(patch, "wb"))) {
		die(strerror(errno));
		goto done;
	}
	err = fwrite(MAGIC, 4, 1, out) != 1 || fwrite(&(uint32_t){(uint32_t)n}, 4, 1, out) != 1;
	for (size_t i = 0; i < n && !err; i++) {
		const dcast_st_tensor *tn = dcast_st_tensor_at(fn, i), *to = dcast_st_tensor_at(fo, i);
		err = same_layout(to, tn) ? put_tensor(out, (uint32_t)i, to, tn, x, z, ZSTD_compressBound(cap))
					  : die("OLD and NEW differ in a tensor's name, dtype or size");
	}
done:
	if (out && fclose(out))
		err = die(strerror(errno));
	free(x);
	free(z);
	dcast_st_close(&fo);
	dcast_st_close(&fn);
	return err;
}

/* The file at path mapped (shared, writable when `rw`): *map and *len. */
static int map_file(const char *path, int rw, uint8_t **map, size_t *len)
{
	int fd = open(path, rw ? O_RDWR : O_RDONLY);
	struct stat st;
	void *p = MAP_FAILED;

	if (fd >= 0 && !fstat(fd, &st))
		p = mmap(NULL, (size_t)st.st_size, PROT_READ | (rw ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
	if (fd >= 0)
		close(fd);
	if (p == MAP_FAILED)
		return die(strerror(errno));
	*map = p;
	*len = (size_t)st.st_size;
	return 0;
}

/* One tensor's entry of the patch, read at *p (end at e), XORed into the
 * data area. */
static int take_tensor(const uint8_t **p, const uint8_t *e, const dcast_st_file *f, uint8_t *data, void *x)
{
	uint32_t i;
	uint64_t len, zn;
	const dcast_st_tensor *t;
	size_t got;

	if (e - *p < 20)
		return die("PATCH truncated in an entry's header");
	memcpy(&i, *p, 4);
	memcpy(&len, *p + 4, 8);
	memcpy(&zn, *p + 12, 8);
	*p += 20;
	if (!(t = dcast_st_tensor_at(f, i)) || t->nbytes != len || (uint64_t)(e - *p) < zn)
		return die("PATCH names a tensor MODEL does not have, or of another size");
	got = ZSTD_decompress(x, len, *p, zn);
	if (ZSTD_isError(got) || got != len)
		return die(ZSTD_isError(got) ? ZSTD_getErrorName(got) : "a frame of the wrong size");
	for (uint64_t k = 0; k < len; k++)
		data[t->data_offset + k] ^= ((uint8_t *)x)[k];
	*p += zn;
	return 0;
}

/* Every entry of the patch p..e XORed into MODEL's data area (f: MODEL). */
static int take_all(const uint8_t *p, const uint8_t *e, const dcast_st_file *f, uint8_t *data)
{
	size_t cap = largest(f);
	uint32_t n;
	uint8_t *x;
	int err = 0;

	if (e - p < 8 || memcmp(p, MAGIC, 4))
		return die("PATCH does not start with " MAGIC);
	memcpy(&n, p + 4, 4);
	if (!(x = malloc(cap ? cap : 1)))
		return die("out of memory");
	for (p += 8; n-- && !err;)
		err = take_tensor(&p, e, f, data, x);
	free(x);
	return err ? err : p != e ? die("PATCH has bytes after its last entry") : 0;
}

static int apply(const char *model, const char *patch)
{
	dcast_st_file *f = NULL;
	uint8_t *map = NULL, *pm = NULL;
	size_t len = 0, plen = 0, hdr = 0;
	int err = 1;

	if (!st_open(model, &f) && !map_file(model, 1, &map, &len) && !map_file(patch, 0, &pm, &plen)) {
		dcast_st_header_bytes(f, &hdr);
		err = take_all(pm, pm + plen, f, map + hdr);
	}
	if (map)
		munmap(map, len);
	if (pm)
		munmap(pm, plen);
	dcast_st_close(&f);
	return err;
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "make"))
		return make(argv[2], argv[3], argv[4]);
	if (argc == 4 && !strcmp(argv[1], "apply"))
		return apply(argv[2], argv[3]);
	fprintf(stderr, "usage: xor_zstd make OLD NEW PATCH | xor_zstd apply MODEL PATCH\n");
	return 2;
}
