/* deltacast gen-trace: write K+1 bf16 safetensors checkpoints of a
 * transformer-shaped model, each the previous one after one simulated AdamW
 * step whose learning rate is calibrated to change about --density of the
 * bf16 elements (see trace_state.c). */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "trace.h"

#define CMD "gen-trace"

static const char usage_text[] =
	"usage: deltacast gen-trace --params N --steps K --density P [--seed S]\n"
	"                           [--threads T] [--experts E [--stacked]] -o DIR\n"
	"Writes DIR/v0000.safetensors .. DIR/vK.safetensors: a Llama-shaped bf16 model of\n"
	"about N parameters (suffixes K, M, B: 50M, 1.5B) and K AdamW-like steps on fp32\n"
	"master weights, each rounded to bf16, with the learning rate calibrated so that\n"
	"about a fraction P (0 < P < 1) of the bf16 elements change per step.  Reports\n"
	"the achieved density of each step on stderr.  --threads defaults to 2.  With\n"
	"--experts E each layer's MLP is a router and E experts of 1/E its width (a\n"
	"mixture-of-experts model: about N parameters in 3E + 7 tensors a layer);\n"
	"--stacked holds them as one tensor per layer and projection (10 a layer).\n";

typedef struct trace_opts {
	uint64_t params, seed;
	unsigned steps, threads, experts;
	int stacked;
	double density;
	const char *dir;
} trace_opts;

static int parse_opts(int argc, char **argv, trace_opts *o)
{
	static const struct option longopts[] = {
		{"params", required_argument, 0, 'n'}, {"steps", required_argument, 0, 'k'},
		{"density", required_argument, 0, 'p'}, {"seed", required_argument, 0, 's'},
		{"threads", required_argument, 0, 't'}, {"experts", required_argument, 0, 'e'},
		{"stacked", no_argument, 0, 'S'}, {"help", no_argument, 0, 'h'},
		{0, 0, 0, 0}};
	double steps = -1, threads = 2, seed = 1, experts = 0;
	int c;
	*o = (trace_opts){.density = -1};
	while ((c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
		int bad = 0;
		switch (c) {
		case 'n': bad = cli_parse_count(optarg, &o->params); break;
		case 'k': bad = cli_parse_double(optarg, 0, 9999, &steps); break;
		case 'p': bad = cli_parse_double(optarg, 1e-9, 0.999, &o->density); break;
		case 's': bad = cli_parse_double(optarg, 0, 9e15, &seed); break;
		case 't': bad = cli_parse_double(optarg, 1, 64, &threads); break;
		case 'e': bad = cli_parse_double(optarg, 0, 4096, &experts); break;
		case 'S': o->stacked = 1; break;
		case 'o': o->dir = optarg; break;
		case 'h': fputs(usage_text, stdout); exit(CLI_OK);
		default: return cli_usage_error(CMD, "bad option");
		}
		if (bad)
			return cli_usage_error(CMD, "bad value \"%s\" for --%s", optarg,
					       cli_option_name(longopts, c));
	}
	if (!o->params || steps < 0 || o->density < 0 || !o->dir || optind != argc)
		return cli_usage_error(CMD, "--params, --steps, --density and -o are required");
	o->steps = (unsigned)steps, o->threads = (unsigned)threads, o->seed = (uint64_t)seed;
	o->experts = (unsigned)experts;
	if (o->stacked && !o->experts)
		return cli_usage_error(CMD, "--stacked needs --experts");
	return 0;
}

static dcast_st_spec *make_specs(const trace_model *m, const uint16_t *bf)
{
	dcast_st_spec *specs = calloc(m->count, sizeof(*specs));
	for (size_t i = 0; specs && i < m->count; i++) {
		const trace_tensor *t = &m->tensors[i];
		specs[i] = (dcast_st_spec){t->name, DCAST_ST_BF16, t->ndim, {t->shape[0], t->shape[1]},
					   bf + t->offset};
	}
	return specs;
}

static int write_version(const trace_opts *o, const trace_model *m, const dcast_st_spec *specs,
			 unsigned step)
{
	char path[4096], step_text[16], seed_text[24];
	snprintf(path, sizeof(path), "%s/v%04u.safetensors", o->dir, step);
	snprintf(step_text, sizeof(step_text), "%u", step);
	snprintf(seed_text, sizeof(seed_text), "%llu", (unsigned long long)o->seed);
	dcast_st_meta meta[] = {{"format", "pt"}, {"generator", "deltacast gen-trace"},
				{"step", step_text}, {"seed", seed_text}};
	return dcast_st_write(path, specs, m->count, meta, CLI_ARRAY_LEN(meta));
}

static int run_steps(const trace_opts *o, trace_state *s, const dcast_st_spec *specs)
{
	int err = write_version(o, s->model, specs, 0);
	for (unsigned k = 1; k <= o->steps && !err; k++) {
		double t0 = cli_now_s();
		double lr = trace_calibrate_lr(s, o->density);
		uint64_t changed = trace_step(s, lr);
		double t1 = cli_now_s();
		err = write_version(o, s->model, specs, k);
		fprintf(stderr,
			"gen-trace: step %u: lr %.3e, changed %llu of %llu, density %.5f "
			"(step %.2fs, write %.2fs)\n",
			k, lr, (unsigned long long)changed, (unsigned long long)s->model->total,
			(double)changed / (double)s->model->total, t1 - t0, cli_now_s() - t1);
	}
	return err;
}

int cmd_gen_trace(int argc, char **argv)
{
	trace_opts o;
	int rc = parse_opts(argc, argv, &o);
	if (rc)
		return rc;
	if (mkdir(o.dir, 0755) != 0 && errno != EEXIST)
		return cli_report(CMD, cli_fail(DCAST_EIO, "%s: mkdir: %s", o.dir, strerror(errno)));
	trace_model m;
	trace_state s = {0};
	int err = trace_model_plan(o.params, o.experts, o.stacked, &m);
	if (!err)
		err = trace_state_init(&s, &m, o.seed, o.threads);
	dcast_st_spec *specs = err ? NULL : make_specs(&m, s.bf);
	if (!err && !specs)
		err = cli_fail(DCAST_ENOMEM, "out of memory");
	if (!err) {
		char moe[48] = "";
		if (m.experts)
			snprintf(moe, sizeof(moe), " (%u experts of %u%s)", m.experts, m.expert_ffn,
				 m.stacked ? ", stacked" : "");
		fprintf(stderr, "gen-trace: %llu parameters: hidden %u, %u layers, mlp %u%s, vocab %u, %zu tensors\n",
			(unsigned long long)m.total, m.hidden, m.layers, m.ffn, moe, m.vocab, m.count);
		err = run_steps(&o, &s, specs);
	}
	free(specs);
	trace_state_free(&s);
	trace_model_free(&m);
	return err ? cli_report(CMD, err) : CLI_OK;
}
