/* deltacast publish: publish safetensors checkpoints through a broker with
 * the producer library, each file as the next version (the first as an
 * anchor, later ones as deltas), waiting for each acknowledgement.  Shows
 * bytes, density and chunks per version: one updating line on a terminal,
 * one line per version otherwise. */
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "deltacast/producer.h"

#define CMD "publish"

static const char usage_text[] =
	"usage: deltacast publish --broker ENDPOINT --model NAME [--first-version V]\n"
	"                         [--range-elems N] [--timeout-ms MS] FILE.safetensors...\n"
	"Publishes each FILE as the next version of NAME (from V, default 1): the\n"
	"first as an anchor, the rest as deltas against the previous one.  Every file\n"
	"must hold the same tensors (names, dtypes, shapes).  Waits for the broker's\n"
	"acknowledgement of each version.  Per version it reports:\n"
	"  version V anchor|delta bytes B of M (R%) changed C (D%) chunks S/T ms T\n";

typedef struct pub_args {
	const char *broker, *model;
	uint64_t first, range_elems;
	int timeout_ms;
	char **files;
	int n_files;
} pub_args;

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;

	if (!*s || *s == '-')
		return -1;
	*out = strtoull(s, &end, 10);
	return *end ? -1 : 0;
}

static int parse(int argc, char **argv, pub_args *a)
{
	static const struct option opts[] = {
		{"broker", required_argument, 0, 'b'},      {"model", required_argument, 0, 'm'},
		{"first-version", required_argument, 0, 'v'}, {"range-elems", required_argument, 0, 'r'},
		{"timeout-ms", required_argument, 0, 't'},  {"help", no_argument, 0, 'h'},
		{0, 0, 0, 0}};
	uint64_t t = 60000;
	int o;

	*a = (pub_args){.first = 1, .range_elems = 1u << 20};
	optind = 1;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (o == 'h') {
			fputs(usage_text, stdout);
			exit(CLI_OK);
		}
		if (o == '?')
			return cli_usage_error(CMD, "unknown option");
		if (o == 'b')
			a->broker = optarg;
		else if (o == 'm')
			a->model = optarg;
		else if (parse_u64(optarg, o == 'v' ? &a->first : o == 'r' ? &a->range_elems : &t))
			return cli_usage_error(CMD, "--%s: \"%s\" is not a number",
					       cli_option_name(opts, o), optarg);
	}
	if (!a->broker || !a->model)
		return cli_usage_error(CMD, "--broker and --model are required");
	if (optind >= argc)
		return cli_usage_error(CMD, "no FILE.safetensors given");
	if (t == 0 || t > 3600000)
		return cli_usage_error(CMD, "--timeout-ms: %" PRIu64 " outside [1, 3600000]", t);
	a->timeout_ms = (int)t;
	a->files = argv + optind;
	a->n_files = argc - optind;
	return CLI_OK;
}

static int codec_dtype(const dcast_st_tensor *t, const char *path)
{
	int d = dcast_dtype_from_name(dcast_st_dtype_name(t->dtype));

	if (d < 0)
		return -cli_fail(DCAST_EDTYPE, "%s: tensor %s is %s, a dtype the codec cannot take",
				   path, t->name, dcast_st_dtype_name(t->dtype));
	return d;
}

/* Point the producer at file f's tensors: the first file registers them,
 * later ones must hold the same set (the library checks dtype and shape). */
static int register_file(dcast_producer *p, dcast_st_file *f, const char *path, size_t want)
{
	size_t n = dcast_st_count(f);

	if (want && n != want)
		return cli_fail(DCAST_ESHAPE, "%s has %zu tensors, the first file %zu", path, n,
				  want);
	for (size_t i = 0; i < n; i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(f, i);
		int d = codec_dtype(t, path), rc;

		if (d < 0)
			return -d;
		rc = dcast_producer_register(p, t->name, d, t->ndim, t->shape, t->data,
					     DCAST_MEM_HOST, 0, t->count);
		if (rc == DCAST_ESTATE)
			return cli_fail(DCAST_ENOTFOUND, "%s: tensor %s is not in the first file",
					  path, t->name);
		if (rc)
			return cli_fail(rc, "%s: %s", path, dcast_last_error());
	}
	return 0;
}

static void show(const dcast_producer_stats *s, double secs, int tty, int last)
{
	double pct_b = s->model_bytes ? 100.0 * (double)s->payload_bytes / (double)s->model_bytes : 0;
	double pct_c = s->elems ? 100.0 * (double)s->changed_elems / (double)s->elems : 0;

	fprintf(stderr, "%sversion %" PRIu64 " %s bytes %" PRIu64 " of %" PRIu64 " (%.3f%%) changed %"
		PRIu64 " (%.3f%%) chunks %" PRIu64 "/%" PRIu64 " ms %.1f%s", tty ? "\r\033[K" : "",
		s->version, s->anchor ? "anchor" : "delta", s->payload_bytes, s->model_bytes, pct_b,
		s->changed_elems, pct_c, s->chunks_sent, s->chunks_total, secs * 1e3,
		tty && !last ? "" : "\n");
}

static int publish_all(dcast_producer *p, const pub_args *a)
{
	dcast_st_file *prev = NULL, *f = NULL;
	int tty = isatty(2), rc = 0;
	size_t n_tensors = 0;

	for (int i = 0; i < a->n_files && !rc; i++) {
		uint64_t v = a->first + (uint64_t)i;
		dcast_producer_stats s;
		double t0 = cli_now_s();

		if ((rc = dcast_st_open(a->files[i], &f)) ||
		    (rc = register_file(p, f, a->files[i], n_tensors)) ||
		    (rc = dcast_producer_publish(p, v)) ||
		    (rc = dcast_producer_wait(p, v, a->timeout_ms)))
			break;
		n_tensors = dcast_st_count(f);
		dcast_st_close(&prev); /* the producer now points into f */
		prev = f;
		f = NULL;
		dcast_producer_stats_get(p, &s);
		show(&s, cli_now_s() - t0, tty, i + 1 == a->n_files);
	}
	dcast_st_close(&f);
	dcast_st_close(&prev);
	return rc;
}

int cmd_publish(int argc, char **argv)
{
	dcast_producer_opts o;
	dcast_producer *p = NULL;
	pub_args a;
	int rc = parse(argc, argv, &a);

	if (rc)
		return rc;
	dcast_producer_opts_init(&o);
	o.range_elems = a.range_elems;
	o.client = "deltacast-publish";
	if ((rc = dcast_producer_open(a.broker, a.model, 0, 1, &o, &p)) ||
	    (rc = publish_all(p, &a))) {
		int r = cli_report(CMD, rc);
		dcast_producer_close(&p);
		return r;
	}
	dcast_producer_close(&p);
	return CLI_OK;
}
