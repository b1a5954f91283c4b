/* Payloads kept on disk with --data-dir.  An open version's chunks go to a
 * spill file of its own as they arrive (broker_spill_write).  Once a
 * version's records are durable its payload frames leave the heap and each
 * chunk keeps where its bytes lie in the segment; a consumer's chunk is
 * then served from a read-only mapping of just its pages (page cache, no
 * copy: the kernel's send is the one copy), unmapped once its last send is
 * done (below: the read cache).  A payload under DISK_MAP_MIN_BYTES, or
 * one the system refuses to map, is read (pread) into a heap frame
 * instead.  So memory holds what is in flight: each consumer's credit
 * bounds what it is sent ahead, and the bytes mapped or read and not yet
 * sent are capped over all consumers (BROKER_DISK_INFLIGHT_BYTES).  The
 * counter of those bytes is atomic: ZeroMQ's I/O threads free the frames.
 *
 * A mapping never reaches past the end of the last commit of its segment,
 * and nothing cuts a segment below that while the broker serves it
 * (broker_seg_abort cuts back to it; quarantine cuts at load, before any
 * chunk points into the file), so no mapped page can lie past the end of
 * its file (SIGBUS).  A segment unlinked meanwhile stays mapped.
 *
 * The read cache: consumers that want the same chunk at about the same
 * time share one mapping (or read).  A frame is one buffer with a count
 * of its holders (the cache and each send: a zmq_msg_init_data each, no
 * copy).  The cache keeps it while a send still holds it (a consumer that
 * comes to the chunk meanwhile costs no syscall, no fault and no memory),
 * and past that for the other consumers expected to take it within their
 * window (fanout.c counts them; each take counts one off).  An entry is
 * found from its chunk (ch->cache_slot), so it can only be served as the
 * chunk it was read for, and it goes with the chunk (a version freed, its
 * log cleared, poisoned).  At most --read-cache-bytes are held (least
 * recently used out first), and they count among the bytes read and not
 * yet sent.  The cache is the loop thread's; only the holder counts are
 * atomic.  docs/operations.md, "Memory with --data-dir". */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "broker.h"
#include "dcast_common.h"
#include "dcast_io.h"

static _Atomic uint64_t disk_inflight; /* bytes read from disk, not yet sent */
static _Atomic uint64_t disk_read_bytes; /* payload bytes read from disk for consumers */
static _Atomic int sweep_due;           /* a kept frame may be held by the cache alone */
static uint64_t disk_mapped_bytes;      /* of those, served from a mapping (loop thread) */
static int map_fault;                   /* DELTACAST_BROKER_FAULT=nomap: mmap refused */
static int map_refusal_logged;

/* Smaller payloads are read: a mapping costs two syscalls and a page
 * table update, more than copying a few pages. */
#define DISK_MAP_MIN_BYTES (16u << 10)

/* A payload from disk: one buffer for the read cache and every send of it
 * (a zmq_msg_init_data each), freed by the last (any thread). */
struct disk_frame {
	_Atomic uint32_t refs;
	uint64_t len;
	unsigned char *data;          /* len bytes: in map, or buf */
	void *map;                    /* its segment's pages, mapped; NULL: read into buf */
	size_t map_len;
	unsigned char buf[];
};

#define READ_CACHE_SLOTS 4096u

struct read_entry {
	struct broker_chunk *ch;      /* the chunk it was read for; NULL: free */
	struct disk_frame *f;         /* a reference */
	uint32_t want;                /* consumers still expected to take it; 0: kept
					 only while a send holds it */
	uint32_t prev, next;          /* LRU list through slot 0; free list: next */
};

static struct {
	uint64_t cap_bytes, bytes, hits;
	struct read_entry *e;         /* [READ_CACHE_SLOTS + 1], slot 0 the list head */
	uint32_t free_head;
} cache;

static int file_id(int fd, uint64_t *dev, uint64_t *ino)
{
	struct stat st;

	if (fstat(fd, &st))
		return dcast_fail(DCAST_EIO, "segment read handle: fstat: %s", strerror(errno));
	*dev = (uint64_t)st.st_dev;
	*ino = (uint64_t)st.st_ino;
	return 0;
}

struct broker_segfile *broker_segfile_new(int fd)
{
	struct broker_segfile *f = calloc(1, sizeof(*f));

	if (!f) {
		close(fd);
		dcast_fail(DCAST_ENOMEM, "segment read handle");
		return NULL;
	}
	if (file_id(fd, &f->dev, &f->ino)) {
		close(fd);
		free(f);
		return NULL;
	}
	f->refs = 1;
	f->fd = fd;
	return f;
}

struct broker_segfile *broker_segfile_share(struct broker_segfile **cur, int fd)
{
	uint64_t dev = 0, ino = 0;

	if (*cur && !file_id(fd, &dev, &ino) && dev == (*cur)->dev && ino == (*cur)->ino) {
		close(fd);
		(*cur)->refs++;
		return *cur;
	}
	broker_segfile_put(*cur);
	if (!(*cur = broker_segfile_new(fd)))
		return NULL;
	(*cur)->refs++;
	return *cur;
}

static void *closer_main(void *arg)
{
	close((int)(intptr_t)arg);
	return NULL;
}

void broker_file_close(int fd)
{
	pthread_attr_t a;
	pthread_t th;
	struct stat st;
	int started = 0;

	if (fd < 0)
		return;
	if (!fstat(fd, &st) && st.st_nlink == 0 && (uint64_t)st.st_blocks * 512 >= BROKER_CLOSE_ASYNC_BYTES &&
	    !pthread_attr_init(&a)) {
		started = !pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED) &&
			  !pthread_create(&th, &a, closer_main, (void *)(intptr_t)fd);
		pthread_attr_destroy(&a);
	}
	if (!started)
		close(fd);
}

void broker_segfile_put(struct broker_segfile *f)
{
	if (!f || --f->refs)
		return;
	broker_file_close(f->fd);
	free(f);
}

uint64_t broker_disk_inflight_bytes(void)
{
	return atomic_load_explicit(&disk_inflight, memory_order_relaxed);
}

/* ---- frames ---- */

static void frame_put(struct disk_frame *f)
{
	uint32_t was = atomic_fetch_sub_explicit(&f->refs, 1, memory_order_acq_rel);

	if (was == 2)
		atomic_store_explicit(&sweep_due, 1, memory_order_relaxed);
	if (was > 1)
		return;
	atomic_fetch_sub_explicit(&disk_inflight, f->len, memory_order_relaxed);
	if (f->map)
		munmap(f->map, f->map_len);
	free(f);
}

/* ZeroMQ is done with a send of a frame (any thread). */
static void frame_sent(void *data, void *hint)
{
	(void)data;
	frame_put(hint);
}

/* *out (uninitialised): a send of f, one more reference. */
static int frame_msg(struct disk_frame *f, zmq_msg_t *out)
{
	atomic_fetch_add_explicit(&f->refs, 1, memory_order_relaxed);
	if (!zmq_msg_init_data(out, f->data, f->len, frame_sent, f))
		return 0;
	frame_put(f);
	return dcast_fail(DCAST_ENOMEM, "a frame of %llu bytes", (unsigned long long)f->len);
}

/* A frame of len bytes, buf_len of them in the frame itself (no reference
 * yet, not yet counted in flight). */
static struct disk_frame *frame_alloc(uint64_t len, size_t buf_len)
{
	struct disk_frame *f = malloc(sizeof(*f) + buf_len);

	if (!f) {
		dcast_fail(DCAST_ENOMEM, "a %llu-byte payload from disk", (unsigned long long)len);
		return NULL;
	}
	atomic_init(&f->refs, 0);
	f->len = len;
	f->data = f->buf;
	f->map = NULL;
	f->map_len = 0;
	return f;
}

static void map_refused(const struct broker_chunk *ch, int err)
{
	if (map_refusal_logged)
		return;
	map_refusal_logged = 1;
	DCAST_LOG_W("segment payloads: mmap of %llu bytes at offset %llu: %s; such payloads are "
		    "read (pread, one copy more) while it fails", (unsigned long long)ch->payload_len,
		    (unsigned long long)ch->file_off, strerror(err));
}

/* 1 when ch's bytes lie within its file as it is now.  A file cut shorter
 * behind the broker's back is then read, and the read names the offset
 * (the short read of a damaged segment), where a mapping would fault. */
static int chunk_in_file(const struct broker_chunk *ch)
{
	struct stat st;

	return !fstat(ch->file->fd, &st) && ch->file_off + ch->payload_len <= (uint64_t)st.st_size;
}

/* ch's pages of its segment, mapped read-only and faulted in now; NULL
 * (the caller reads) when it is too small, or cannot be mapped. */
static struct disk_frame *frame_map(const struct broker_chunk *ch)
{
	uint64_t lead = ch->file_off % (uint64_t)sysconf(_SC_PAGESIZE);
	size_t map_len = (size_t)(ch->payload_len + lead);
	struct disk_frame *f;
	void *p;

	if (ch->payload_len < DISK_MAP_MIN_BYTES || !chunk_in_file(ch))
		return NULL;
	if (map_fault) { /* as a file system without mmap */
		map_refused(ch, ENODEV);
		return NULL;
	}
	/* MAP_POPULATE: the pages are faulted in here, on the loop's thread,
	 * in one call (where pread read them), not page by page by the send. */
	p = mmap(NULL, map_len, PROT_READ, MAP_SHARED | MAP_POPULATE, ch->file->fd,
		 (off_t)(ch->file_off - lead));
	if (p == MAP_FAILED) {
		map_refused(ch, errno);
		return NULL;
	}
	if (!(f = frame_alloc(ch->payload_len, 0))) {
		munmap(p, map_len);
		return NULL;
	}
	f->map = p;
	f->map_len = map_len;
	f->data = (unsigned char *)p + lead;
	return f;
}

/* The copy from the page cache into a new heap frame *out: what a
 * payload served from disk costs where it is not mapped. */
static int frame_copy(const struct broker_chunk *ch, struct disk_frame **out)
{
	struct disk_frame *f = frame_alloc(ch->payload_len, ch->payload_len);
	int rc;

	if (!f)
		return DCAST_ENOMEM;
	if ((rc = dcast_pread_full(ch->file->fd, f->data, ch->payload_len, ch->file_off, "segment"))) {
		free(f);
		return rc;
	}
	*out = f;
	return 0;
}

/* ch's payload from disk in a new frame *out (no reference yet): mapped,
 * else read. */
static int frame_read(const struct broker_chunk *ch, struct disk_frame **out)
{
	int rc;

	if (!(*out = frame_map(ch)) && (rc = frame_copy(ch, out)))
		return rc;
	atomic_fetch_add_explicit(&disk_inflight, (*out)->len, memory_order_relaxed);
	return 0;
}

/* ---- the read cache ---- */

static void lru_unlink(uint32_t i)
{
	cache.e[cache.e[i].prev].next = cache.e[i].next;
	cache.e[cache.e[i].next].prev = cache.e[i].prev;
}

static void lru_push(uint32_t i)
{
	cache.e[i].next = cache.e[0].next;
	cache.e[i].prev = 0;
	cache.e[cache.e[0].next].prev = i;
	cache.e[0].next = i;
}

static void entry_drop(uint32_t i)
{
	struct read_entry *e = &cache.e[i];

	DCAST_ASSERT(e->ch && e->ch->cache_slot == i);
	lru_unlink(i);
	cache.bytes -= e->f->len;
	frame_put(e->f); /* the buffer goes once no send holds it */
	e->ch->cache_slot = 0;
	e->ch = NULL;
	e->next = cache.free_head;
	cache.free_head = i;
}

/* Drop the least recently used entry; 0 when there is none. */
static int evict_one(void)
{
	if (!cache.e || !cache.e[0].prev)
		return 0;
	entry_drop(cache.e[0].prev);
	return 1;
}

static int cache_alloc(void)
{
	if (cache.e)
		return 0;
	if (!(cache.e = calloc(READ_CACHE_SLOTS + 1, sizeof(*cache.e))))
		return DCAST_ENOMEM;
	for (uint32_t i = 1; i <= READ_CACHE_SLOTS; i++)
		cache.e[i].next = i < READ_CACHE_SLOTS ? i + 1 : 0;
	cache.free_head = 1;
	return 0;
}

/* Keep f (ch's payload just read) for `want` more takers, and while a
 * send holds it, making room under the cap; nothing when it cannot fit. */
static void cache_keep(struct broker_chunk *ch, struct disk_frame *f, uint32_t want)
{
	uint32_t i;

	if (f->len > cache.cap_bytes || cache_alloc())
		return;
	while (cache.bytes + f->len > cache.cap_bytes || !cache.free_head)
		evict_one();
	i = cache.free_head;
	cache.free_head = cache.e[i].next;
	atomic_fetch_add_explicit(&f->refs, 1, memory_order_relaxed);
	cache.e[i] = (struct read_entry){.ch = ch, .f = f, .want = want};
	cache.bytes += f->len;
	ch->cache_slot = i;
	lru_push(i);
}

/* A hit: a send of the kept frame, one take counted off. */
static int cache_take(struct broker_chunk *ch, zmq_msg_t *out)
{
	uint32_t i = ch->cache_slot;
	int rc = frame_msg(cache.e[i].f, out);

	if (rc)
		return rc;
	cache.hits++;
	if (cache.e[i].want)
		cache.e[i].want--;
	lru_unlink(i);
	lru_push(i);
	return 0;
}

void broker_read_cache_sweep(void)
{
	uint32_t next;

	if (!cache.e || !atomic_exchange_explicit(&sweep_due, 0, memory_order_relaxed))
		return;
	for (uint32_t i = cache.e[0].next; i; i = next) {
		next = cache.e[i].next;
		if (!cache.e[i].want &&
		    atomic_load_explicit(&cache.e[i].f->refs, memory_order_acquire) == 1)
			entry_drop(i);
	}
}

void broker_read_cache_set(uint64_t cap_bytes)
{
	cache.cap_bytes = cap_bytes;
	while (cache.bytes > cap_bytes && evict_one())
		;
}

void broker_read_cache_free(void)
{
	while (evict_one())
		;
	free(cache.e);
	cache.e = NULL;
}

void broker_chunk_uncache(struct broker_chunk *ch)
{
	if (ch->cache_slot)
		entry_drop(ch->cache_slot);
}

void broker_version_uncache(struct broker_version *v)
{
	for (uint32_t i = 0; i < v->n_chunks; i++)
		broker_chunk_uncache(&v->chunks[i]);
}

uint64_t broker_read_cache_bytes(void)
{
	return cache.bytes;
}

uint64_t broker_read_cache_hits(void)
{
	return cache.hits;
}

uint64_t broker_disk_read_bytes(void)
{
	return atomic_load_explicit(&disk_read_bytes, memory_order_relaxed);
}

uint64_t broker_disk_mapped_bytes(void)
{
	return disk_mapped_bytes;
}

void broker_disk_map_fault(int refuse)
{
	map_fault = refuse;
}

/* ---- reads ---- */

static int disk_room(uint64_t len)
{
	return broker_disk_inflight_bytes() + len <= BROKER_DISK_INFLIGHT_BYTES;
}

/* Kept frames count among the bytes read and not yet sent: under
 * pressure they go first (those no send holds are freed at once). */
int broker_chunk_readable(const struct broker_chunk *ch, uint64_t unacked)
{
	if (!ch->file || ch->cache_slot || unacked < BROKER_DISK_FLOOR_BYTES)
		return 1;
	while (!disk_room(ch->payload_len) && evict_one())
		;
	return disk_room(ch->payload_len);
}

/* A send of ch's payload: the frame in memory, or f read from disk. */
static int payload_msg(const struct broker_chunk *ch, struct disk_frame **f, zmq_msg_t *out)
{
	int rc;

	*f = NULL;
	if (!ch->file) {
		zmq_msg_init(out);
		zmq_msg_copy(out, (zmq_msg_t *)&ch->payload);
		return 0;
	}
	if ((rc = frame_read(ch, f)) || (rc = frame_msg(*f, out)))
		*f = NULL; /* freed by frame_msg's failure */
	return rc;
}

int broker_chunk_payload(const struct broker_chunk *ch, zmq_msg_t *out)
{
	struct disk_frame *f;

	return payload_msg(ch, &f, out);
}

int broker_file_pread(const struct broker_segfile *f, uint64_t off, void *buf, size_t n)
{
	int rc;

	if ((rc = dcast_pread_full(f->fd, buf, n, off, "segment")))
		return rc;
	atomic_fetch_add_explicit(&disk_read_bytes, n, memory_order_relaxed);
	return 0;
}

int broker_chunk_serve(struct broker_chunk *ch, uint32_t others, zmq_msg_t *out)
{
	struct disk_frame *f;
	int rc;

	if (ch->cache_slot)
		return cache_take(ch, out);
	if ((rc = payload_msg(ch, &f, out)) || !f)
		return rc;
	atomic_fetch_add_explicit(&disk_read_bytes, f->len, memory_order_relaxed);
	if (f->map)
		disk_mapped_bytes += f->len;
	if (cache.cap_bytes)
		cache_keep(ch, f, others);
	return 0;
}

void broker_version_to_disk(struct broker_version *v, struct broker_segfile *file,
			    const uint64_t *off)
{
	for (uint32_t i = 0; i < v->n_chunks; i++) {
		struct broker_chunk *ch = &v->chunks[i];

		DCAST_ASSERT(ch->file || zmq_msg_size(&ch->payload) == ch->payload_len);
		file->refs++;
		broker_segfile_put(ch->file);
		ch->file = file;
		ch->file_off = off[i];
		zmq_msg_close(&ch->payload);
		zmq_msg_init(&ch->payload);
	}
}

/* An unnamed file in dir: nothing is left of it after a crash. */
static struct broker_segfile *spill_open(const char *dir)
{
	int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);

	if (fd < 0) {
		dcast_fail(DCAST_EIO, "spill file in '%s': %s", dir, strerror(errno));
		return NULL;
	}
	return broker_segfile_new(fd);
}

int broker_spill_write(const char *dir, struct broker_segfile **spill, uint64_t *end,
		       const void *data, size_t len, struct broker_segfile **file, uint64_t *off)
{
	int rc;

	if (!*spill && !(*spill = spill_open(dir)))
		return DCAST_EIO;
	if ((rc = dcast_pwrite_full((*spill)->fd, data, len, *end, "spill file")))
		return rc;
	*file = *spill;
	(*file)->refs++;
	*off = *end;
	*end += len;
	return 0;
}
