/* gen-trace internals: the transformer-shaped model plan and the simulated
 * training state (fp32 master weights, AdamW moments, bf16 copy). */
#ifndef DCAST_CLI_TRACE_H
#define DCAST_CLI_TRACE_H

#include <stddef.h>
#include <stdint.h>

#define TRACE_NAME_BYTES 96

typedef struct trace_tensor {
	char name[TRACE_NAME_BYTES];
	unsigned ndim;
	uint64_t shape[2];
	uint64_t count;
	uint64_t offset;   /* first element in the flat state arrays */
	float init_mean;
	float init_std;
} trace_tensor;

typedef struct trace_model {
	trace_tensor *tensors;
	size_t count;
	uint64_t total;    /* elements */
	unsigned hidden, layers, ffn, vocab;
	unsigned experts;  /* MLP experts per layer (0: one dense MLP) */
	unsigned expert_ffn; /* each expert's width: ffn / experts, rounded up to 8 */
	int stacked;       /* experts held stacked: one tensor per layer and projection */
} trace_model;

/* Lay out a model of about `params` parameters (at least one layer); with
 * `experts` > 0 each layer's MLP is that many experts of ffn / experts
 * width (a mixture-of-experts model of fine-grained experts: about as many
 * parameters, three tensors per expert, and a router); `stacked`: the
 * same experts in one tensor per layer and projection, the rows of expert
 * e after those of e - 1 (a fused-MoE layout).  Errors: DCAST_EINVAL (too
 * small, < 100k; experts above the MLP's width), DCAST_ENOMEM. */
int trace_model_plan(uint64_t params, unsigned experts, int stacked, trace_model *m);
void trace_model_free(trace_model *m);

typedef struct trace_state {
	const trace_model *model;
	uint64_t seed;
	unsigned threads;
	unsigned step;     /* optimizer steps taken */
	float *w, *m, *v;  /* fp32 master weights and AdamW moments */
	uint16_t *bf;      /* bf16 copy, what the checkpoints hold */
} trace_state;

/* Allocate and initialise (step 0).  Errors: DCAST_ENOMEM. */
int trace_state_init(trace_state *s, const trace_model *m, uint64_t seed, unsigned threads);
void trace_state_free(trace_state *s);

/* Learning rate for the next step that makes about `density` of the bf16
 * elements change, found by bisection on a sample of the elements. */
double trace_calibrate_lr(const trace_state *s, double density);

/* Take one AdamW step at lr; returns the number of bf16 elements changed. */
uint64_t trace_step(trace_state *s, double lr);

#endif
