/* dcast_strerror/dcast_errname cover every code and round-trip names. */
#include "check.h"

int main(void)
{
	for (int e = 0; e < DCAST_ERR_COUNT; e++) {
		CHECK(dcast_strerror(e)[0] != '\0');
		CHECK(dcast_err_from_name(dcast_errname(e)) == e);
	}
	CHECK(strcmp(dcast_strerror(DCAST_ERR_COUNT), "unknown error") == 0);
	CHECK(dcast_err_from_name("nope") == -1);
	return check_done("test_err");
}
