/* libFuzzer target for the durable record reader (common/reclog.c): the
 * broker's segments and the consumer's record log are read back after a
 * crash, from a disk that may hold anything.  Any bytes, as a record file:
 * the scan stops at the first torn or damaged record with a reason, every
 * record it hands over lies within the file, and every header it hands
 * over either decodes to the message its kind says or is refused with a
 * message.  An input whose first byte is odd is a list of records instead
 * (kind, version, header, payload: see records()), written with valid
 * checksums, so that mutated headers get past the record checksum to the
 * message decoder: a file written whole by a faulty writer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "dcast_reclog.h"
#include "deltacast/codec.h" /* dcast_checksum */

typedef struct scan_ctx {
	uint64_t size, last_end;
} scan_ctx;

static int on_record(void *arg, uint64_t off, const dcast_rec *r, const uint8_t *hdr, const uint8_t *payload,
		     char *why, size_t why_cap)
{
	scan_ctx *s = arg;
	char name[DCAST_MAX_NAME + 1];
	dcast_msg m;

	(void)payload, (void)why, (void)why_cap;
	if (off < s->last_end || off + dcast_rec_bytes(r) > s->size)
		abort(); /* records in order, inside the file */
	s->last_end = off + dcast_rec_bytes(r);
	if (r->kind == DCAST_REC_FILE) {
		if (dcast_rec_file_name(r, hdr, name) == 0 && (!name[0] || strlen(name) > DCAST_MAX_NAME))
			abort();
		return 0;
	}
	if (dcast_rec_msg(r, hdr, &m) != 0) {
		if (dcast_last_error()[0] == '\0')
			abort();
		return 0;
	}
	dcast_msg_free(&m);
	return r->kind == DCAST_REC_COMMIT;
}

/* Records from in[0..n): per record a byte kind (1..4), a byte version, a
 * byte header length and a byte payload length, then those bytes (cut
 * where the input ends), each encoded whole into fd. */
static void records(int fd, const uint8_t *in, size_t n)
{
	uint8_t prefix[DCAST_REC_PREFIX];

	while (n >= 4) {
		dcast_rec r = {.kind = (uint16_t)(1 + in[0] % 4), .version = in[1]};
		size_t h = in[2], p = in[3];
		in += 4, n -= 4;
		h = h < n ? h : n;
		p = p < n - h ? p : n - h;
		r.hdr_len = (uint32_t)h, r.payload_len = (uint32_t)p;
		r.payload_sum = dcast_checksum(in + h, p);
		dcast_rec_encode(prefix, &r, in);
		if (write(fd, prefix, sizeof(prefix)) != (ssize_t)sizeof(prefix) ||
		    (h + p && write(fd, in, h + p) != (ssize_t)(h + p)))
			abort();
		in += h + p, n -= h + p;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	dcast_rec_reader rd = {.max_kind = DCAST_REC_COMMIT};
	dcast_rec_scan_out out;
	scan_ctx s = {size, 0};
	int fd = memfd_create("fuzz_reclog", 0);

	if (fd < 0)
		abort();
	if (size && data[0] & 1)
		records(fd, data + 1, size - 1);
	else if (size && write(fd, data, size) != (ssize_t)size)
		abort();
	s.size = size = (size_t)lseek(fd, 0, SEEK_END);
	rd.fd = fd;
	rd.size = size;
	if (dcast_rec_scan(&rd, (size & 1) != 0, on_record, &s, &out) == 0) {
		if (out.good_end > size || out.bad_off > size || out.good_end > out.bad_off ||
		    (out.bad_off < size && !out.why[0]))
			abort(); /* a stop before the end says why */
	}
	if (dcast_rec_next_magic(fd, size / 2, size) > size)
		abort();
	dcast_rec_reader_free(&rd);
	close(fd);
	return 0;
}
