/* libFuzzer target for the receiving side of a bulk connection
 * (schema/bulkrx.c): the input is what a broker writes on one.  Byte 0:
 * bit 0, a connection to the broker's unix socket (a reference after each
 * header of a frame with a payload); bit 1, a file passed with the
 * stream's first bytes (SCM_RIGHTS: a memfd of FILE_BYTES patterned
 * bytes, as the broker passes a segment).  Byte 1: the version the BULK
 * named.  The rest goes through a socketpair, closed after it, and is read
 * as the relay reads it (broker/relaybulk.c): header, then the payload
 * into a buffer of its own, frame by frame, until an error or the end.
 * Every frame read whole must be a CHUNK or the COMMIT of that version
 * with the payload its header says, a payload by reference must hold the
 * file's bytes at its offset, and the stream must end in an error (its
 * end before a COMMIT is one); never a crash, a leak or a sanitizer
 * report.  Seeds: tests/fuzz/seeds/fuzz_bulkrx (tests/fuzz/bulkrx_seeds.py:
 * a CHUNK and the COMMIT of schema/vectors, over TCP, inline on the unix
 * socket, and by reference to the file). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include "dcast_bulkrx.h"
#include "dcast_wire.h"

#define FILE_BYTES 65536

static unsigned char file_byte(uint64_t off)
{
	return (unsigned char)(off * 131 + 7);
}

static int file_make(void)
{
	unsigned char buf[FILE_BYTES];
	int fd = memfd_create("fuzz_bulkrx", MFD_CLOEXEC);

	for (uint64_t i = 0; i < FILE_BYTES; i++)
		buf[i] = file_byte(i);
	if (fd < 0 || write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf))
		abort();
	return fd;
}

/* The stream into sv[1], the file passed with its first byte when asked;
 * then the writing side is shut. */
static void stream_write(int s, const uint8_t *p, size_t n, int pass_file)
{
	union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
	struct iovec iov = {(void *)p, n};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	int fd = -1;

	memset(&u, 0, sizeof(u));
	if (pass_file && n) {
		fd = file_make();
		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof(u.buf);
		CMSG_FIRSTHDR(&mh)->cmsg_level = SOL_SOCKET;
		CMSG_FIRSTHDR(&mh)->cmsg_type = SCM_RIGHTS;
		CMSG_FIRSTHDR(&mh)->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(CMSG_FIRSTHDR(&mh)), &fd, sizeof(int));
	}
	if (n && sendmsg(s, &mh, MSG_NOSIGNAL) != (ssize_t)n)
		abort(); /* the socketpair's buffer holds any input libFuzzer gives */
	if (fd >= 0)
		close(fd);
	shutdown(s, SHUT_WR);
}

/* A frame read whole: what it must be. */
static void frame_check(const dcast_bulkrx *r, const dcast_wire_in *in, uint64_t ref_off, int by_ref)
{
	const dcast_msg *m = &in->msg;
	size_t n = zmq_msg_size((zmq_msg_t *)&in->payload);
	const unsigned char *p = zmq_msg_data((zmq_msg_t *)&in->payload);

	if (m->type == DCAST_MSG_CHUNK ? m->u.chunk.version != r->version
	    : m->type != DCAST_MSG_COMMIT || m->u.commit.version != r->version)
		abort();
	if (m->type == DCAST_MSG_CHUNK && n != m->u.chunk.payload_bytes)
		abort();
	for (size_t i = 0; by_ref && i < n; i++)
		if (p[i] != file_byte(ref_off + i))
			abort();
}

/* One step as the relay's read_step: 1 on progress, 0 when nothing came,
 * -1 on an error. */
static int step(dcast_bulkrx *r)
{
	uint64_t got = 0;
	int err;

	if (!dcast_bulkrx_head_done(r)) {
		if (!(err = dcast_bulkrx_head_step(r, &got)) && dcast_bulkrx_head_done(r))
			err = dcast_bulkrx_payload_buffer(r);
		return err ? -1 : got > 0 || dcast_bulkrx_head_done(r);
	}
	err = dcast_bulkrx_take_payload(r, (char *)zmq_msg_data(&r->payload) + r->payload_got,
					r->payload_len - r->payload_got, &got);
	r->payload_got += got;
	return err ? -1 : got > 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	dcast_bulkrx r;
	dcast_wire_in in;
	int sv[2], rc = 1;

	if (size < 2 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv))
		return 0;
	dcast_bulkrx_init(&r);
	r.fd = sv[0];
	r.local = data[0] & 1;
	r.connected = 1;
	r.opening_sent = DCAST_BULK_OPENING;
	r.version = data[1];
	r.endpoint = "tcp://fuzz:1"; /* r.addr_len 0: a fallback to TCP fails at once */
	stream_write(sv[1], data + 2, size - 2, (data[0] & 2) != 0);
	while (rc > 0) {
		uint64_t ref_off = r.ref_off;
		int by_ref = r.by_ref;

		if ((rc = step(&r)) > 0 && dcast_bulkrx_whole(&r)) {
			dcast_bulkrx_finish(&r, &in);
			frame_check(&r, &in, ref_off, by_ref);
			dcast_wire_in_close(&in);
		}
	}
	if (rc == 0 && r.connected) /* the stream ended: an error, never a quiet stop */
		abort();
	dcast_bulkrx_close(&r);
	close(sv[1]);
	return 0;
}
