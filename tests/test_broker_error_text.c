/* ERROR texts that quote what a peer sent (an unknown key, an unknown
 * `type` or `role`, a duplicate key) show its bytes escaped: every byte
 * outside printable ASCII as \xHH.  The broker used to echo them raw, so
 * an ERROR answering bytes that are not UTF-8 was itself not UTF-8, and
 * receivers (which check every string) refused it.  Real broker process
 * over loopback; the answers are read as raw frames. */
#include "broker_harness.h"

/* HELLO headers (msgpack maps) with bytes 0xff 0xc3 0x28 where a key, the
 * type or the role goes. */
static const uint8_t bad_key[] = {0x85, 0xa5, 'p', 'r', 'o', 't', 'o', 0x02, 0xa4, 't', 'y', 'p', 'e',
	0xa5, 'H', 'E', 'L', 'L', 'O', 0xa4, 'r', 'o', 'l', 'e', 0xa8, 'p', 'r', 'o', 'd', 'u', 'c', 'e', 'r',
	0xa5, 'm', 'o', 'd', 'e', 'l', 0xa1, 'x', 0xa3, 0xff, 0xc3, 0x28, 0x00};
static const uint8_t bad_type[] = {0x82, 0xa5, 'p', 'r', 'o', 't', 'o', 0x02, 0xa4, 't', 'y', 'p', 'e',
	0xa3, 0xff, 0xc3, 0x28};
static const uint8_t bad_role[] = {0x84, 0xa5, 'p', 'r', 'o', 't', 'o', 0x02, 0xa4, 't', 'y', 'p', 'e',
	0xa5, 'H', 'E', 'L', 'L', 'O', 0xa4, 'r', 'o', 'l', 'e', 0xa3, 0xff, 0xc3, 0x28,
	0xa5, 'm', 'o', 'd', 'e', 'l', 0xa1, 'x'};
static const uint8_t dup_key[] = {0x85, 0xa5, 'p', 'r', 'o', 't', 'o', 0x02, 0xa4, 't', 'y', 'p', 'e',
	0xa5, 'H', 'E', 'L', 'L', 'O', 0xa4, 'r', 'o', 'l', 'e', 0xa8, 'p', 'r', 'o', 'd', 'u', 'c', 'e', 'r',
	0xa3, 0xff, 0xc3, 0x28, 0x00, 0xa3, 0xff, 0xc3, 0x28, 0x00};

static int printable_ascii(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
			return 0;
	return 1;
}

/* Send one header frame; the next ERROR's code, its text into text. */
static int answer(void *sock, const uint8_t *hdr, size_t len, char *text, size_t cap)
{
	dcast_wire_in in;
	int code = -1;

	REQUIRE(zmq_send(sock, hdr, len, 0) == (int)len);
	for (int i = 0; i < 50 && code < 0; i++) {
		int rc = dcast_wire_recv(sock, 0, &in, 0);
		if (rc == 0 && in.msg.type == DCAST_MSG_ERROR) {
			code = (int)in.msg.u.error.code;
			snprintf(text, cap, "%s", in.msg.u.error.text);
		} else if (rc && rc != DCAST_EBUSY && rc != DCAST_EZMQ) {
			fprintf(stderr, "an answer the schema refuses: %s\n", dcast_last_error());
			code = 0;
		}
		dcast_wire_in_close(&in);
	}
	printf("  %s: %s\n", dcast_errname(code), code > 0 ? text : "");
	return code;
}

static void check_answer(void *sock, const uint8_t *hdr, size_t len, int want, const char *quote)
{
	char text[DCAST_MAX_TEXT + 1] = "";

	CHECK_ERR(answer(sock, hdr, len, text, sizeof(text)), want);
	CHECK(printable_ascii(text, strlen(text)));
	CHECK(strstr(text, quote) != NULL);
}

int main(void)
{
	static struct h_client peer;
	tp_broker br = {0};
	char dir[] = "/tmp/dcast_test_error_text_XXXXXX";

	h_init();
	REQUIRE(mkdtemp(dir));
	snprintf(br.log, sizeof(br.log), "%s/broker.log", dir);
	REQUIRE(h_broker_start(&br) == 0);
	h_client_open(&peer, br.pport, "x");
	check_answer(peer.sock, bad_key, sizeof(bad_key), DCAST_EFIELD_UNKNOWN,
		     "HELLO: unknown field \"\\xff\\xc3(\"");
	check_answer(peer.sock, bad_type, sizeof(bad_type), DCAST_EMSG_TYPE,
		     "unknown message type \"\\xff\\xc3(\"");
	check_answer(peer.sock, bad_role, sizeof(bad_role), DCAST_EFIELD_RANGE,
		     "HELLO.role: unknown value \"\\xff\\xc3(\"");
	check_answer(peer.sock, dup_key, sizeof(dup_key), DCAST_EMALFORMED,
		     "duplicate key \"\\xff\\xc3(\"");
	CHECK(check_count_in_file(br.log, "unknown field \"\\xff\\xc3(\"") == 1);
	CHECK(check_count_in_file(br.log, "\xff") == 0); /* the log line is escaped too */
	h_client_close(&peer);
	return h_finish(&br, dir, "test_broker_error_text");
}
