/* Private: the durable record format shared by the broker's segments
 * (broker/segment.c) and the consumer's record log (consumer/ckpt*.c).
 *
 * A record file is a sequence of records, each
 *
 *   off  0  u32 magic "DCR3"      the last byte is the format
 *        4  u16 kind              the user's (1 .. its max_kind)
 *        6  u16 flags             0
 *        8  u32 header_len        <= DCAST_MAX_HEADER_BYTES
 *       12  u32 payload_len       <= DCAST_MAX_CHUNK_BYTES
 *       16  u64 version
 *       24  u64 payload_sum       dcast_checksum() of the payload
 *       32  u64 checksum          XXH3-64 of bytes 0..31, chained over the header
 *       40  header, payload
 *
 * little-endian.  Headers are the wire's msgpack bytes, so the schema's
 * strict decoder checks them again when they are read back; payloads are
 * stored as they came.  The writer hands over payload_sum: a chunk's sum
 * is known from its own check on arrival, so a record costs no second pass
 * over its payload.
 *
 * What a record kind means, and which sequences of kinds make a whole
 * unit (a version), is the user's: dcast_rec_scan() calls back per record
 * and cuts after the last record the callback said closes a unit.
 * Functions here are thread-compatible (one reader per thread). */
#ifndef DCAST_RECLOG_H
#define DCAST_RECLOG_H

#include <stddef.h>
#include <stdint.h>
#include "deltacast/schema.h"

#define DCAST_REC_PREFIX 40u   /* fixed part of a record, before its header */
#define DCAST_REC_FORMAT '3'   /* the magic's last byte this build writes and reads */

/* The kinds both logs use: a file opens with FILE (header: the model's
 * name); MANIFEST, CHUNK and COMMIT hold those messages' headers, a CHUNK
 * its payload too. */
enum dcast_rec_kind {
	DCAST_REC_FILE = 1,
	DCAST_REC_MANIFEST,
	DCAST_REC_CHUNK,
	DCAST_REC_COMMIT,
};

/* A record's prefix, decoded. */
typedef struct dcast_rec {
	uint16_t kind;
	uint32_t hdr_len, payload_len;
	uint64_t version, payload_sum;
} dcast_rec;

/* Bytes the record takes on disk: prefix, header and payload. */
static inline uint64_t dcast_rec_bytes(const dcast_rec *r)
{
	return DCAST_REC_PREFIX + (uint64_t)r->hdr_len + r->payload_len;
}

/* Fill the DCAST_REC_PREFIX bytes at p for record r whose header is
 * hdr[0..r->hdr_len): magic, fields, and the checksum over them and the
 * header.  The caller writes p, then hdr, then the payload.  r->payload_sum
 * must be dcast_checksum() of the payload (0 bytes: dcast_checksum of
 * nothing). */
void dcast_rec_encode(uint8_t *p, const dcast_rec *r, const void *hdr);

/* Reads records of one file.  buf holds the last record's header, and its
 * payload after it when that was read; it grows as needed and is the
 * reader's (dcast_rec_reader_free). */
typedef struct dcast_rec_reader {
	int fd;              /* the caller's, read with pread */
	uint64_t size;       /* bytes of the file to read: records must end within */
	uint16_t max_kind;   /* kinds 1 .. max_kind are valid */
	uint8_t *buf;
	size_t cap;
} dcast_rec_reader;

/* Free the reader's buffer (not its fd).  NULL-safe. */
void dcast_rec_reader_free(dcast_rec_reader *rd);

/* Read and check the record at off into *r and rd->buf: prefix (magic,
 * kind, flags, lengths within the limits and within rd->size), header and
 * checksum; with payload != 0 also the payload, checked against its sum
 * (after the header in rd->buf).  Returns 0; DCAST_ECORRUPT or
 * DCAST_ECHECKSUM with why set when the record is torn or damaged (where a
 * file is cut); DCAST_EPROTO_VERSION for a whole record of another format
 * (its checksum holds: written that way, not damaged; its kind and flags
 * are not judged, its lengths must be within this build's limits and the
 * file); DCAST_EIO or DCAST_ENOMEM (dcast_last_error() says which). */
int dcast_rec_read(dcast_rec_reader *rd, uint64_t off, int payload, dcast_rec *r, char *why,
		   size_t why_cap);

/* Called by dcast_rec_scan for each record that reads back intact, with
 * its offset, header and (when the scan reads payloads) payload.  Returns
 * 1 when this record closes a unit, 0 when it belongs and the unit goes
 * on, -1 (why set) when it does not belong there: the scan stops. */
typedef int (*dcast_rec_fn)(void *ctx, uint64_t off, const dcast_rec *r, const uint8_t *hdr,
			    const uint8_t *payload, char *why, size_t why_cap);

/* What a scan found. */
typedef struct dcast_rec_scan_out {
	uint64_t good_end;   /* end of the last record that closed a unit (0 if none) */
	uint64_t bad_off;    /* where the scan stopped: rd->size when it read everything */
	uint64_t units;      /* units closed */
	char why[256];       /* why it stopped before the end, "" if it did not */
} dcast_rec_scan_out;

/* Read records from offset 0 to rd->size through fn, stopping at the first
 * that is torn, damaged, or refused by fn.  Bytes from out->good_end on are
 * what a torn-tail cut removes.  Returns 0 (whatever was found), or the
 * errors that are not about the bytes: DCAST_EIO, DCAST_ENOMEM,
 * DCAST_EPROTO_VERSION (out->why names the record). */
int dcast_rec_scan(dcast_rec_reader *rd, int payload, dcast_rec_fn fn, void *ctx,
		   dcast_rec_scan_out *out);

/* The message in record r's header (hdr[0..r->hdr_len), as dcast_rec_read
 * or a scan's callback has it), decoded by the schema's strict decoder into
 * *m (dcast_msg_decode_stored: the record's checksum covered the header,
 * and a MANIFEST of an older build has no `sum`), checked to be what r's kind holds (MANIFEST, CHUNK, COMMIT) and, for a
 * CHUNK or COMMIT, of r's version.  On 0 the caller frees m
 * (dcast_msg_free).  Errors: the decoder's, DCAST_ECORRUPT (a FILE record,
 * or another message or version than the record says: named). */
int dcast_rec_msg(const dcast_rec *r, const uint8_t *hdr, dcast_msg *m);

/* The model name a FILE record holds (hdr[0..r->hdr_len)) into name
 * (DCAST_MAX_NAME + 1 bytes, NUL-terminated; untouched on error).  Errors:
 * DCAST_ECORRUPT (not a FILE record, a payload, an empty or too long name,
 * a NUL inside it). */
int dcast_rec_file_name(const dcast_rec *r, const uint8_t *hdr, char *name);

/* Offset of the next record magic of this format at or after off in fd,
 * or size if there is none before it: where to look again after a damaged
 * record, to name what lies past it. */
uint64_t dcast_rec_next_magic(int fd, uint64_t off, uint64_t size);

/* fsync a directory, so that files created, renamed or removed in it stay
 * so after a crash.  Returns 0, or DCAST_EIO naming it. */
int dcast_fsync_dir(const char *dir);

/* fsync the directory that holds path (the text before its last '/'). */
int dcast_fsync_parent(const char *path);

/* mkdir dir (0755) unless it exists.  Returns 0, or DCAST_EIO naming it. */
int dcast_mkdir(const char *dir);

#endif
