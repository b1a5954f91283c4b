/* Payloads kept on disk with --data-dir.  An open version's chunks go to a
 * spill file of its own as they arrive (broker_spill_write).  Once a
 * version's records are durable its payload frames leave the heap and each
 * chunk keeps where its bytes lie in the segment; a consumer's chunk is
 * then read (pread, through the page cache) into a buffer of its own that
 * ZeroMQ frees once sent.  So the heap holds what is in flight: each
 * consumer's credit bounds what it is sent ahead, and the bytes read and
 * not yet sent are capped over all consumers (BROKER_DISK_INFLIGHT_BYTES).
 * The counter of those bytes is atomic: ZeroMQ's I/O threads free the
 * buffers.  docs/operations.md, "Memory". */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "broker.h"
#include "dcast_common.h"
#include "dcast_io.h"

static _Atomic uint64_t disk_inflight; /* bytes read from disk, not yet sent */

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

int broker_chunk_readable(const struct broker_chunk *ch, uint64_t unacked)
{
	uint64_t now = broker_disk_inflight_bytes();

	return !ch->file || unacked < BROKER_DISK_FLOOR_BYTES ||
	       now + ch->payload_len <= BROKER_DISK_INFLIGHT_BYTES;
}

/* ZeroMQ is done with a buffer read from disk (any thread). */
static void read_free(void *data, void *hint)
{
	atomic_fetch_sub_explicit(&disk_inflight, (uint64_t)(uintptr_t)hint, memory_order_relaxed);
	free(data);
}

/* The copy from the page cache into a frame of its own: the one copy a
 * payload served from disk costs (the wire needs the bytes in memory). */
static int read_payload(const struct broker_chunk *ch, void *buf)
{
	return dcast_pread_full(ch->file->fd, buf, ch->payload_len, ch->file_off, "segment");
}

int broker_chunk_payload(const struct broker_chunk *ch, zmq_msg_t *out)
{
	void *buf;
	int rc;

	if (!ch->file) {
		zmq_msg_init(out);
		zmq_msg_copy(out, (zmq_msg_t *)&ch->payload);
		return 0;
	}
	if (!(buf = malloc(ch->payload_len ? ch->payload_len : 1)))
		return dcast_fail(DCAST_ENOMEM, "a %llu-byte payload read from disk",
				  (unsigned long long)ch->payload_len);
	if ((rc = read_payload(ch, buf))) {
		free(buf);
		return rc;
	}
	atomic_fetch_add_explicit(&disk_inflight, ch->payload_len, memory_order_relaxed);
	if (zmq_msg_init_data(out, buf, ch->payload_len, read_free,
			      (void *)(uintptr_t)ch->payload_len)) {
		read_free(buf, (void *)(uintptr_t)ch->payload_len);
		return dcast_fail(DCAST_ENOMEM, "a frame of %llu bytes",
				  (unsigned long long)ch->payload_len);
	}
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
