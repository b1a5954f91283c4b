/* The consumer tests' harness (tests/consumer_harness.h, which documents
 * each function): a small model published by a real producer, a poll/apply
 * driver. */
#include "../consumer_harness.h"

int h_rec_exists(const char *dir, uint64_t v)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/model.dlog/%020" PRIu64 ".rec", dir, v);
	return access(path, F_OK) == 0;
}

int h_flip_byte(const char *path, long off, int whence, int mask)
{
	FILE *f = fopen(path, "r+b");
	int ch;

	REQUIRE(f);
	REQUIRE(fseek(f, off, whence) == 0 && (ch = fgetc(f)) != EOF);
	REQUIRE(fseek(f, off, whence) == 0 && fputc(ch ^ mask, f) != EOF);
	REQUIRE(fclose(f) == 0);
	return ch;
}

uint64_t h_file_version(const char *dir)
{
	char path[512];
	dcast_st_file *f = NULL;
	uint64_t v = 0;

	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	if (dcast_st_open(path, &f) == 0) {
		const char *s = dcast_st_metadata_get(f, "deltacast.version");
		v = s ? strtoull(s, NULL, 10) : 0;
	}
	dcast_st_close(&f);
	return v;
}

void h_broker_stop(h_broker *b)
{
	char cmd[600];

	tp_broker_kill(b, SIGKILL);
	if (check_failures) {
		snprintf(cmd, sizeof(cmd), "tail -n 40 '%s' >&2", b->log);
		if (system(cmd) != 0)
			fprintf(stderr, "broker log %s unreadable\n", b->log);
	}
	unlink(b->log);
}

uint64_t h_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

void h_model_shaped(h_model *m, uint64_t seed, const char *const names[H_TENSORS],
		    const uint64_t rows[H_TENSORS], const uint64_t cols[H_TENSORS])
{
	memset(m, 0, sizeof(*m));
	m->rng = seed | 1;
	for (int t = 0; t < H_TENSORS; t++) {
		m->name[t] = names[t];
		m->dtype[t] = t == 1 ? DCAST_DTYPE_F32 : DCAST_DTYPE_BF16;
		m->ndim[t] = 2;
		m->shape[t][0] = rows[t];
		m->shape[t][1] = cols[t];
		m->bytes[t] = m->shape[t][0] * m->shape[t][1] * (t == 1 ? 4 : 2);
		m->cur[t] = malloc(m->bytes[t]);
		for (uint64_t i = 0; i < m->bytes[t]; i++)
			m->cur[t][i] = (unsigned char)h_rand(&m->rng);
	}
}

void h_model_init(h_model *m, uint64_t seed, uint64_t scale)
{
	static const char *const names[H_TENSORS] = {"layers.0.w", "layers.0.f32", "head.b"};
	const uint64_t rows[H_TENSORS] = {256 * scale, 256 * scale, 1}, cols[H_TENSORS] = {1024, 800, 1000};

	h_model_shaped(m, seed, names, rows, cols);
}

uint64_t h_model_bytes(const h_model *m)
{
	uint64_t n = 0;
	for (int t = 0; t < H_TENSORS; t++)
		n += m->bytes[t];
	return n;
}

void h_model_step(h_model *m, unsigned density_inv)
{
	for (int t = 0; t < H_TENSORS; t++) {
		unsigned es = t == 1 ? 4 : 2;
		uint64_t n = m->bytes[t] / es, k = n / density_inv + 1;
		for (uint64_t j = 0; j < k; j++)
			m->cur[t][(h_rand(&m->rng) % n) * es] ^= (unsigned char)(1 + h_rand(&m->rng) % 7);
	}
}

void h_model_snap(h_model *m, uint64_t v)
{
	for (int t = 0; t < H_TENSORS; t++) {
		m->snap[v][t] = malloc(m->bytes[t]);
		memcpy(m->snap[v][t], m->cur[t], m->bytes[t]);
	}
}

uint64_t h_range_elems = 32768;

void h_model_free(h_model *m)
{
	for (int t = 0; t < H_TENSORS; t++) {
		free(m->cur[t]);
		for (int v = 0; v < 32; v++)
			free(m->snap[v][t]);
	}
	memset(m, 0, sizeof(*m));
}

int h_producer_open(const h_broker *b, const char *model_name, h_model *m, dcast_producer **p)
{
	dcast_producer_opts o;
	int err;

	dcast_producer_opts_init(&o);
	o.range_elems = h_range_elems;
	if ((err = dcast_producer_open(b->producers, model_name, 0, 1, &o, p)))
		return err;
	for (int t = 0; t < H_TENSORS && !err; t++)
		err = dcast_producer_register(*p, m->name[t], m->dtype[t], m->ndim[t], m->shape[t], m->cur[t],
					      DCAST_MEM_HOST, 0,
					      m->bytes[t] / (dcast_dtype_size(m->dtype[t]) * dcast_dtype_lanes(m->dtype[t])));
	return err;
}

int h_publish(dcast_producer *p, h_model *m, uint64_t v, unsigned density_inv)
{
	int err;

	if (v > 1)
		h_model_step(m, density_inv);
	h_model_snap(m, v);
	if ((err = dcast_producer_publish(p, v)))
		return err;
	return dcast_producer_wait(p, v, 20000);
}

int h_model_start_sized(const h_broker *b, const char *name, uint64_t seed, uint64_t scale,
			uint64_t versions, unsigned density_inv, h_model *m, dcast_producer **p)
{
	int err;

	h_model_init(m, seed, scale);
	if ((err = h_producer_open(b, name, m, p)))
		return err;
	for (uint64_t v = 1; v <= versions && !err; v++)
		err = h_publish(*p, m, v, density_inv);
	return err;
}

int h_model_start(const h_broker *b, const char *name, uint64_t seed, uint64_t versions,
		  unsigned density_inv, h_model *m, dcast_producer **p)
{
	return h_model_start_sized(b, name, seed, 1, versions, density_inv, m, p);
}

int h_equal(dcast_consumer *c, const h_model *m, uint64_t v)
{
	for (int t = 0; t < H_TENSORS; t++) {
		void *ptr;
		dcast_mem mem = DCAST_MEM_HOST;
		if (!m->snap[v][t] || dcast_consumer_tensor(c, m->name[t], &ptr, NULL, &mem) || mem != DCAST_MEM_HOST ||
		    memcmp(ptr, m->snap[v][t], m->bytes[t]))
			return 0;
	}
	return 1;
}

void *h_wait_thread(void *arg)
{
	h_waiter *w = arg;

	w->rc = dcast_consumer_wait_version(w->c, w->version, 30000);
	return NULL;
}

void h_count(h_seen *s, const dcast_event *ev)
{
	if (ev->type == DCAST_EV_GAP)
		s->gaps++;
	if (ev->type == DCAST_EV_ANCHOR)
		s->anchors++;
	if (ev->type == DCAST_EV_ERROR)
		s->errors++, s->last_error = ev->code;
}

void h_drain(dcast_consumer *c, h_seen *s)
{
	dcast_event ev;

	while (dcast_consumer_poll(c, 0, &ev) == 0 && ev.type != DCAST_EV_NONE)
		h_count(s, &ev);
}

static int apply_plain(dcast_consumer *c, uint64_t version, void *arg)
{
	(void)arg;
	return dcast_consumer_apply(c, version);
}

int h_drive(dcast_consumer *c, const h_model *m, uint64_t target, h_seen *s)
{
	return h_drive_by(c, m, target, s, apply_plain, NULL);
}

int h_drive_by(dcast_consumer *c, const h_model *m, uint64_t target, h_seen *s, h_apply_fn apply, void *arg)
{
	dcast_event ev;

	for (int i = 0; i < 400; i++) {
		uint64_t have = dcast_consumer_version(c);
		if (have != DCAST_VERSION_NONE && have >= target) {
			h_drain(c, s);
			return 0;
		}
		if (dcast_consumer_poll(c, 100, &ev))
			return -1;
		h_count(s, &ev);
		if (ev.type == DCAST_EV_VERSION_READY && dcast_consumer_ready_version(c) != DCAST_VERSION_NONE) {
			int err = apply(c, dcast_consumer_ready_version(c), arg);
			if (err)
				s->apply_failures++, s->last_apply_error = err;
			if (!err)
				continue;
		}
		if (ev.type == DCAST_EV_ERROR || ev.type == DCAST_EV_VERSION_READY) {
			have = dcast_consumer_version(c);
			if (have != DCAST_VERSION_NONE)
				h_equal(c, m, have) ? s->untouched_ok++ : s->untouched_bad++;
		}
	}
	return -1;
}
