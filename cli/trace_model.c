/* gen-trace model plan: a Llama-shaped decoder (embedding, per layer RMSNorm
 * + q/k/v/o attention + RMSNorm + gate/up/down MLP, final norm, lm_head)
 * whose hidden size and depth are picked so that the total is close to the
 * requested parameter count with a hidden/layers ratio near 64.  With
 * experts, each MLP is a router and that many experts of gate/up/down
 * (names as Hugging Face's Qwen-MoE checkpoints have them). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "trace.h"

#define INIT_STD 0.02f
#define NORM_STD 0.05f

static uint64_t round_up(uint64_t x, uint64_t m)
{
	return (x + m - 1) / m * m;
}

static unsigned vocab_for(uint64_t params)
{
	double v = 2.0 * sqrt((double)params);
	v = v < 512 ? 512 : v > 32000 ? 32000 : v;
	return (unsigned)round_up((uint64_t)v, 64);
}

static uint64_t layer_params(uint64_t d, uint64_t ffn)
{
	return 4 * d * d + 3 * d * ffn + 2 * d;
}

/* Choose hidden size and layer count; 0 when params is too small. */
static int plan_shape(uint64_t params, trace_model *m)
{
	double best = INFINITY;
	unsigned vocab = vocab_for(params);
	for (uint64_t d = 64; d <= 16384; d += 64) {
		uint64_t ffn = round_up(8 * d / 3, 64), fixed = 2 * (uint64_t)vocab * d + d;
		if (fixed >= params)
			break;
		double layers = round((double)(params - fixed) / (double)layer_params(d, ffn));
		if (layers < 1 || layers > 1024)
			continue;
		double score = fabs(log((double)d / layers / 64.0));
		if (score < best) {
			best = score;
			m->hidden = (unsigned)d, m->ffn = (unsigned)ffn, m->layers = (unsigned)layers;
		}
	}
	m->vocab = vocab;
	return best < INFINITY;
}

static void add_tensor(trace_model *m, const char *name, uint64_t rows, uint64_t cols,
		       float mean, float std)
{
	trace_tensor *t = &m->tensors[m->count++];
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->ndim = cols ? 2 : 1;
	t->shape[0] = rows;
	t->shape[1] = cols;
	t->count = rows * (cols ? cols : 1);
	t->offset = m->total;
	t->init_mean = mean;
	t->init_std = std;
	m->total += t->count;
}

/* The MLP projections PREFIX.{gate,up,down}_proj.weight of width f, each
 * `stack` of them in one tensor (the rows of one after another's). */
static void add_mlp(trace_model *m, const char *prefix, uint64_t stack, uint64_t f, float out_std)
{
	static const char *const mlp[] = {"gate_proj", "up_proj", "down_proj"};
	uint64_t d = m->hidden;
	char name[TRACE_NAME_BYTES];

	for (int i = 0; i < 3; i++) {
		snprintf(name, sizeof(name), "%s.%s.weight", prefix, mlp[i]);
		add_tensor(m, name, stack * (i == 2 ? d : f), i == 2 ? f : d, 0.0f, i == 2 ? out_std : INIT_STD);
	}
}

/* Layer l's MLP: dense, or a router and its experts of width
 * m->expert_ffn, one tensor each or stacked. */
static void add_layer_mlp(trace_model *m, unsigned l, float out_std)
{
	char prefix[TRACE_NAME_BYTES];

	snprintf(prefix, sizeof(prefix), "model.layers.%u.mlp", l);
	if (!m->experts) {
		add_mlp(m, prefix, 1, m->ffn, out_std);
		return;
	}
	snprintf(prefix, sizeof(prefix), "model.layers.%u.mlp.gate.weight", l);
	add_tensor(m, prefix, m->experts, m->hidden, 0.0f, INIT_STD);
	snprintf(prefix, sizeof(prefix), "model.layers.%u.mlp.experts", l);
	if (m->stacked)
		add_mlp(m, prefix, m->experts, m->expert_ffn, out_std);
	for (unsigned e = 0; !m->stacked && e < m->experts; e++) {
		snprintf(prefix, sizeof(prefix), "model.layers.%u.mlp.experts.%u", l, e);
		add_mlp(m, prefix, 1, m->expert_ffn, out_std);
	}
}

static void add_layer(trace_model *m, unsigned l)
{
	static const char *const attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
	uint64_t d = m->hidden;
	float out_std = INIT_STD / sqrtf(2.0f * (float)m->layers); /* residual outputs */
	char name[TRACE_NAME_BYTES];
	snprintf(name, sizeof(name), "model.layers.%u.input_layernorm.weight", l);
	add_tensor(m, name, d, 0, 1.0f, NORM_STD);
	for (int i = 0; i < 4; i++) {
		snprintf(name, sizeof(name), "model.layers.%u.self_attn.%s.weight", l, attn[i]);
		add_tensor(m, name, d, d, 0.0f, i == 3 ? out_std : INIT_STD);
	}
	snprintf(name, sizeof(name), "model.layers.%u.post_attention_layernorm.weight", l);
	add_tensor(m, name, d, 0, 1.0f, NORM_STD);
	add_layer_mlp(m, l, out_std);
}

/* Tensors a layer has: two norms, four attention projections, then three
 * MLP projections, or a router and three per expert (three in all when
 * stacked). */
static size_t layer_tensors(const trace_model *m)
{
	return 6 + (m->experts ? 1 + 3 * (m->stacked ? 1 : (size_t)m->experts) : 3);
}

/* The smallest model plan_shape lays out: below it, one layer of hidden
 * size 64 rounds to none. */
#define TRACE_MIN_PARAMS 116864u

int trace_model_plan(uint64_t params, unsigned experts, int stacked, trace_model *m)
{
	memset(m, 0, sizeof(*m));
	if (params < TRACE_MIN_PARAMS || !plan_shape(params, m))
		return cli_fail(DCAST_EINVAL, "--params %llu is too small for a transformer (at least %u: "
				  "one layer of hidden size 64 and its embeddings)", (unsigned long long)params,
				  TRACE_MIN_PARAMS);
	if (experts > m->ffn / 8)
		return cli_fail(DCAST_EINVAL, "--experts %u: more than the MLP's width %u over 8 allows", experts,
				m->ffn);
	m->experts = experts;
	m->stacked = experts && stacked;
	m->expert_ffn = experts ? (unsigned)round_up((m->ffn + experts - 1) / experts, 8) : 0;
	m->tensors = calloc(3 + layer_tensors(m) * m->layers, sizeof(*m->tensors));
	if (!m->tensors)
		return cli_fail(DCAST_ENOMEM, "out of memory");
	add_tensor(m, "model.embed_tokens.weight", m->vocab, m->hidden, 0.0f, INIT_STD);
	for (unsigned l = 0; l < m->layers; l++)
		add_layer(m, l);
	add_tensor(m, "model.norm.weight", m->hidden, 0, 1.0f, NORM_STD);
	add_tensor(m, "lm_head.weight", m->vocab, m->hidden, 0.0f, INIT_STD);
	return 0;
}

void trace_model_free(trace_model *m)
{
	free(m->tensors);
	memset(m, 0, sizeof(*m));
}
