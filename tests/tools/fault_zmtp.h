/* fault_zmtp.h: a ZMTP 3 frame splitter for the fault tools (faultproxy,
 * tests/test_faults_zmtp.c), so that a proxy can act on whole frames and
 * messages (mangle a message's header frame, duplicate a message, inject a
 * frame between two messages) instead of on blind blocks of bytes.
 *
 * One fz_dir per direction of a TCP connection.  The caller appends what it
 * read at d->buf + d->len (up to FZ_BUF bytes in all), then takes items with
 * fz_next() until it returns 0, forwarding each item's bytes (it may change
 * a FRAME's body first) and then calling fz_take(d, item).  Items:
 *   FZ_RAW    bytes passed on unparsed: the 64-byte greeting, or the body of
 *             a frame too big for the buffer (after its FZ_HEAD)
 *   FZ_FRAME  a whole frame (header and body) in the buffer
 *   FZ_HEAD   the header of a frame too big for the buffer; its body follows
 *             as FZ_RAW items
 * A frame is the first of its message when `first` is set (not a command,
 * and the frame before it had no MORE flag).  Header-only, no allocation. */
#ifndef DCAST_FAULT_ZMTP_H
#define DCAST_FAULT_ZMTP_H

#include <stdint.h>
#include <string.h>

#define FZ_BUF (1u << 16)
#define FZ_GREETING 64
#define FZ_MORE 0x01
#define FZ_LONG 0x02
#define FZ_COMMAND 0x04

enum { FZ_RAW = 1, FZ_FRAME, FZ_HEAD };

typedef struct fz_dir {
	unsigned char buf[FZ_BUF];
	size_t len;       /* bytes in buf not yet taken */
	uint64_t greet;   /* greeting bytes still to pass */
	uint64_t pass;    /* body bytes of a big frame still to pass */
	int in_msg;       /* the last frame had MORE: the next continues its message */
	uint64_t msgs;    /* messages begun (first frames seen) */
} fz_dir;

typedef struct fz_item {
	int kind;
	unsigned char *p;   /* bytes to forward: p[0..n) */
	size_t n;
	unsigned flags;     /* FRAME, HEAD: the frame's flags */
	unsigned char *body; /* FRAME: the body, body_len bytes (inside p) */
	uint64_t body_len;  /* FRAME, HEAD: the body's length */
	int first;          /* FRAME, HEAD: first frame of a message */
} fz_item;

static inline void fz_init(fz_dir *d)
{
	d->len = 0;
	d->greet = FZ_GREETING;
	d->pass = 0;
	d->in_msg = 0;
	d->msgs = 0;
}

/* Between two messages: nothing pending, the greeting passed. */
static inline int fz_at_boundary(const fz_dir *d)
{
	return !d->len && !d->greet && !d->pass && !d->in_msg;
}

static inline int fz_raw(fz_dir *d, uint64_t left, fz_item *it)
{
	it->kind = FZ_RAW;
	it->p = d->buf;
	it->n = left < d->len ? (size_t)left : d->len;
	return 1;
}

/* The next item, or 0 when the buffer holds no whole one yet. */
static inline int fz_next(fz_dir *d, fz_item *it)
{
	unsigned char *b = d->buf;
	uint64_t size = 0;
	size_t hl;

	memset(it, 0, sizeof(*it));
	if (!d->len)
		return 0;
	if (d->greet)
		return fz_raw(d, d->greet, it);
	if (d->pass)
		return fz_raw(d, d->pass, it);
	hl = b[0] & FZ_LONG ? 9 : 2;
	if (d->len < hl)
		return 0;
	for (size_t i = 1; i < hl; i++)
		size = size << 8 | b[i];
	it->flags = b[0];
	it->body_len = size;
	it->first = !(b[0] & FZ_COMMAND) && !d->in_msg;
	it->p = b;
	if (size <= FZ_BUF - hl) {
		if (d->len - hl < size)
			return 0;
		it->kind = FZ_FRAME;
		it->body = b + hl;
		it->n = hl + (size_t)size;
		return 1;
	}
	it->kind = FZ_HEAD;
	it->n = hl;
	return 1;
}

/* The item was forwarded (or dropped): advance past it. */
static inline void fz_take(fz_dir *d, const fz_item *it)
{
	if (it->kind == FZ_RAW)
		*(d->greet ? &d->greet : &d->pass) -= it->n;
	if (it->kind == FZ_HEAD)
		d->pass = it->body_len;
	if (it->kind != FZ_RAW && !(it->flags & FZ_COMMAND)) {
		d->msgs += it->first;
		d->in_msg = it->flags & FZ_MORE;
	}
	d->len -= it->n;
	memmove(d->buf, d->buf + it->n, d->len);
}

/* Bytes of the whole message at offset `at` of the buffer, a message
 * boundary (every frame of it there, none too big for the buffer), or 0. */
static inline size_t fz_message_len_at(const fz_dir *d, size_t at)
{
	size_t o = at;

	if (d->greet || d->pass || d->in_msg)
		return 0;
	while (o < d->len) {
		const unsigned char *b = d->buf + o;
		size_t hl = b[0] & FZ_LONG ? 9 : 2;
		uint64_t size = 0;

		if (b[0] & FZ_COMMAND || d->len - o < hl)
			return 0;
		for (size_t i = 1; i < hl; i++)
			size = size << 8 | b[i];
		if (size > d->len - o - hl)
			return 0;
		o += hl + (size_t)size;
		if (!(b[0] & FZ_MORE))
			return o - at;
	}
	return 0;
}

/* Bytes of the whole message at the start of the buffer, or 0. */
static inline size_t fz_message_len(const fz_dir *d)
{
	return fz_message_len_at(d, 0);
}

/* Does the body hold the bytes s (a msgpack string, say)? */
static inline unsigned char *fz_find(const fz_item *it, const char *s, size_t n)
{
	for (uint64_t i = 0; it->body && i + n <= it->body_len; i++)
		if (!memcmp(it->body + i, s, n))
			return it->body + i;
	return NULL;
}

#endif
