/* What older builds wrote, for tests that load it: a MANIFEST header from
 * before MANIFESTs carried "sum".  Compiled once, in
 * tests/support/old_format.c. */
#ifndef DCAST_TEST_OLD_FORMAT_H
#define DCAST_TEST_OLD_FORMAT_H

#include <stddef.h>

/* The msgpack header hdr[0..len) with its top-level key "sum" (and its
 * value) left out, in *out (malloc'd, the caller frees), *out_len its
 * length.  Returns 0, or -1 when hdr is not a msgpack map holding "sum". */
int old_without_sum(const void *hdr, size_t len, void **out, size_t *out_len);

#endif
