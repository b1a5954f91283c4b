/* deltacast publish: publish safetensors checkpoints through a broker with
 * the producer library, each file (or sharded Hugging Face checkpoint,
 * cli/hf_layout.h) as the next version (the first as an anchor, later ones
 * as deltas), waiting for each acknowledgement.  Shows
 * bytes, density and chunks per version: one updating line on a terminal,
 * one line per version otherwise; and, on a terminal or with --progress,
 * the progress of the version on the wire once a second.  Through the
 * broker's consumer endpoint (--consumers, else the one the broker names
 * in its WELCOME) it takes the broker's newest version as the baseline
 * (dcast_producer_fetch_baseline), so that a new process's first version
 * goes out as a delta. */
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "deltacast/producer.h"
#include "hf_layout.h"

#define CMD "publish"

static const char usage_text[] =
	"usage: deltacast publish --broker ENDPOINT --model NAME [--first-version V]\n"
	"                         [--range-elems N] [--timeout-ms MS] [--progress]\n"
	"                         [--consumers ENDPOINT] [--no-fetch-base | --base FILE]\n"
	"                         INPUT...\n"
	"Publishes each INPUT as the next version of NAME (from V, default 1): the\n"
	"first as an anchor, the rest as deltas against the previous one.  When the\n"
	"broker holds a version of NAME, that version is fetched from the broker's\n"
	"consumer endpoint (checked by the broker's digests; its tensors must be\n"
	"INPUT's) and the first INPUT goes out as a delta on it, so that workers\n"
	"holding it download no anchor; the broker's newest version must be below\n"
	"V.  The endpoint is the one the broker names when it welcomes the\n"
	"producer (a wildcard host such as 0.0.0.0 replaced by --broker's host), or\n"
	"--consumers ENDPOINT where given (the same broker's consumer endpoint, as\n"
	"this host reaches it).  A fetch that fails fails the command, naming the\n"
	"endpoint and why; --no-fetch-base sends an anchor instead.  A broker that\n"
	"names no endpoint (an older one) gets an anchor unless --consumers is given.\n"
	"--base FILE (a .safetensors file holding the broker's newest version, e.g.\n"
	"the checkpoint published last; INPUTs plain files) is taken as that\n"
	"version instead of fetching it, once its digests equal the broker's.\n"
	"--progress prints bytes, rate and ETA of the version on the wire once a\n"
	"second (on by itself when stderr is a terminal).  An INPUT\n"
	"is a FILE.safetensors, or a sharded Hugging Face checkpoint: a directory\n"
	"holding one *.safetensors.index.json, or that index file.  A checkpoint is\n"
	"one version: every tensor of its shards, plus the tensor\n"
	"__deltacast_hf_layout__ that carries the index, the shard headers and the\n"
	"files beside the shards (config.json, tokenizer files, ...: every regular\n"
	"file there but hidden ones, *.index.json and weights such as *.bin, *.pt,\n"
	"*.gguf; 64 MiB and 1024 files at most), so that `deltacast subscribe\n"
	"--layout hf` writes the same files back.  The index\n"
	"must name every shard in the directory, each tensor in exactly one shard.\n"
	"Every INPUT must hold the same tensors (names, dtypes, shapes; a checkpoint\n"
	"the same shards); all are checked before the first is published.  Waits for\n"
	"the broker's acknowledgement of each version.  Per version it reports:\n"
	"  version V anchor|delta bytes B of M (R%) changed C (D%) chunks S/T ms T\n";

typedef struct pub_args {
	const char *broker, *model, *consumers, *base;
	uint64_t first, range_elems;
	int timeout_ms, progress, fetch;
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
		{"consumers", required_argument, 0, 'c'},   {"no-fetch-base", no_argument, 0, 'n'},
		{"progress", no_argument, 0, 'p'},          {"base", required_argument, 0, 'B'},
		{0, 0, 0, 0}};
	uint64_t t = 60000;
	int o;

	*a = (pub_args){.first = 1, .range_elems = 1u << 20, .fetch = 1};
	optind = 1;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (o == 'h') {
			fputs(usage_text, stdout);
			exit(CLI_OK);
		}
		if (o == '?')
			return cli_usage_error(CMD, "unknown option");
		if (o == 'n' || o == 'p') {
			*(o == 'n' ? &a->fetch : &a->progress) = o == 'p';
			continue;
		}
		if (o == 'b')
			a->broker = optarg;
		else if (o == 'c')
			a->consumers = optarg;
		else if (o == 'B')
			a->base = optarg;
		else if (o == 'm')
			a->model = optarg;
		else if (parse_u64(optarg, o == 'v' ? &a->first : o == 'r' ? &a->range_elems : &t))
			return cli_usage_error(CMD, "--%s: \"%s\" is not a number",
					       cli_option_name(opts, o), optarg);
	}
	if (!a->broker || !a->model)
		return cli_usage_error(CMD, "--broker and --model are required");
	if (a->base && !a->fetch)
		return cli_usage_error(CMD, "--base and --no-fetch-base exclude each other");
	if (optind < argc && a->base && hf_layout_wanted(argv[optind]))
		return cli_usage_error(CMD, "--base takes plain .safetensors INPUTs, not a layout "
				       "(%s): fetch the baseline instead", argv[optind]);
	if (optind >= argc)
		return cli_usage_error(CMD, "no INPUT (FILE.safetensors or checkpoint directory) given");
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

/* One version's input: a safetensors file, or a Hugging Face layout (its
 * shards' tensors plus the tensor that carries the layout). */
typedef struct pub_input {
	int is_hf;
	dcast_st_file *file;
	hf_layout hf;
} pub_input;

static int input_open(const char *path, pub_input *in)
{
	memset(in, 0, sizeof(*in));
	in->is_hf = hf_layout_wanted(path);
	return in->is_hf ? hf_layout_open(path, &in->hf) : dcast_st_open(path, &in->file);
}

static void input_close(pub_input *in)
{
	dcast_st_close(&in->file);
	hf_layout_close(&in->hf);
}

/* Every input must hold the tensors of the first (names, dtypes, shapes;
 * a layout: the same shards and headers), checked before anything is
 * published.  A lone file is checked when it is opened to publish. */
static int check_inputs(const pub_args *a)
{
	pub_input first, next;
	int err = 0;

	if (!hf_layout_wanted(a->files[0]))
		for (int i = 1; i < a->n_files && !err; i++) {
			cli_pair pair;
			if (hf_layout_wanted(a->files[i]))
				return cli_fail(DCAST_EINVAL, "%s is a layout, %s a file: publish them in "
						"separate runs", a->files[i], a->files[0]);
			if (!(err = cli_pair_open(a->files[0], a->files[i], 1, &pair)))
				cli_pair_close(&pair);
		}
	else if (!(err = input_open(a->files[0], &first))) {
		for (int i = 1; i < a->n_files && !err; i++) {
			if (!hf_layout_wanted(a->files[i]))
				err = cli_fail(DCAST_EINVAL, "%s is a file, %s a layout: publish them in "
					       "separate runs", a->files[i], a->files[0]);
			else if (!(err = input_open(a->files[i], &next)) &&
				 (next.hf.record_len != first.hf.record_len ||
				  memcmp(next.hf.record, first.hf.record, first.hf.record_len) != 0))
				err = cli_fail(DCAST_ESHAPE, "%s: its layout (index, shard names, tensor "
					       "headers or the files beside the shards) differs from %s's; "
					       "every version must keep the first one's", a->files[i], a->files[0]);
			input_close(&next);
		}
		input_close(&first);
	}
	return err;
}

/* Point the producer at the input's tensors: the first version registers
 * them, later ones move the same names to new memory. */
static int register_input(dcast_producer *p, const pub_input *in, const char *path)
{
	size_t n = in->is_hf ? in->hf.n_tensors : dcast_st_count(in->file);
	uint64_t rec_len = in->hf.record_len;
	int rc = 0;

	for (size_t i = 0; i < n && !rc; i++) {
		const dcast_st_tensor *t = in->is_hf ? hf_layout_tensor_at(&in->hf, i)
						     : dcast_st_tensor_at(in->file, i);
		int d = codec_dtype(t, path);

		if (d < 0)
			return -d;
		rc = dcast_producer_register(p, t->name, d, t->ndim, t->shape, t->data,
					     DCAST_MEM_HOST, 0, t->count);
	}
	if (!rc && in->is_hf)
		rc = dcast_producer_register(p, HF_LAYOUT_TENSOR, DCAST_DTYPE_U8, 1, &rec_len,
					     in->hf.record, DCAST_MEM_HOST, 0, rec_len);
	return rc ? cli_fail(rc, "%s: %s", path, dcast_last_error()) : 0;
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

/* --base FILE: the caller's copy of the broker's newest version, checked
 * against its digests (tensors matched to the first INPUT's by name). */
static int adopt_base(dcast_producer *p, const pub_args *a, const char *endpoint)
{
	cli_pair pair;
	const void **bases;
	size_t n;
	int rc;

	if ((rc = cli_pair_open(a->base, a->files[0], 1, &pair)))
		return rc;
	n = dcast_st_count(pair.cur);
	if (!(bases = calloc(n + 1, sizeof(*bases)))) {
		cli_pair_close(&pair);
		return cli_fail(DCAST_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < n; i++)
		bases[i] = pair.base_of[i]->data;
	rc = dcast_producer_adopt_baseline(p, endpoint, bases, (uint32_t)n, a->timeout_ms);
	free(bases);
	cli_pair_close(&pair);
	if (rc)
		return cli_fail(rc, "--base %s: %s", a->base, dcast_last_error());
	fprintf(stderr, "baseline %s taken as the broker's newest version, its digests equal\n",
		a->base);
	return 0;
}

/* The consumer endpoint the baseline comes from: --consumers, else the
 * one the broker named (into named[cap]); NULL when neither. */
static const char *base_endpoint(dcast_producer *p, const pub_args *a, char *named, size_t cap)
{
	dcast_producer_stats s;

	if (a->consumers)
		return a->consumers;
	if (!dcast_producer_consumer_endpoint(p, named, cap))
		return named;
	dcast_producer_stats_get(p, &s);
	if (s.broker_version != DCAST_VERSION_NONE)
		fprintf(stderr, "the broker holds version %" PRIu64 " of %s but names no consumer "
			"endpoint: version %" PRIu64 " goes as an anchor (--consumers ENDPOINT would "
			"send it as a delta on %" PRIu64 ")\n", s.broker_version, a->model, a->first,
			s.broker_version);
	return NULL;
}

/* The first version's baseline: the caller's (--base), or the broker's
 * newest version fetched through its consumer endpoint, unless
 * --no-fetch-base. */
static int first_base(dcast_producer *p, const pub_args *a)
{
	char named[512];
	const char *ep, *via = a->consumers ? "--consumers" : "the broker's consumer endpoint";
	dcast_producer_stats s;
	int rc;

	if (!a->fetch)
		return 0;
	if (!(ep = base_endpoint(p, a, named, sizeof(named))))
		return a->base ? cli_fail(DCAST_ENOTFOUND, "--base %s: the broker names no consumer "
					  "endpoint to check it against: give --consumers", a->base) : 0;
	if (a->base)
		return adopt_base(p, a, ep);
	if ((rc = dcast_producer_fetch_baseline(p, ep, NULL, a->timeout_ms)))
		return cli_fail(rc, "%s %s: %s (--no-fetch-base sends an anchor instead)", via, ep,
				dcast_last_error());
	dcast_producer_stats_get(p, &s);
	if (s.baseline_version != DCAST_VERSION_NONE)
		fprintf(stderr, "baseline version %" PRIu64 " fetched from %s, checked by its digests\n",
			s.baseline_version, ep);
	return 0;
}

static int publish_all(dcast_producer *p, const pub_args *a)
{
	pub_input prev = {0}, in = {0};
	int tty = isatty(2), rc = 0;

	for (int i = 0; i < a->n_files && !rc; i++) {
		uint64_t v = a->first + (uint64_t)i;
		dcast_producer_stats s;
		double t0 = cli_now_s();

		if ((rc = input_open(a->files[i], &in)) ||
		    (rc = register_input(p, &in, a->files[i])) || (i == 0 && (rc = first_base(p, a))) ||
		    (rc = dcast_producer_publish(p, v)) ||
		    (rc = dcast_producer_wait(p, v, a->timeout_ms)))
			break;
		input_close(&prev); /* the producer now points into in */
		prev = in;
		memset(&in, 0, sizeof(in));
		dcast_producer_stats_get(p, &s);
		show(&s, cli_now_s() - t0, tty, i + 1 == a->n_files);
	}
	input_close(&in);
	input_close(&prev);
	return rc;
}

/* Progress of the version on the wire (the bytes the broker has taken),
 * read from a thread of its own while publish() and wait() run: a line
 * when a version starts, then at most one a second. */
typedef struct pub_watch {
	dcast_producer *p;
	pthread_t thread;
	int running, tty, stop;
} pub_watch;

static void watch_show(const dcast_producer_progress *pr, int tty)
{
	char what[64];
	uint64_t total = pr->anchor ? pr->bytes_total : 0;
	double frac = -1;

	if (!pr->anchor && pr->ranges_done == pr->ranges_total)
		total = pr->bytes_sent; /* every range diffed: the delta's size is known */
	else if (!pr->anchor && pr->ranges_total)
		frac = (double)pr->ranges_done / (double)pr->ranges_total;
	snprintf(what, sizeof(what), "publish version %" PRIu64 " %s", pr->version,
		 pr->anchor ? "anchor" : "delta");
	cli_progress_line(what, pr->bytes_taken, total, frac, (double)pr->elapsed_ms / 1e3, tty);
}

static void *watch_run(void *arg)
{
	pub_watch *w = arg;
	uint64_t shown = DCAST_VERSION_NONE;
	double last = 0;
	struct timespec tick = {0, 100 * 1000000L};

	while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) {
		dcast_producer_progress pr;
		double now = cli_now_s();

		dcast_producer_progress_get(w->p, &pr);
		if (pr.active && (pr.version != shown || now - last >= 1.0)) {
			watch_show(&pr, w->tty);
			shown = pr.version;
			last = now;
		}
		nanosleep(&tick, NULL);
	}
	return NULL;
}

static void watch_start(pub_watch *w, dcast_producer *p, const pub_args *a)
{
	*w = (pub_watch){.p = p, .tty = isatty(2)};
	if (!cli_progress_wanted(a->progress))
		return;
	fprintf(stderr, "joined %s as producer of %s\n", a->broker, a->model);
	w->running = !pthread_create(&w->thread, NULL, watch_run, w);
}

static void watch_stop(pub_watch *w)
{
	if (!w->running)
		return;
	__atomic_store_n(&w->stop, 1, __ATOMIC_RELEASE);
	pthread_join(w->thread, NULL);
	w->running = 0;
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
	pub_watch w = {0};

	if (!(rc = check_inputs(&a)) && !(rc = dcast_producer_open(a.broker, a.model, 0, 1, &o, &p))) {
		watch_start(&w, p, &a);
		rc = publish_all(p, &a);
		watch_stop(&w);
	}
	rc = rc ? cli_report(CMD, rc) : CLI_OK;
	dcast_producer_close(&p);
	return rc;
}
