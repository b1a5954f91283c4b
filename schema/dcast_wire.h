/* Private: sending and receiving schema messages over ZeroMQ sockets.
 * A message is [routing id (ROUTER only)] + header frame + [payload frame].
 * Receive always drains every frame of a multipart message, so a bad
 * message never leaves the socket out of step. */
#ifndef DCAST_WIRE_H
#define DCAST_WIRE_H

#include <zmq.h>
#include "deltacast/schema.h"

/* One received message.  Owns its frames: dcast_wire_in_close(). */
typedef struct dcast_wire_in {
	zmq_msg_t rid;      /* routing id, valid when has_rid */
	zmq_msg_t payload;  /* always a valid message: empty (size 0) unless has_payload,
			       so zmq_msg_data/zmq_msg_size never meet an uninitialised one */
	int has_rid, has_payload;
	dcast_msg msg;      /* decoded header (valid only when recv returned 0) */
	char user_id[64];   /* router: the ZAP user id of the sender (CURVE), "" if none */
} dcast_wire_in;

/* Set the options every deltacast socket uses: ZMQ_MAXMSGSIZE from the
 * schema limits, linger, and reconnect intervals. */
int dcast_wire_socket_opts(void *sock);

/* Encode `m` and send it, after a routing id frame when rid != NULL.
 * `payload` (may be NULL) is sent as frame 1 and, on success, consumed
 * (zmq_msg_send semantics; the caller's zmq_msg_t is left empty).  flags:
 * ZMQ_DONTWAIT or 0.  Errors: encode errors, DCAST_EBUSY (would block with
 * ZMQ_DONTWAIT), DCAST_EZMQ. */
int dcast_wire_send(void *sock, const void *rid, size_t rid_len, const dcast_msg *m,
		    zmq_msg_t *payload, int flags);

/* Receive one message.  router: the socket prefixes a routing id.  On 0 the
 * caller owns `in` (header decoded, payload size checked against it).  On a
 * decode error `in->has_rid` and the rid stay valid so the caller can send an
 * ERROR back; the caller must still call dcast_wire_in_close().  Errors:
 * DCAST_EBUSY (nothing to read with ZMQ_DONTWAIT), DCAST_EZMQ, DCAST_EMALFORMED
 * (frame count), every dcast_msg_decode error, DCAST_EPAYLOAD_SIZE. */
int dcast_wire_recv(void *sock, int router, dcast_wire_in *in, int flags);

/* Release the frames and decoded header of `in` (payload left empty and
 * valid).  Idempotent. */
void dcast_wire_in_close(dcast_wire_in *in);

/* Send an ERROR(code, text) to a peer; best effort, never blocks. */
void dcast_wire_send_error(void *sock, const void *rid, size_t rid_len, int code,
			   const char *model, uint64_t version, const char *text);

#endif
