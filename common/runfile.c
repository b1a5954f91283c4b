/* The run identity file (dcast_runfile.h): one checked line, replaced
 * atomically. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include "dcast_common.h"
#include "dcast_runfile.h"

#define RUNFILE_TAG "deltacast-run"
#define RUNFILE_LEN (sizeof(RUNFILE_TAG) + 16 + 1 + 8 + 1) /* "tag ", hex, " ", check, "\n" */

static uint32_t run_check(const char *hex16)
{
	return XXH32(hex16, 16, 0);
}

static int format_run(uint64_t run, char *out, size_t cap)
{
	char hex[17];

	snprintf(hex, sizeof(hex), "%016" PRIx64, run);
	return snprintf(out, cap, RUNFILE_TAG " %s %08" PRIx32 "\n", hex, run_check(hex));
}

/* `run` into path.tmp, fsynced when `durable`, renamed over `path`. */
static int runfile_put(const char *path, uint64_t run, int durable)
{
	char tmp[4200], line[64];
	int n = format_run(run, line, sizeof(line));
	FILE *f;

	if (!run)
		return dcast_fail(DCAST_EINVAL, "%s: run 0 is not a run", path);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	if (!(f = fopen(tmp, "w")))
		return dcast_fail(DCAST_EIO, "%s: create: %s", tmp, strerror(errno));
	if (fwrite(line, 1, (size_t)n, f) != (size_t)n || fflush(f) || (durable && fsync(fileno(f)))) {
		int e = errno;

		fclose(f);
		unlink(tmp);
		return dcast_fail(DCAST_EIO, "%s: write: %s", tmp, strerror(e));
	}
	if (fclose(f) || rename(tmp, path)) {
		int e = errno;

		unlink(tmp);
		return dcast_fail(DCAST_EIO, "%s: rename over %s: %s", tmp, path, strerror(e));
	}
	return 0;
}

int dcast_runfile_save(const char *path, uint64_t run)
{
	return runfile_put(path, run, 1);
}

int dcast_runfile_write(const char *path, uint64_t run)
{
	return runfile_put(path, run, 0);
}

int dcast_runfile_sync(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), e;

	if (fd < 0)
		return dcast_fail(DCAST_EIO, "%s: open: %s", path, strerror(errno));
	e = fsync(fd) ? errno : 0;
	close(fd);
	return e ? dcast_fail(DCAST_EIO, "%s: fsync: %s", path, strerror(e)) : 0;
}

/* Parse one line read from `path`: the tag, 16 hex digits, their check. */
static int parse_run(const char *path, const char *line, size_t len, uint64_t *run)
{
	char hex[17], expect[RUNFILE_LEN + 1];
	uint64_t v;

	if (len != RUNFILE_LEN || line[len - 1] != '\n' || strncmp(line, RUNFILE_TAG " ", sizeof(RUNFILE_TAG)))
		return dcast_fail(DCAST_ECORRUPT, "%s: not a run file (%zu bytes)", path, len);
	memcpy(hex, line + sizeof(RUNFILE_TAG), 16);
	hex[16] = 0;
	if (sscanf(hex, "%16" SCNx64, &v) != 1 || !v)
		return dcast_fail(DCAST_ECORRUPT, "%s: run '%s' is not a non-zero hex number", path, hex);
	format_run(v, expect, sizeof(expect));
	if (strlen(expect) != len || memcmp(expect, line, len))
		return dcast_fail(DCAST_ECORRUPT, "%s: the run's check does not match (a damaged file)", path);
	*run = v;
	return 0;
}

int dcast_runfile_load(const char *path, uint64_t *run)
{
	char line[RUNFILE_LEN + 8];
	size_t len;
	FILE *f;

	*run = 0;
	if (!(f = fopen(path, "r")))
		return dcast_fail(errno == ENOENT ? DCAST_ENOTFOUND : DCAST_EIO, "%s: %s", path, strerror(errno));
	len = fread(line, 1, sizeof(line), f);
	if (ferror(f)) {
		fclose(f);
		return dcast_fail(DCAST_EIO, "%s: read: %s", path, strerror(errno));
	}
	fclose(f);
	return parse_run(path, line, len, run);
}
