/* The fold's state in the heap or in a file of the data dir (foldstate.h).
 * Both backends answer the same range get / put, so the fold, its checks
 * and the cut read the state one range at a time whichever holds it. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "broker.h"
#include "dcast_common.h"
#include "dcast_io.h"
#include "dcast_slab.h" /* dcast_huge_pages */
#include "deltacast/codec.h"
#include "fold.h"
#include "foldstate.h"

static unsigned elem_bytes(const struct fold_state *s, uint32_t t)
{
	return dcast_dtype_size((int)s->mf->m.tensors[t].dtype);
}

static uint64_t tensor_bytes(const struct broker_manifest *mf, uint32_t t)
{
	return dcast_tensor_elems(&mf->m.tensors[t]) * dcast_dtype_size((int)mf->m.tensors[t].dtype);
}

uint64_t fold_manifest_bytes(const struct broker_manifest *mf)
{
	uint64_t n = 0;

	for (uint32_t t = 0; mf && t < mf->m.n_tensors; t++)
		n += tensor_bytes(mf, t);
	return n;
}

#define STATE_ALIGN 64u

/* Tensor t's room in the heap state. */
static uint64_t slot_bytes(const struct broker_manifest *mf, uint32_t t)
{
	return (tensor_bytes(mf, t) + STATE_ALIGN - 1) / STATE_ALIGN * STATE_ALIGN;
}

/* One mapping for every tensor, each at a 64-byte boundary, that the
 * kernel may back with huge pages (MADV_HUGEPAGE, a hint, unless
 * DELTACAST_HUGE_PAGES=0): the state is
 * written whole at its first fold, and 4 KiB faults were most of that
 * (docs/operations.md, "Producer anchors as deltas").  An empty tensor
 * is refused, as a dense range of none is never asked for. */
static int heap_open(struct fold_state *s)
{
	uint32_t n = s->mf->m.n_tensors;
	uint64_t at = 0;
	uint8_t *m;

	for (uint32_t i = 0; i < n; i++) {
		if (!tensor_bytes(s->mf, i))
			return dcast_fail(DCAST_ENOMEM, "fold: tensor %s: 0 bytes",
					  s->mf->m.tensors[i].name);
		at += slot_bytes(s->mf, i);
	}
	if (!(s->data = calloc(n ? n : 1, sizeof(*s->data))))
		return dcast_fail(DCAST_ENOMEM, "fold: %u tensor pointers", n);
	m = mmap(NULL, at ? at : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return dcast_fail(DCAST_ENOMEM, "fold: a state of %llu bytes: %s",
				  (unsigned long long)at, strerror(errno));
	if (dcast_huge_pages())
		madvise(m, at, MADV_HUGEPAGE);
	s->region = m;
	s->region_bytes = at ? at : 1;
	for (uint32_t i = 0; i < n; i++) {
		s->data[i] = m;
		m += slot_bytes(s->mf, i);
	}
	return 0;
}

/* An unnamed file of the model's dense size (sparse until written), each
 * tensor at its offset. */
static int file_open(struct fold_state *s, const char *dir)
{
	uint32_t n = s->mf->m.n_tensors;
	int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	uint64_t at = 0;

	if (fd < 0)
		return dcast_fail(DCAST_EIO, "fold state file in '%s': %s", dir, strerror(errno));
	if (ftruncate(fd, (off_t)s->dense_bytes)) {
		dcast_fail(DCAST_EIO, "fold state file in '%s': %llu bytes: %s", dir,
			   (unsigned long long)s->dense_bytes, strerror(errno));
		close(fd);
		return DCAST_EIO;
	}
	if (!(s->off = calloc(n ? n : 1, sizeof(*s->off)))) {
		close(fd);
		return dcast_fail(DCAST_ENOMEM, "fold: %u tensor offsets", n);
	}
	s->fd = fd;
	for (uint32_t i = 0; i < n; i++) {
		s->off[i] = at;
		at += tensor_bytes(s->mf, i);
	}
	return 0;
}

int fold_state_open(struct fold_state *s, struct broker_manifest *mf, const char *dir)
{
	int rc;

	DCAST_ASSERT(!s->mf);
	memset(s, 0, sizeof(*s));
	s->mf = mf;
	mf->refs++;
	s->dense_bytes = fold_manifest_bytes(mf);
	if (dir && !file_open(s, dir))
		return 0;
	if (dir)
		DCAST_LOG_W("fold: %s; the state is kept in memory", dcast_last_error());
	if ((rc = heap_open(s)))
		fold_state_close(s);
	return rc;
}

void fold_state_close(struct fold_state *s)
{
	if (s->region)
		munmap(s->region, s->region_bytes);
	free(s->data);
	if (s->off)
		broker_file_close(s->fd);
	free(s->off);
	free(s->buf);
	broker_manifest_put(s->mf);
	memset(s, 0, sizeof(*s));
}

static int buf_reserve(struct fold_state *s, uint64_t bytes)
{
	if (bytes <= s->buf_cap)
		return 0;
	free(s->buf); /* nothing in it is kept across gets */
	s->buf_cap = 0;
	if (!(s->buf = malloc(bytes)))
		return dcast_fail(DCAST_ENOMEM, "fold: a state range of %llu bytes",
				  (unsigned long long)bytes);
	s->buf_cap = bytes;
	return 0;
}

int fold_state_get(struct fold_state *s, uint32_t t, uint64_t start, uint64_t count, uint8_t **range)
{
	unsigned es;
	int rc;

	DCAST_ASSERT(s->mf && t < s->mf->m.n_tensors);
	DCAST_ASSERT(start <= dcast_tensor_elems(&s->mf->m.tensors[t]) &&
		     count <= dcast_tensor_elems(&s->mf->m.tensors[t]) - start);
	es = elem_bytes(s, t);
	if (!s->off) {
		*range = s->data[t] + start * es;
		return 0;
	}
	if ((rc = buf_reserve(s, count * es)))
		return rc;
	s->got_off = s->off[t] + start * es;
	s->got_bytes = count * es;
	if ((rc = dcast_pread_full(s->fd, s->buf, s->got_bytes, s->got_off, "fold state file")))
		return rc;
	*range = s->buf;
	return 0;
}

int fold_state_put(struct fold_state *s)
{
	if (!s->off)
		return 0;
	return dcast_pwrite_full(s->fd, s->buf, s->got_bytes, s->got_off, "fold state file");
}

int fold_state_digest(struct fold_state *s, uint32_t t, uint64_t start, uint64_t count,
		      uint64_t *digest)
{
	uint64_t sum = 0, part, n;
	uint8_t *range;
	int rc;

	for (uint64_t at = start; at - start < count; at += n) {
		n = count - (at - start) < BROKER_FOLD_RANGE_ELEMS ? count - (at - start)
								    : BROKER_FOLD_RANGE_ELEMS;
		if ((rc = fold_state_get(s, t, at, n, &range)))
			return rc;
		if (dcast_ldigest(t, at, range, n, elem_bytes(s, t), &part))
			return dcast_fail(DCAST_EDIGEST, "digest of tensor %s: %s",
					  s->mf->m.tensors[t].name, dcast_last_error());
		sum += part;
	}
	*digest = sum;
	return 0;
}

uint64_t fold_state_heap_bytes(const struct fold_state *s)
{
	return s->off ? s->buf_cap : s->mf ? s->dense_bytes : 0;
}
