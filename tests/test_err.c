/* dcast_strerror/dcast_errname cover every code and round-trip names; a
 * detail cut at its buffer's end keeps no part of a UTF-8 sequence;
 * dcast_printable shows any bytes as printable ASCII. */
#include "check.h"
#include "dcast_common.h"

/* A detail of 1021 ASCII bytes and a 4-byte character fills the detail
 * buffer (1023 bytes and the NUL) in the middle of the character. */
static void test_cut_detail(void)
{
	char pad[1022];

	memset(pad, 'a', sizeof(pad) - 1);
	pad[sizeof(pad) - 1] = '\0';
	dcast_fail(DCAST_EINVAL, "%s\xf0\x9f\x98\x80", pad);
	CHECK(strlen(dcast_last_error()) == sizeof(pad) - 1);
	dcast_fail(DCAST_EINVAL, "%s\xc3\xa9", pad); /* 2 bytes: fits whole */
	CHECK(strlen(dcast_last_error()) == sizeof(pad) + 1);
}

static void test_printable(void)
{
	char out[DCAST_PRINTABLE_CAP(6)], small[8];

	CHECK(strcmp(dcast_printable(out, sizeof(out), "a\xff\\\"\n~", 6), "a\\xff\\x5c\\x22\\x0a~") == 0);
	CHECK(strcmp(dcast_printable(small, sizeof(small), "ab\xff\xfe", 4), "ab\\xff") == 0);
}

int main(void)
{
	for (int e = 0; e < DCAST_ERR_COUNT; e++) {
		CHECK(dcast_strerror(e)[0] != '\0');
		CHECK(dcast_err_from_name(dcast_errname(e)) == e);
	}
	CHECK(strcmp(dcast_strerror(DCAST_ERR_COUNT), "unknown error") == 0);
	CHECK(dcast_err_from_name("nope") == -1);
	test_cut_detail();
	test_printable();
	return check_done("test_err");
}
