/* Minimal assertions for deltacast's C tests: a failed CHECK prints where
 * and why and makes the test exit 1 at the end (or at once with REQUIRE). */
#ifndef DCAST_TEST_CHECK_H
#define DCAST_TEST_CHECK_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "deltacast/err.h"

/* Failed CHECKs so far: one counter for the test and the support library
 * (tests/support/proc.c) it links, whose helpers CHECK too. */
extern int check_failures;

#define CHECK(c)                                                                      \
	do {                                                                          \
		if (!(c)) {                                                           \
			fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", \
				__FILE__, __LINE__, #c, dcast_last_error());          \
			check_failures++;                                             \
		}                                                                     \
	} while (0)

#define REQUIRE(c)                                                          \
	do {                                                                \
		if (!(c)) {                                                 \
			fprintf(stderr, "%s:%d: REQUIRE failed: %s (last error: %s)\n", \
				__FILE__, __LINE__, #c, dcast_last_error()); \
			exit(1);                                            \
		}                                                           \
	} while (0)

/* Compare an error code with the expected one, naming both on mismatch. */
#define CHECK_ERR(got, want)                                                      \
	do {                                                                      \
		int g_ = (got), w_ = (want);                                      \
		if (g_ != w_) {                                                   \
			fprintf(stderr, "%s:%d: %s = %s, want %s (%s)\n", __FILE__, \
				__LINE__, #got, dcast_errname(g_), dcast_errname(w_), \
				dcast_last_error());                              \
			check_failures++;                                         \
		}                                                                 \
	} while (0)

#define TEST_SKIP(why)                                  \
	do {                                            \
		printf("skip: %s\n", why);              \
		exit(77);                               \
	} while (0)

/* Remove the test's scratch directory DIR and everything under it, checking
 * that it went.  After a failed check it is kept instead, and its path
 * printed, so that the files can be inspected. */
static inline void check_remove_dir(const char *dir)
{
	char cmd[4200];

	if (check_failures) {
		fprintf(stderr, "kept %s\n", dir);
		return;
	}
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	CHECK(system(cmd) == 0);
}

/* How many times NEEDLE occurs in the first 256 KiB of the file at PATH
 * (logs the tests read); 0 when it cannot be read. */
static inline int check_count_in_file(const char *path, const char *needle)
{
	char buf[1 << 18];
	FILE *f = fopen(path, "r");
	size_t n;
	int count = 0;

	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	for (char *p = buf; (p = strstr(p, needle)) != NULL; p++)
		count++;
	return count;
}

/* 1 when the file at PATH holds NEEDLE in its first 256 KiB. */
static inline int check_file_has(const char *path, const char *needle)
{
	return check_count_in_file(path, needle) > 0;
}

/* The whole file at PATH, malloc'd (the caller frees it), its length in
 * *n; stops the test when it cannot be read or is empty. */
static inline uint8_t *check_read_file(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	uint8_t *p;
	long len;

	REQUIRE(f && fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) > 0);
	p = malloc((size_t)len);
	rewind(f);
	REQUIRE(p && fread(p, 1, (size_t)len, f) == (size_t)len);
	fclose(f);
	*n = (size_t)len;
	return p;
}

/* Replace the file at PATH with the n bytes at p; stops the test on error. */
static inline void check_write_file(const char *path, const uint8_t *p, size_t n)
{
	FILE *f = fopen(path, "wb");

	REQUIRE(f && fwrite(p, 1, n, f) == n && fclose(f) == 0);
}

static inline int check_done(const char *name)
{
	if (check_failures) {
		fprintf(stderr, "%s: %d check(s) failed\n", name, check_failures);
		return 1;
	}
	printf("%s: ok\n", name);
	return 0;
}

/* check_done for a test whose main path did not run (no GPU here): 1 when a
 * check of what did run failed, else 77 (skipped) with the reason, so the
 * runner reports SKIP rather than a PASS that proves less than its name. */
static inline int check_skip(const char *name, const char *why)
{
	if (check_failures)
		return check_done(name);
	printf("skip: %s\n", why);
	return 77;
}

#endif
