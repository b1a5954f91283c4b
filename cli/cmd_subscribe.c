/* deltacast subscribe: follow a model through a broker with the consumer
 * library and keep DIR/model.safetensors equal to the newest applied
 * version (plus the delta log it writes while staging); with --layout hf
 * also the sharded Hugging Face checkpoint it was published from
 * (cli/hf_layout.h).  One line per applied version; exits 0 once --until
 * is reached. */
#include <getopt.h>
#include <inttypes.h>
#include <malloc.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "deltacast/consumer.h"
#include "hf_layout.h"

#define CMD "subscribe"

static const char usage_text[] =
	"usage: deltacast subscribe --broker ENDPOINT --model NAME --dir DIR\n"
	"                           [--until VERSION] [--budget BYTES] [--no-verify | --verify-all]\n"
	"                           [--fold-every N] [--layout hf [--layout-dir OUT]] [--progress]\n"
	"Receives versions of NAME from the broker's consumer endpoint and applies\n"
	"each one.  DIR holds model.safetensors (a folded anchor) and a log of the\n"
	"versions after it; the log is folded into model.safetensors in the\n"
	"background once it exceeds a quarter of the model, and when subscribe\n"
	"exits (at --until, SIGTERM or SIGINT) model.safetensors is the newest\n"
	"applied version.  --fold-every N also folds after every N versions (1:\n"
	"a current file after each version, at the cost of writing the whole\n"
	"model each time).  Prints, per version:\n"
	"  version V anchor|delta bytes B stage_ms S apply_ms A received R verify_bytes H log_write_bytes L\n"
	"  direct_write_bytes D bulk_versions K bulk_failures F\n"
	"(R: payload bytes received since start; H: bytes hashed to check V's\n"
	"digests; L: bytes written to DIR's record log since start, a running\n"
	"total like R; D: of L, bytes an anchor wrote to DIR with O_DIRECT; K, F: anchors taken over a bulk TCP connection to a broker\n"
	"with --bulk, and bulk transfers that failed (the anchor then came over\n"
	"ZeroMQ), since start; DELTACAST_BULK=0 asks for none).  Restarted with the same DIR it\n"
	"resumes from the last whole version there.  Exits 0 when VERSION is applied\n"
	"or on SIGTERM/SIGINT once the file is written.  Digests are checked as each\n"
	"version is applied; --verify-all recomputes them over every element of every\n"
	"version, --no-verify checks none.\n"
	"--layout hf writes the model as the sharded Hugging Face checkpoint it was\n"
	"published from (`deltacast publish DIR`): the same shard files, index and\n"
	"files beside them (config.json, tokenizer files, ...), byte for byte, plus\n"
	"deltacast.version, in OUT (default DIR/hf), after each\n"
	"applied version that no newer one is already waiting behind, and at exit.\n"
	"Each is written to OUT.deltacast-tmp and swapped in whole, so OUT always\n"
	"holds one complete version (O(model) per write: an export).  Prints\n"
	"  layout V written to OUT\n"
	"after each; a model published from plain files has no layout (exit 1).\n"
	"--progress prints the bytes received, rate and (for an anchor) ETA of the\n"
	"version arriving, on stderr once a second (on by itself when stderr is a\n"
	"terminal).\n";

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

typedef struct sub_args {
	const char *broker, *model, *dir;
	uint64_t until, budget, fold_every;
	int verify;
	int progress;           /* --progress */
	const char *layout_dir; /* --layout hf: where to write it; NULL without */
	char layout_default[4096];
	uint64_t layout_version; /* the version last written there */
} sub_args;

/* --layout hf [--layout-dir OUT]: OUT defaults to DIR/hf. */
static int parse_layout(sub_args *a, const char *layout)
{
	if (!layout && a->layout_dir)
		return cli_usage_error(CMD, "--layout-dir needs --layout hf");
	if (!layout)
		return 0;
	if (strcmp(layout, "hf") != 0)
		return cli_usage_error(CMD, "--layout: \"%s\" is not a layout (hf)", layout);
	if (!a->layout_dir) {
		snprintf(a->layout_default, sizeof(a->layout_default), "%s/hf", a->dir);
		a->layout_dir = a->layout_default;
	}
	return 0;
}

static int parse(int argc, char **argv, sub_args *a)
{
	static const struct option opts[] = {
		{"broker", required_argument, 0, 'b'}, {"model", required_argument, 0, 'm'},
		{"dir", required_argument, 0, 'd'},    {"until", required_argument, 0, 'u'},
		{"budget", required_argument, 0, 'B'}, {"no-verify", no_argument, 0, 'n'},
		{"verify-all", no_argument, 0, 'a'},   {"help", no_argument, 0, 'h'},
		{"fold-every", required_argument, 0, 'f'}, {"layout", required_argument, 0, 'l'},
		{"layout-dir", required_argument, 0, 'L'}, {"progress", no_argument, 0, 'p'},
		{0, 0, 0, 0}};
	const char *layout = NULL;
	int o;
	char *end;

	*a = (sub_args){.until = DCAST_VERSION_NONE, .budget = 64u << 20, .verify = 1,
			.layout_version = DCAST_VERSION_NONE};
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 'b': a->broker = optarg; break;
		case 'm': a->model = optarg; break;
		case 'd': a->dir = optarg; break;
		case 'n': a->verify = 0; break;
		case 'a': a->verify = 2; break;
		case 'p': a->progress = 1; break;
		case 'l': layout = optarg; break;
		case 'L': a->layout_dir = optarg; break;
		case 'u':
		case 'B':
		case 'f':
			*(o == 'u' ? &a->until : o == 'B' ? &a->budget : &a->fold_every) = strtoull(optarg, &end, 10);
			if (!*optarg || *end)
				return cli_usage_error(CMD, "--%s: \"%s\" is not an unsigned integer",
						       cli_option_name(opts, o), optarg);
			break;
		case 'h': fputs(usage_text, stdout); return -1;
		default: return cli_usage_error(CMD, "unknown option");
		}
	}
	if (!a->broker || !a->model || !a->dir)
		return cli_usage_error(CMD, "--broker, --model and --dir are required");
	return parse_layout(a, layout);
}

static void print_version(dcast_consumer *c)
{
	dcast_consumer_stats st;

	dcast_consumer_stats_get(c, &st);
	printf("version %" PRIu64 " %s bytes %" PRIu64 " stage_ms %.3f apply_ms %.3f received %" PRIu64
	       " verify_bytes %" PRIu64 " log_write_bytes %" PRIu64 " direct_write_bytes %" PRIu64
	       " bulk_versions %" PRIu64 " bulk_failures %" PRIu64 "\n",
	       st.version, st.anchor ? "anchor" : "delta", st.bytes, st.stage_ns / 1e6, st.apply_ns / 1e6,
	       st.total_bytes_received, st.verify_bytes, st.log_write_bytes, st.direct_write_bytes,
	       st.bulk_versions, st.bulk_failures);
	fflush(stdout);
}

/* --until is reached by a version of the broker's stream, not by one
 * loaded from DIR that may be an earlier run's: a version applied here
 * came from the stream, and one loaded counts once a WELCOME confirmed its
 * run (dcast_consumer_run: 0 until then, and for good from a broker that
 * names no run, which WELCOME allows). */
static int reached(dcast_consumer *c, uint64_t until, int applied_here)
{
	uint64_t v = dcast_consumer_version(c);
	return until != DCAST_VERSION_NONE && v != DCAST_VERSION_NONE && v >= until &&
	       (applied_here || dcast_consumer_run(c) != 0);
}

/* --layout hf: write the applied version's layout, unless a newer version
 * is already waiting (its apply writes that one) or it is written already. */
static int write_layout(dcast_consumer *c, sub_args *a, int at_exit)
{
	uint64_t v = dcast_consumer_version(c);
	int err;

	if (!a->layout_dir || v == DCAST_VERSION_NONE || v == a->layout_version ||
	    (!at_exit && dcast_consumer_ready_version(c) != DCAST_VERSION_NONE))
		return 0;
	if ((err = hf_layout_export(c, a->layout_dir)))
		return err;
	a->layout_version = v;
	printf("layout %" PRIu64 " written to %s\n", v, a->layout_dir);
	fflush(stdout);
	return 0;
}

/* The version arriving: bytes received since the last applied version,
 * shown at most once a second; an anchor's total is the model's bytes. */
typedef struct sub_progress {
	int on, tty;
	uint64_t from_bytes, total;
	double start_s, shown_s;
} sub_progress;

static uint64_t model_bytes(const dcast_consumer *c)
{
	uint64_t sum = 0;
	dcast_tensor_desc d;

	for (uint32_t i = 0; i < dcast_consumer_tensor_count(c); i++) {
		uint64_t n = 1;
		if (dcast_consumer_tensor_at(c, i, &d))
			continue;
		for (uint32_t k = 0; k < d.ndim; k++)
			n *= d.shape[k];
		sum += n * dcast_dtype_lanes((int)d.dtype) * dcast_dtype_size((int)d.dtype);
	}
	return sum;
}

static void progress_event(dcast_consumer *c, sub_progress *pg, const dcast_event *ev)
{
	dcast_consumer_stats st;

	if (ev->type == DCAST_EV_ANCHOR) {
		pg->total = model_bytes(c);
		return;
	}
	if (ev->type != DCAST_EV_VERSION_READY)
		return;
	dcast_consumer_stats_get(c, &st);
	pg->from_bytes = st.total_bytes_received;
	pg->total = 0;
	pg->start_s = 0;
	if (pg->on && pg->tty)
		fputs("\r\033[K", stderr);
}

static void progress_show(dcast_consumer *c, sub_progress *pg)
{
	dcast_consumer_stats st;
	double now = cli_now_s();

	if (!pg->on)
		return;
	dcast_consumer_stats_get(c, &st);
	if (st.total_bytes_received <= pg->from_bytes)
		return;
	if (!pg->start_s)
		pg->start_s = pg->shown_s = now; /* the first line a second in: a rate */
	if (now - pg->shown_s < 1.0)
		return;
	pg->shown_s = now;
	cli_progress_line("subscribe receiving", st.total_bytes_received - pg->from_bytes, pg->total,
			  -1, now - pg->start_s, pg->tty);
}

static int follow(dcast_consumer *c, sub_args *a)
{
	dcast_event ev;
	int err = 0, applied = 0;
	sub_progress pg = {.on = cli_progress_wanted(a->progress), .tty = isatty(2)};

	while (!stop && !err && !reached(c, a->until, applied)) {
		if ((err = dcast_consumer_poll(c, 200, &ev)))
			break;
		progress_event(c, &pg, &ev);
		progress_show(c, &pg);
		if (ev.type == DCAST_EV_ERROR || ev.type == DCAST_EV_GAP)
			fprintf(stderr, "deltacast subscribe: %s at version %" PRIu64 ": %s\n",
				ev.type == DCAST_EV_GAP ? "gap" : dcast_errname(ev.code), ev.version, ev.text);
		if (ev.type != DCAST_EV_VERSION_READY)
			continue;
		if (dcast_consumer_apply(c, ev.version)) {
			fprintf(stderr, "deltacast subscribe: version %" PRIu64 " refused: %s\n", ev.version,
				dcast_last_error());
			continue;
		}
		applied = 1;
		print_version(c);
		err = write_layout(c, a, 0);
	}
	return err;
}

/* Leave DIR/model.safetensors at the newest applied version. */
static int fold_on_exit(dcast_consumer *c)
{
	int err = dcast_consumer_checkpoint(c);

	if (err)
		fprintf(stderr, "deltacast subscribe: writing the checkpoint: %s\n", dcast_last_error());
	return err;
}

/* This process is ours, unlike a rollout worker that embeds the library:
 * keep freed heap memory rather than hand it back to the kernel at once,
 * and serve allocations up to 32 MiB from the heap.  ZeroMQ's I/O thread
 * allocates every CHUNK message it receives (2 MiB for an anchor's) and
 * the consumer's thread frees it; with glibc's defaults those buffers go
 * back to the kernel and are faulted in again, a page fault per 4 KiB of
 * every anchor received.  (An embedding process can ask the same of
 * glibc with GLIBC_TUNABLES: docs/operations.md.) */
static void keep_heap(void)
{
	mallopt(M_MMAP_THRESHOLD, 32 << 20);
	mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

int cmd_subscribe(int argc, char **argv)
{
	sub_args a;
	dcast_consumer_opts o;
	dcast_consumer *c = NULL;
	int rc = parse(argc, argv, &a), err;

	if (rc)
		return rc < 0 ? CLI_OK : rc;
	dcast_consumer_opts_init(&o);
	o.verify_digests = a.verify;
	if (a.fold_every > UINT32_MAX)
		return cli_usage_error(CMD, "--fold-every: %" PRIu64 " is too large", a.fold_every);
	o.fold_every = (uint32_t)a.fold_every;
	o.client = "deltacast-subscribe";
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	keep_heap();
	if ((err = dcast_consumer_open(a.broker, a.model, a.dir, a.budget, &o, &c)))
		return cli_report(CMD, err);
	if (dcast_consumer_version(c) != DCAST_VERSION_NONE)
		printf("loaded version %" PRIu64 " from %s\n", dcast_consumer_version(c), a.dir);
	fflush(stdout);
	err = follow(c, &a);
	if (!err)
		err = fold_on_exit(c);
	if (!err)
		err = write_layout(c, &a, 1);
	if (a.layout_dir)
		hf_layout_export_end(a.layout_dir);
	dcast_consumer_close(&c);
	return err ? cli_report(CMD, err) : CLI_OK;
}
