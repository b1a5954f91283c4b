/* Private to broker/: durable log segments under --data-dir.
 *
 * Per model a folder <data-dir>/<safe name>-<hash>/ holds append-only
 * segment files seg-<anchor version, 20 digits>.log, one per anchor: the
 * anchor, then every delta committed after it.  A segment is a file of
 * records in the durable record format the consumer's log uses too
 * (common/dcast_reclog.h, "DCR3").  Kinds: FILE (header = model name,
 * first record), MANIFEST (the encoded MANIFEST header), CHUNK (the CHUNK
 * header consumers get + its payload), COMMIT (the broker's COMMIT header;
 * closes a version), POISON (an ERROR header marking a version before it
 * poisoned).  Headers are the wire's msgpack bytes, checked by the
 * strict schema decoder again at load.
 *
 * Writes go through dcast_io (io_uring or the plain path); a version's
 * records are written, then fsynced, inside broker_seg_commit(), before the
 * caller acknowledges it.  A store is used by one thread at a time: the
 * broker loads it on its loop's thread at start-up, then hands it to its
 * durable writer thread (broker/durable.c), which alone writes.  At load
 * every record is verified, each CHUNK record against the segment's
 * MANIFEST too (dcast_chunk_fits).  Nothing that cannot be replayed is deleted: a
 * torn or corrupt tail is copied to <data-dir>/quarantine/ and the file cut
 * back to the end of the last whole committed version; a file with no whole
 * version is moved there; one error line says which model, which versions,
 * which file and where the bytes went.  A whole
 * record of another format ("DCR2", "DCR4", ...: its checksum holds, so it
 * was written that way) stops the load with DCAST_EPROTO_VERSION, naming
 * the file; nothing is cut or deleted.  Only the newest segment with an
 * intact anchor is replayed; older ones are superseded and deleted.
 * docs/operations.md, "Damaged segments". */
#ifndef DCAST_BROKER_SEGMENT_H
#define DCAST_BROKER_SEGMENT_H

#include <stddef.h>
#include <stdint.h>
#include "dcast_reclog.h"
#include "deltacast/schema.h"

enum broker_seg_kind { /* the record kinds of common/dcast_reclog.h */
	BROKER_SEG_FILE = DCAST_REC_FILE,
	BROKER_SEG_MANIFEST = DCAST_REC_MANIFEST,
	BROKER_SEG_CHUNK = DCAST_REC_CHUNK,
	BROKER_SEG_COMMIT = DCAST_REC_COMMIT,
	BROKER_SEG_POISON,   /* the broker's ERROR(DCAST_EPOISONED) naming a version
				committed before it in the segment (broker_seg_poison) */
	BROKER_SEG_LOST,     /* not a record: reported by broker_seg_load, see there */
	BROKER_SEG_TAIL,     /* not a record: the versions that follow were past the
				damage (broker_seg_load) */
};

#define BROKER_SEG_QUARANTINE "quarantine" /* <data-dir>/quarantine/: bytes set aside */

#define BROKER_SEG_MAX_MODELS 256

typedef struct broker_seg_store broker_seg_store;

/* Open (creating if needed) the store in data_dir.  Nothing is read until
 * broker_seg_load().  On success *out is the caller's (broker_seg_close).
 * Errors: DCAST_EIO (data_dir cannot be created / opened, naming it),
 * DCAST_ENOMEM, dcast_io_open's errors. */
int broker_seg_open(broker_seg_store **out, const char *data_dir);

/* Close every file, free the store, set *s to NULL.  Uncommitted records
 * are left on disk; the next load cuts them.  NULL-safe. */
void broker_seg_close(broker_seg_store **s);

/* Called by broker_seg_load for each record of each committed version in
 * order: MANIFEST, then per version its CHUNKs and its COMMIT.  r is the
 * record's prefix (kind, version, lengths, the payload's checked sum); hdr
 * (r->hdr_len bytes) and payload (r->payload_len) are valid only during the
 * call (copy what is kept).  A non-zero return stops the load and is
 * returned by it. */
typedef int (*broker_seg_visit_fn)(void *ctx, const char *model, const dcast_rec *r,
				   const void *hdr, const void *payload);

/* Read every model folder: verify each segment newest first; set aside in
 * quarantine/ what cannot be replayed (a damaged or torn tail is copied
 * there and cut off, a file with no whole version moved there; one error
 * line each), delete segments superseded by a newer intact anchor, then
 * replay the newest segment with an intact anchor through fn, and keep it
 * open for appending.  When the newest segment has whole delta versions
 * past its damage (a damaged delta's or anchor's record, the records after
 * it intact), fn then gets kind BROKER_SEG_TAIL (hdr and payload NULL) and
 * records read from the quarantine copy: the file's MANIFEST when no
 * anchor of it survived, then those versions' CHUNKs and COMMITs; they
 * build on a lost version and are not in the log or the segment.  The
 * BROKER_SEG_LOST report follows them.  When a model's folder lost anything, fn is called
 * once more after its replay (or alone, when no anchor survived) with kind
 * r->kind BROKER_SEG_LOST and r->version = the newest lost version whose COMMIT record
 * still verifies (whole on disk, so maybe acknowledged), or
 * DCAST_VERSION_NONE; hdr and payload NULL.  Errors: DCAST_EIO, DCAST_ENOMEM, DCAST_EPROTO_VERSION (a
 * segment of another format, named in the error and left untouched; models
 * loaded before it stay loaded), fn's. */
int broker_seg_load(broker_seg_store *s, broker_seg_visit_fn fn, void *ctx);

/* Start a new segment for model at anchor `version` (its FILE and MANIFEST
 * records are written before it returns; manifest_hdr is the encoded
 * MANIFEST, the caller's, free to go on return).  The previous
 * segment stays until this anchor commits.  Errors: DCAST_EIO, DCAST_ESTATE
 * (an uncommitted version is open), DCAST_EBUSY (too many models). */
int broker_seg_begin_anchor(broker_seg_store *s, const char *model, uint64_t version,
			    const void *manifest_hdr, size_t manifest_len);

/* Queue one CHUNK record of version `version`.  hdr and payload must stay
 * valid and unchanged until broker_seg_commit or broker_seg_abort returns
 * for this model; payload_sum is dcast_checksum() of the payload, which the
 * broker computed when the chunk arrived (the record stores it, and a load
 * checks the payload against it: a wrong sum loses the version).  Errors: DCAST_ESTATE (no segment: an anchor must begin
 * one first), DCAST_EINVAL (sizes over the schema limits), DCAST_EIO. */
int broker_seg_append_chunk(broker_seg_store *s, const char *model, uint64_t version,
			    const void *hdr, size_t hdr_len, const void *payload,
			    size_t payload_len, uint64_t payload_sum);

/* A CHUNK record's payload for broker_seg_put_chunk: len bytes at mem, or
 * (mem NULL) at offset off of the file fd is open on (a chunk already on
 * disk, written again into a new segment after a made anchor). */
struct broker_seg_payload {
	const void *mem;
	int fd;
	uint64_t off;
	size_t len;
	uint64_t sum;   /* dcast_checksum() of the bytes */
};

/* broker_seg_append_chunk with the payload from memory or from a file, and
 * *at set to where its bytes lie in the model's current segment (valid
 * once the version commits).  Bytes from a file are copied before it
 * returns; mem and hdr must stay as broker_seg_append_chunk says.  Errors:
 * those of broker_seg_append_chunk, DCAST_EIO (the copy, naming it). */
int broker_seg_put_chunk(broker_seg_store *s, const char *model, uint64_t version,
			 const void *hdr, size_t hdr_len, const struct broker_seg_payload *p,
			 uint64_t *at);

/* A read-only handle of the model's current segment file (its own file
 * descriptor, the caller's to close): committed payloads are read through
 * it (broker/ondisk.c), also after the file is deleted.  -1 with
 * DCAST_ESTATE (no segment) or DCAST_EIO set. */
int broker_seg_reader(broker_seg_store *s, const char *model);

/* During a broker_seg_load visit of a CHUNK record: the file it is read
 * from (*fd, valid only during the visit: dup it to keep it) and the offset
 * of its payload there. */
void broker_seg_replay_at(const broker_seg_store *s, int *fd, uint64_t *payload_off);

/* Write the COMMIT record of `version`, wait for every queued write and
 * fsync the segment: on 0 the version is durable.  When it was an anchor
 * (begun with broker_seg_begin_anchor), older segments of the model are
 * then deleted.  On error the version's records are cut off again
 * (broker_seg_abort) and the error returned: DCAST_EIO naming the file. */
int broker_seg_commit(broker_seg_store *s, const char *model, uint64_t version,
		      const void *commit_hdr, size_t commit_len);

/* Write a POISON record after the model's last committed version and
 * fsync it: `version` (committed in this segment; the record names it)
 * was found bad, and a load replays the mark after the versions (hdr:
 * the encoded ERROR(DCAST_EPOISONED) header, the caller's).  A unit of its
 * own: a torn mark is cut like a torn version.  Errors: DCAST_ESTATE (no
 * segment, or a version's records are open), DCAST_EIO naming the file
 * (the record is cut off again). */
int broker_seg_poison(broker_seg_store *s, const char *model, uint64_t version, const void *hdr,
		      size_t hdr_len);

/* Forget the queued, uncommitted records of model: wait for their writes
 * and truncate the segment back to its last commit (an anchor segment with
 * no commit is deleted and the previous one is current again). */
int broker_seg_abort(broker_seg_store *s, const char *model);

/* Delete the model's segments and its folder (a removed model: docs/
 * operations.md, "Removing models"), and forget it: a later anchor of the
 * name starts a new folder.  Uncommitted records go with it.  Files in
 * quarantine/ stay.  Errors: DCAST_EIO naming what could not be deleted
 * (the store forgets the model all the same). */
int broker_seg_drop(broker_seg_store *s, const char *model);

/* Bytes on disk of the model's current segment (0 if none); for metrics. */
uint64_t broker_seg_bytes(const broker_seg_store *s, const char *model);

/* 1 when the store's writes go through io_uring. */
int broker_seg_uses_uring(const broker_seg_store *s);

#endif
