/* Schema messages over ZeroMQ: multipart framing, strict receive. */
#include <errno.h>
#include <string.h>
#include "dcast_common.h"
#include "dcast_wire.h"

int dcast_wire_socket_opts(void *sock)
{
	int64_t max = (int64_t)DCAST_MAX_FRAME_BYTES + 4096;
	int linger = 0, ivl = 100, ivl_max = 2000;

	if (zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &max, sizeof(max)) ||
	    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger)) ||
	    zmq_setsockopt(sock, ZMQ_RECONNECT_IVL, &ivl, sizeof(ivl)) ||
	    zmq_setsockopt(sock, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof(ivl_max)))
		return dcast_fail(DCAST_EZMQ, "zmq_setsockopt: %s", zmq_strerror(errno));
	return 0;
}

static void free_buf(void *data, void *hint)
{
	(void)hint;
	free(data);
}

static int zmq_err(const char *what)
{
	if (errno == EAGAIN)
		return dcast_fail(DCAST_EBUSY, "%s: would block", what);
	return dcast_fail(DCAST_EZMQ, "%s: %s", what, zmq_strerror(errno));
}

static int send_header(void *sock, const dcast_msg *m, int more, int flags)
{
	zmq_msg_t hdr;
	void *buf;
	size_t len;
	int rc = dcast_msg_encode(m, &buf, &len);

	if (rc)
		return rc;
	if (zmq_msg_init_data(&hdr, buf, len, free_buf, NULL)) {
		free(buf);
		return zmq_err("zmq_msg_init_data");
	}
	if (zmq_msg_send(&hdr, sock, flags | (more ? ZMQ_SNDMORE : 0)) < 0) {
		zmq_msg_close(&hdr);
		return zmq_err("send header");
	}
	return 0;
}

int dcast_wire_send(void *sock, const void *rid, size_t rid_len, const dcast_msg *m,
		    zmq_msg_t *payload, int flags)
{
	int rc;

	if (rid && zmq_send(sock, rid, rid_len, flags | ZMQ_SNDMORE) < 0)
		return zmq_err("send routing id");
	if ((rc = send_header(sock, m, payload != NULL, flags)))
		return rc;
	if (payload && zmq_msg_send(payload, sock, flags) < 0)
		return zmq_err("send payload");
	return 0;
}

static int more(void *sock)
{
	int m = 0;
	size_t sz = sizeof(m);

	zmq_getsockopt(sock, ZMQ_RCVMORE, &m, &sz);
	return m;
}

/* Drain what is left of a multipart message after an error. */
static void drain(void *sock)
{
	zmq_msg_t junk;

	while (more(sock)) {
		zmq_msg_init(&junk);
		zmq_msg_recv(&junk, sock, 0);
		zmq_msg_close(&junk);
	}
}

static int recv_frame(void *sock, zmq_msg_t *f, int flags)
{
	zmq_msg_init(f);
	if (zmq_msg_recv(f, sock, flags) < 0) {
		int rc = zmq_err("recv");
		zmq_msg_close(f);
		zmq_msg_init(f); /* left empty and valid */
		return rc;
	}
	return 0;
}

/* After the header frame: at most one payload frame, then decode. */
static int recv_body(void *sock, dcast_wire_in *in, zmq_msg_t *hdr)
{
	int rc = 0;

	if (more(sock) && !(rc = recv_frame(sock, &in->payload, 0)))
		in->has_payload = 1;
	if (!rc && more(sock)) {
		drain(sock);
		rc = dcast_fail(DCAST_EMALFORMED, "message: more than header + payload frames");
	}
	if (!rc)
		rc = dcast_msg_decode(zmq_msg_data(hdr), zmq_msg_size(hdr), &in->msg);
	zmq_msg_close(hdr);
	if (rc)
		return rc;
	return dcast_msg_check_payload(&in->msg, in->has_payload ? zmq_msg_size(&in->payload) : 0);
}

/* The ZAP user id rides on the frames after the routing id (libzmq 4.3
 * sets no metadata on the routing id frame itself). */
static void user_id_copy(dcast_wire_in *in, zmq_msg_t *hdr)
{
	const char *uid = zmq_msg_gets(hdr, "User-Id");

	if (uid)
		snprintf(in->user_id, sizeof(in->user_id), "%s", uid);
}

int dcast_wire_recv(void *sock, int router, dcast_wire_in *in, int flags)
{
	zmq_msg_t hdr;
	int rc;

	memset(in, 0, sizeof(*in));
	zmq_msg_init(&in->payload); /* empty until a payload frame arrives, never invalid */
	if ((rc = recv_frame(sock, router ? &in->rid : &hdr, flags)))
		return rc;
	if (router) {
		in->has_rid = 1;
		if (!more(sock))
			return dcast_fail(DCAST_EMALFORMED, "message: routing id without header frame");
		if ((rc = recv_frame(sock, &hdr, 0)))
			return rc;
		user_id_copy(in, &hdr);
	}
	return recv_body(sock, in, &hdr);
}

void dcast_wire_in_close(dcast_wire_in *in)
{
	if (in->has_rid)
		zmq_msg_close(&in->rid);
	zmq_msg_close(&in->payload);
	zmq_msg_init(&in->payload);
	in->has_rid = in->has_payload = 0;
	dcast_msg_free(&in->msg);
}

void dcast_wire_send_error(void *sock, const void *rid, size_t rid_len, int code,
			   const char *model, uint64_t version, const char *text)
{
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_ERROR);
	m.u.error.code = code > 0 && code <= DCAST_MAX_CODE ? (uint32_t)code : DCAST_EINVAL;
	snprintf(m.u.error.text, sizeof(m.u.error.text), "%s", text ? text : "");
	snprintf(m.u.error.model, sizeof(m.u.error.model), "%s", model ? model : "");
	m.u.error.version = version;
	dcast_wire_send(sock, rid, rid_len, &m, NULL, ZMQ_DONTWAIT);
}
