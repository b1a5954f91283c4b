/* A test playing the broker to the consumer library: a ROUTER socket that
 * speaks the wire format itself (test_consumer_hostile,
 * test_consumer_bulk_frames), on the manifest of tests/chunk_fit_cases.h:
 * one BF16 tensor "w" of CFC_ELEMS elements. */
#ifndef DCAST_TEST_ROUTER_PEER_H
#define DCAST_TEST_ROUTER_PEER_H

#include <stdint.h>
#include <zmq.h>
#include "deltacast/schema.h"

/* m, and a payload frame of the len bytes at payload (copied) when len is
 * not 0, to the peer whose routing id is rid; fails the test when it
 * cannot be sent. */
void rp_send(void *router, zmq_msg_t *rid, const dcast_msg *m, const void *payload, size_t len);

/* The answer to a HELLO: WELCOME (no version yet, run 0x1234, 60 s
 * heartbeats), then the MANIFEST of `model`. */
void rp_welcome(void *router, zmq_msg_t *rid, const char *model);

/* A dense anchor of `version` of `model` holding w (CFC_ELEMS elements):
 * its one CHUNK, sealed, into *chunk; its COMMIT into *commit, which
 * points at its one digest range, written to *d. */
void rp_anchor(dcast_msg *chunk, dcast_msg *commit, dcast_range_digest *d, const char *model,
	       uint64_t version, const uint16_t *w);

#endif
