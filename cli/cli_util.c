/* Helpers shared by the deltacast subcommands: error reports, number
 * parsing, clock, matched checkpoint pairs, atomically committed outputs. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static _Thread_local char cli_detail[1024];
static _Thread_local int cli_detail_err;

int cli_fail(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cli_detail, sizeof(cli_detail), fmt, ap);
	va_end(ap);
	cli_detail_err = err;
	return err;
}

int cli_report(const char *cmd, int err)
{
	const char *detail = err == cli_detail_err && cli_detail[0] ? cli_detail : dcast_last_error();

	fprintf(stderr, "deltacast %s: %s: %s\n", cmd, dcast_strerror(err), detail);
	cli_detail[0] = '\0';
	cli_detail_err = 0;
	return CLI_FAILED;
}

int cli_pwrite_all(int fd, const void *buf, size_t len, uint64_t off, const char *label)
{
	const char *p = buf;

	while (len) {
		size_t n = len < (1u << 30) ? len : (1u << 30);
		ssize_t w = pwrite(fd, p, n, (off_t)off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return cli_fail(DCAST_EIO, "%s: write at offset %llu: %s", label,
					(unsigned long long)off, w < 0 ? strerror(errno) : "no progress");
		p += w;
		len -= (size_t)w;
		off += (uint64_t)w;
	}
	return 0;
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "deltacast %s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "; see deltacast %s --help\n", cmd);
	return CLI_USAGE;
}

const char *cli_option_name(const struct option *longopts, int val)
{
	for (; longopts->name; longopts++)
		if (longopts->val == val)
			return longopts->name;
	return "?";
}

int cli_parse_count(const char *s, uint64_t *out)
{
	static const char suffixes[] = "KMBGT";
	static const double scale[] = {1e3, 1e6, 1e9, 1e9, 1e12};
	char *end = NULL;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || !isfinite(v) || v <= 0)
		return -1;
	const char *hit = *end ? strchr(suffixes, *end) : NULL;
	if (hit) {
		v *= scale[hit - suffixes];
		end++;
	}
	if (*end || v >= 1e18 || v < 1)
		return -1;
	*out = (uint64_t)llround(v);
	return 0;
}

int cli_parse_double(const char *s, double lo, double hi, double *out)
{
	char *end = NULL;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

int cli_parse_timeout_ms(const char *cmd, const char *s, long *out)
{
	char *end;
	long v = strtol(s, &end, 10);

	if (!*s || *end || v < 1 || v > 600000)
		return cli_usage_error(cmd, "--timeout-ms: \"%s\" not in [1, 600000]", s);
	*out = v;
	return 0;
}

void cli_print_json_string(FILE *to, const char *s)
{
	fputc('"', to);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			fprintf(to, "\\%c", c);
		else if (c < 0x20)
			fprintf(to, "\\u%04x", c);
		else
			fputc(c, to);
	}
	fputc('"', to);
}

char *cli_concat(const char *a, const char *b, const char *c)
{
	size_t n = strlen(a) + strlen(b) + strlen(c) + 1;
	char *p = malloc(n);

	if (p)
		snprintf(p, n, "%s%s%s", a, b, c);
	return p;
}

double cli_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void cli_progress_line(const char *what, uint64_t done, uint64_t total, double frac,
		       double secs, int tty)
{
	double mib = (double)done / 1048576.0, rate = secs > 0 ? mib / secs : 0;
	char of[64] = "", eta[32] = "";

	if (total) {
		frac = (double)done / (double)total;
		snprintf(of, sizeof(of), " of %.1f MiB", (double)total / 1048576.0);
	}
	if (frac > 0 && frac <= 1 && secs > 0)
		snprintf(eta, sizeof(eta), " ETA %.0f s", secs * (1 - frac) / frac);
	if (frac >= 0 && frac <= 1)
		snprintf(of + strlen(of), sizeof(of) - strlen(of), " (%.0f%%)", 100 * frac);
	fprintf(stderr, "%s%s: %.1f MiB%s %.1f MiB/s%s%s", tty ? "\r\033[K" : "", what, mib, of,
		rate, eta, tty ? "" : "\n");
	fflush(stderr);
}

int cli_progress_wanted(int forced)
{
	return forced || isatty(2);
}

unsigned cli_codec_elem_size(const dcast_st_tensor *t)
{
	return t->elem_size == 8 ? 4 : t->elem_size;
}

static int same_layout(const dcast_st_tensor *a, const dcast_st_tensor *b)
{
	if (a->dtype != b->dtype || a->ndim != b->ndim)
		return 0;
	return memcmp(a->shape, b->shape, a->ndim * sizeof(a->shape[0])) == 0;
}

/* Fill base_of; in strict mode any difference in the tensor sets is an error. */
static int match_tensors(cli_pair *p, const char *base_path, const char *cur_path, int strict)
{
	size_t n = dcast_st_count(p->cur);
	for (size_t i = 0; i < n; i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(p->cur, i);
		const dcast_st_tensor *b = dcast_st_find(p->base, t->name);
		if (b && same_layout(b, t))
			p->base_of[i] = b;
		else if (strict)
			return cli_fail(b ? DCAST_ESHAPE : DCAST_ENOTFOUND,
					  "tensor \"%s\" of %s %s %s", t->name, cur_path,
					  b ? "has another dtype or shape in" : "is missing from",
					  base_path);
	}
	if (strict && dcast_st_count(p->base) != n)
		return cli_fail(DCAST_ESHAPE, "%s has %zu tensors, %s has %zu", base_path,
				  dcast_st_count(p->base), cur_path, n);
	return 0;
}

int cli_pair_open(const char *base_path, const char *cur_path, int strict, cli_pair *p)
{
	memset(p, 0, sizeof(*p));
	int err = dcast_st_open(base_path, &p->base);
	if (!err)
		err = dcast_st_open(cur_path, &p->cur);
	if (!err) {
		p->base_of = calloc(dcast_st_count(p->cur) + 1, sizeof(*p->base_of));
		err = p->base_of ? match_tensors(p, base_path, cur_path, strict)
				 : cli_fail(DCAST_ENOMEM, "out of memory");
	}
	if (err)
		cli_pair_close(p);
	return err;
}

void cli_pair_close(cli_pair *p)
{
	dcast_st_close(&p->base);
	dcast_st_close(&p->cur);
	free(p->base_of);
	p->base_of = NULL;
}

int cli_out_open(const char *path, cli_out *o)
{
	o->path = path;
	o->fd = -1;
	size_t n = strlen(path) + 16;
	o->tmp = malloc(n);
	if (!o->tmp)
		return cli_fail(DCAST_ENOMEM, "out of memory");
	snprintf(o->tmp, n, "%s.tmp.XXXXXX", path);
	o->fd = mkostemp(o->tmp, O_CLOEXEC);
	if (o->fd < 0) {
		int e = errno;
		free(o->tmp);
		o->tmp = NULL;
		return cli_fail(DCAST_EIO, "%s: cannot create a temporary file: %s", path, strerror(e));
	}
	return 0;
}

int cli_out_commit(cli_out *o)
{
	int err = 0;
	if (fchmod(o->fd, 0644) != 0 || fsync(o->fd) != 0)
		err = cli_fail(DCAST_EIO, "%s: fsync: %s", o->tmp, strerror(errno));
	if (close(o->fd) != 0 && !err)
		err = cli_fail(DCAST_EIO, "%s: close: %s", o->tmp, strerror(errno));
	o->fd = -1;
	if (!err && rename(o->tmp, o->path) != 0)
		err = cli_fail(DCAST_EIO, "rename %s to %s: %s", o->tmp, o->path, strerror(errno));
	if (err)
		unlink(o->tmp);
	free(o->tmp);
	o->tmp = NULL;
	return err;
}

void cli_out_abort(cli_out *o)
{
	if (o->fd >= 0)
		close(o->fd);
	if (o->tmp)
		unlink(o->tmp);
	free(o->tmp);
	o->tmp = NULL;
	o->fd = -1;
}

int cli_parse_two_in_one_out(const char *cmd, const char *usage, const char *needs, int argc,
			     char **argv, const char **out)
{
	static const struct option longopts[] = {{"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
	int c;

	*out = NULL;
	while ((c = getopt_long(argc, argv, "ho:", longopts, NULL)) != -1) {
		if (c == 'h') {
			fputs(usage, stdout);
			return CLI_OK;
		}
		if (c != 'o')
			return cli_usage_error(cmd, "bad option");
		*out = optarg;
	}
	if (argc - optind != 2 || !*out)
		return cli_usage_error(cmd, "needs %s", needs);
	return -1;
}
