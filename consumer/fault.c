/* Test fault injection, DELTACAST_CONSUMER_FAULT=KIND:V (tests only; off
 * unless the variable is set when the consumer opens).  It acts at these
 * seams and nowhere else: where a broker message enters the version state
 * machine (cs_fault_wire, session.c) and, for a bulk connection's frame,
 * just after (cs_fault_bulk_cut, session.c), where apply starts a version
 * (cs_fault_apply, apply.c) and where a fold from the disk or an anchor
 * file's seal starts (cs_fault_fold, store/fold.c and store/anchor_new.c) or a
 * fold's piece is done (cs_fault_fold_piece, store/fold.c), plus one
 * question the check ahead asks
 * (cs_fault_holds_ahead, verify.c).  Each seam costs one compare when no
 * fault is armed; the handlers, the apply loop and the digest code do not
 * know faults exist.  Kinds, each for version V:
 *   corrupt    one bit of V's first CHUNK payload flipped on the way in
 *   skip       V's CHUNKs and COMMIT dropped, as if lost (credit not returned)
 *   dup        every CHUNK of V delivered twice
 *   predigest  V's COMMIT arrives with its first digest wrong
 *   digest     V's first digest made wrong when its apply starts, and V
 *              not checked ahead, so the check at apply and its undo run
 *   aheadfail  V, checked ahead, has its apply refused at the first chunk
 *              in its second half that writes, so apply undoes halfway
 *   foldhold   (V is a file descriptor) each fold from the disk, and each
 *              seal of an anchor file, first reads one byte from V: the
 *              test holds it there, and applies or damages files
 *              meanwhile, until it writes one
 *   foldpiece  (V is a file descriptor) each piece of a fold from the
 *              disk, once durable in the new file and before it is
 *              punched out of the anchor file, first reads one byte from
 *              V (end of file: no more holds): the test measures the
 *              directory there, or kills the process
 *   cut        V's first CHUNK taken, its later CHUNKs and its COMMIT
 *              dropped (credit not returned): V stays half received
 *   bulk_cut   the bulk connection bringing V cut after its first CHUNK
 *              frame was delivered, as if the broker's side had closed
 *              it: the transfer fails, and V comes over ZeroMQ
 *   filewrite  V, an anchor taken in place, has the first write of its
 *              file that completes after its COMMIT fail (an I/O error
 *              in place of the kernel's result): its checkpoint is lost,
 *              the version is not (cs_fault_file_write, store/ckpt.c) */
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include "consumer_impl.h"
#include "dcast_common.h"
#include "dcast_wire.h"

void cs_fault_parse(dcast_consumer *c)
{
	static const char *kinds[CS_FAULT_KINDS] = {"", "corrupt:", "skip:", "digest:", "dup:",
						    "predigest:", "aheadfail:", "foldhold:", "cut:", "foldpiece:",
						    "bulk_cut:", "filewrite:"};
	const char *f = getenv("DELTACAST_CONSUMER_FAULT");

	c->fault.kind = CS_FAULT_NONE;
	for (int k = 1; f && k < CS_FAULT_KINDS; k++)
		if (!strncmp(f, kinds[k], strlen(kinds[k]))) {
			c->fault.kind = k;
			c->fault.version = strtoull(f + strlen(kinds[k]), NULL, 10);
			DCAST_LOG_W("consumer: test fault %s armed", f);
		}
}

/* The armed fault, if it is `kind` for `version`. */
static int armed(const dcast_consumer *c, int kind, uint64_t version)
{
	return c->fault.kind == kind && c->fault.version == version;
}

static void disarm(dcast_consumer *c)
{
	c->fault.kind = CS_FAULT_NONE;
}

static int wire_chunk(dcast_consumer *c, dcast_wire_in *in)
{
	uint64_t v = in->msg.u.chunk.version;
	size_t n = zmq_msg_size(&in->payload);

	if (armed(c, CS_FAULT_CORRUPT, v) && n) {
		disarm(c);
		((unsigned char *)zmq_msg_data(&in->payload))[n / 2] ^= 0x10;
	}
	if (armed(c, CS_FAULT_CUT, v))
		return c->fault.taken++ ? 0 : 1;
	return armed(c, CS_FAULT_SKIP, v) ? 0 : armed(c, CS_FAULT_DUP, v) ? 2 : 1;
}

static int wire_commit(dcast_consumer *c, dcast_commit *m)
{
	if (armed(c, CS_FAULT_PREDIGEST, m->version) && m->n_digests) {
		disarm(c);
		m->digests[0].digest ^= 1;
	}
	if (armed(c, CS_FAULT_CUT, m->version))
		return 0;
	if (!armed(c, CS_FAULT_SKIP, m->version))
		return 1;
	disarm(c);
	return 0;
}

int cs_fault_wire(dcast_consumer *c, dcast_wire_in *in)
{
	if (c->fault.kind == CS_FAULT_NONE)
		return 1;
	if (in->msg.type == DCAST_MSG_CHUNK)
		return wire_chunk(c, in);
	return in->msg.type == DCAST_MSG_COMMIT ? wire_commit(c, &in->msg.u.commit) : 1;
}

int cs_fault_bulk_cut(dcast_consumer *c, const dcast_wire_in *in)
{
	if (in->msg.type != DCAST_MSG_CHUNK || !armed(c, CS_FAULT_BULK_CUT, in->msg.u.chunk.version))
		return 0;
	disarm(c);
	return 1;
}

int cs_fault_file_write(dcast_consumer *c, uint64_t version)
{
	if (!armed(c, CS_FAULT_FILE_WRITE, version))
		return 0;
	disarm(c);
	return 1;
}

int cs_fault_holds_ahead(const dcast_consumer *c, const cs_version *v)
{
	return armed(c, CS_FAULT_DIGEST, v->version);
}

uint32_t cs_fault_apply(dcast_consumer *c, cs_version *v, int ahead)
{
	if (c->fault.kind == CS_FAULT_NONE)
		return UINT32_MAX;
	if (armed(c, CS_FAULT_DIGEST, v->version) && v->commit.n_digests) {
		disarm(c);
		v->commit.digests[0].digest ^= 1;
	}
	if (!armed(c, CS_FAULT_AHEADFAIL, v->version) || !ahead)
		return UINT32_MAX;
	for (uint32_t i = v->n_chunks / 2; i < v->n_chunks; i++)
		if (cs_chunk_writes(&v->chunks[i])) {
			disarm(c);
			return i;
		}
	return UINT32_MAX;
}

void cs_fault_fold(const dcast_consumer *c)
{
	char b;

	if (c->fault.kind == CS_FAULT_FOLDHOLD && read((int)c->fault.version, &b, 1) != 1)
		DCAST_LOG_W("consumer %s: test fault foldhold: read: %s", c->model, strerror(errno));
}

void cs_fault_fold_piece(const dcast_consumer *c)
{
	char b;

	if (c->fault.kind == CS_FAULT_FOLDPIECE && read((int)c->fault.version, &b, 1) < 0)
		DCAST_LOG_W("consumer %s: test fault foldpiece: read: %s", c->model, strerror(errno));
}
