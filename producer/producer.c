/* The producer object: options, open/close, tensor registration. */
#include <string.h>
#include "dcast_tiles.h"
#include "producer_shared.h"

void dcast_producer_opts_init(dcast_producer_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->range_elems = 1u << 20;
	o->max_inflight_bytes = 64u << 20;
	o->connect_timeout_ms = 5000;
	o->ack_timeout_ms = 30000;
	o->max_reconnects = 3;
	o->reconnect_backoff_ms = 100;
	o->close_timeout_ms = 5000;
}

static int copy_str(char *dst, size_t cap, const char *src, const char *what)
{
	size_t n = src ? strlen(src) : 0;

	if (n >= cap)
		return dcast_fail(DCAST_EINVAL, "producer: %s is %zu bytes, at most %zu", what, n,
				  cap - 1);
	memcpy(dst, src ? src : "", n + 1);
	return 0;
}

static int check_keys(dcast_producer *p, const dcast_producer_opts *o)
{
	int n = !!o->curve_server_key + !!o->curve_public_key + !!o->curve_secret_key;
	const char *k[3] = {o->curve_server_key, o->curve_public_key, o->curve_secret_key};
	char *dst[3] = {p->curve_server, p->curve_public, p->curve_secret};

	if (n == 0)
		return 0;
	if (n != 3)
		return dcast_fail(DCAST_EINVAL, "producer: CURVE needs curve_server_key, "
				  "curve_public_key and curve_secret_key together (%d of 3 set)", n);
	for (int i = 0; i < 3; i++) {
		if (strlen(k[i]) != PROD_KEY_LEN)
			return dcast_fail(DCAST_EINVAL, "producer: CURVE key %d is %zu characters, "
					  "want %d (Z85)", i, strlen(k[i]), PROD_KEY_LEN);
		memcpy(dst[i], k[i], PROD_KEY_LEN + 1);
	}
	return 0;
}

static int check_opts(const dcast_producer_opts *o)
{
	if (o->range_elems < 1 || o->range_elems > DCAST_MAX_RANGE_ELEMS)
		return dcast_fail(DCAST_EINVAL, "producer: range_elems %llu outside [1, %u]",
				  (unsigned long long)o->range_elems, DCAST_MAX_RANGE_ELEMS);
	if (o->encode_threads > 64)
		return dcast_fail(DCAST_EINVAL, "producer: encode_threads %u, at most 64",
				  o->encode_threads);
	if (o->connect_timeout_ms == 0 || o->ack_timeout_ms == 0)
		return dcast_fail(DCAST_EINVAL, "producer: connect_timeout_ms and ack_timeout_ms "
				  "must be above 0");
	if (o->baseline_on_device && !dcast_cuda_available())
		return dcast_fail(DCAST_ENODEVICE, "producer: baseline_on_device set but no "
				  "usable CUDA device");
	return 0;
}

static int check_open_args(const char *endpoint, const char *model, uint32_t part,
			   uint32_t parts)
{
	if (!endpoint || !*endpoint)
		return dcast_fail(DCAST_EINVAL, "producer: no broker endpoint");
	if (!model || !*model || strlen(model) > DCAST_MAX_NAME)
		return dcast_fail(DCAST_EINVAL, "producer: model name must be 1..%d bytes",
				  DCAST_MAX_NAME);
	if (parts < 1 || parts > DCAST_MAX_PARTS || part >= parts)
		return dcast_fail(DCAST_EINVAL, "producer: part %u of %u: need part < parts <= %d",
				  part, parts, DCAST_MAX_PARTS);
	return 0;
}

static int init_fields(dcast_producer *p, const char *endpoint, const char *model,
		       const dcast_producer_opts *opts)
{
	int rc;

	if (opts)
		p->opts = *opts;
	else
		dcast_producer_opts_init(&p->opts);
	if ((rc = check_opts(&p->opts)) || (rc = check_keys(p, &p->opts)) ||
	    (rc = copy_str(p->endpoint, sizeof(p->endpoint), endpoint, "endpoint")) ||
	    (rc = copy_str(p->client, sizeof(p->client), p->opts.client, "client")))
		return rc;
	memcpy(p->model, model, strlen(model) + 1);
	p->opts.client = NULL;
	p->opts.curve_server_key = p->opts.curve_public_key = p->opts.curve_secret_key = NULL;
	p->acked_version = p->pending_version = p->last_version = DCAST_VERSION_NONE;
	p->failed_version = DCAST_VERSION_NONE;
	p->stats.version = p->stats.acked_version = p->stats.baseline_version = DCAST_VERSION_NONE;
	p->progress.version = DCAST_VERSION_NONE;
	p->conn.broker_version = p->conn.hb_version = DCAST_VERSION_NONE;
	return 0;
}

int dcast_producer_open(const char *endpoint, const char *model, uint32_t part, uint32_t parts,
			const dcast_producer_opts *opts, dcast_producer **out)
{
	dcast_producer *p;
	int rc;

	if (!out)
		return dcast_fail(DCAST_EINVAL, "producer_open: out is NULL");
	*out = NULL;
	if ((rc = check_open_args(endpoint, model, part, parts)))
		return rc;
	if (!(p = calloc(1, sizeof(*p))))
		return dcast_fail(DCAST_ENOMEM, "producer_open: out of memory");
	p->part = part;
	p->parts = parts;
	if ((rc = init_fields(p, endpoint, model, opts)))
		goto fail;
	if (!(p->zctx = zmq_ctx_new())) {
		rc = dcast_fail(DCAST_EZMQ, "producer_open: zmq_ctx_new failed");
		goto fail;
	}
	if ((rc = prod_conn_join(p)))
		goto fail;
	*out = p;
	return 0;
fail:
	dcast_producer_close(&p);
	return rc;
}

static const char *tensor_name(const void *ctx, uint32_t i)
{
	return ((const dcast_producer *)ctx)->tensors[i].desc.name;
}

static prod_tensor *find_tensor(dcast_producer *p, const char *name)
{
	int64_t i = dcast_names_get(&p->names, name, tensor_name, p);

	return i < 0 ? NULL : &p->tensors[i];
}

/* Fill a tensor description from the caller's arguments, checking each. */
static int describe(prod_tensor *t, const char *name, int dtype, uint32_t ndim,
		    const uint64_t *shape, uint64_t off, uint64_t count)
{
	uint64_t elems = 1;

	if (dtype < 0 || dtype >= DCAST_DTYPE_COUNT)
		return dcast_fail(DCAST_EDTYPE, "register %s: dtype %d is not one deltacast carries "
				  "(BF16, F16, F32, F8_*, I8..U32, BOOL, I64, U64, F64)", name, dtype);
	if (ndim > DCAST_MAX_DIMS || (ndim && !shape))
		return dcast_fail(DCAST_ESHAPE, "register %s: %u dims (at most %d) or NULL shape",
				  name, ndim, DCAST_MAX_DIMS);
	for (uint32_t d = 0; d < ndim; d++) {
		if (shape[d] && elems > DCAST_MAX_TENSOR_ELEMS / dcast_dtype_lanes(dtype) / shape[d])
			return dcast_fail(DCAST_ESHAPE, "register %s: more than 2^48 wire elements", name);
		elems *= shape[d];
	}
	if (off > elems || count > elems - off)
		return dcast_fail(DCAST_EINVAL, "register %s: shard [%llu, +%llu) outside the "
				  "tensor's %llu elements", name, (unsigned long long)off,
				  (unsigned long long)count, (unsigned long long)elems);
	memset(t, 0, sizeof(*t));
	memcpy(t->desc.name, name, strlen(name) + 1);
	t->desc.dtype = (uint32_t)dtype;
	t->desc.ndim = ndim;
	if (ndim)
		memcpy(t->desc.shape, shape, ndim * sizeof(shape[0]));
	t->elem_size = dcast_dtype_size(dtype); /* wire elements from here on */
	t->shard_off = off * dcast_dtype_lanes(dtype);
	t->shard_count = count * dcast_dtype_lanes(dtype);
	return 0;
}

static int same_tensor(const prod_tensor *a, const prod_tensor *b)
{
	return a->desc.dtype == b->desc.dtype && a->desc.ndim == b->desc.ndim &&
	       !memcmp(a->desc.shape, b->desc.shape, sizeof(a->desc.shape)) &&
	       dcast_grid_same(&a->desc, &b->desc) && a->shard_off == b->shard_off && a->shard_count == b->shard_count;
}

static int check_mem(const char *name, const void *ptr, int mem, uint64_t count)
{
	if (!ptr && count)
		return dcast_fail(DCAST_EINVAL, "register %s: NULL data for %llu elements", name,
				  (unsigned long long)count);
	if (mem != DCAST_MEM_HOST && mem != DCAST_MEM_CUDA)
		return dcast_fail(DCAST_EINVAL, "register %s: mem %d is neither HOST nor CUDA",
				  name, mem);
	return 0;
}

static int add_tensor(dcast_producer *p, const prod_tensor *t)
{
	if (p->n_tensors == p->cap_tensors) {
		uint32_t cap = p->cap_tensors ? p->cap_tensors * 2 : 16;
		prod_tensor *n = realloc(p->tensors, cap * sizeof(*n));

		if (!n)
			return dcast_fail(DCAST_ENOMEM, "register: out of memory");
		p->tensors = n;
		p->cap_tensors = cap;
	}
	int err = dcast_names_put(&p->names, t->desc.name, p->n_tensors);

	if (err)
		return err;
	p->tensors[p->n_tensors++] = *t;
	return 0;
}

/* Add t (described and checked) with its memory, or re-point it. */
static int register_tensor(dcast_producer *p, prod_tensor *t, const void *ptr, int mem)
{
	prod_tensor *old;
	int rc;

	if ((rc = check_mem(t->desc.name, ptr, mem, t->shard_count)) ||
	    (mem == DCAST_MEM_CUDA && (rc = prod_dev_register(t, ptr))))
		return rc;
	t->ptr = ptr;
	t->mem = mem;
	if ((old = find_tensor(p, t->desc.name))) {
		if (!same_tensor(old, t))
			return dcast_fail(DCAST_ESHAPE, "register %s: dtype, shape, grid or shard differs "
					  "from its first registration (%s, %u dims)", t->desc.name,
					  dcast_dtype_name(old->desc.dtype), old->desc.ndim);
		if (old->mem != mem || (old->base_on_device && old->device != t->device))
			return dcast_fail(DCAST_EINVAL, "register %s: moved between host and device "
					  "memory, or to another device than its baseline's", t->desc.name);
		old->ptr = ptr;
		old->device = t->device;
		return 0;
	}
	if (p->frozen)
		return dcast_fail(DCAST_ESTATE, "register %s: new tensors only before the first "
				  "publish (the manifest is fixed)", t->desc.name);
	if (p->n_tensors >= DCAST_MAX_TENSORS)
		return dcast_fail(DCAST_ETOO_LARGE, "register %s: more than %d tensors", t->desc.name,
				  DCAST_MAX_TENSORS);
	return add_tensor(p, t);
}

/* A name every receiver takes (dcast_tensor_name_check), refused here as
 * the caller's argument rather than by the broker after the publish. */
static int check_name(const dcast_producer *p, const char *name, const char *call)
{
	if (!p)
		return dcast_fail(DCAST_EINVAL, "%s: NULL producer", call);
	if (dcast_tensor_name_check(name, call))
		return dcast_fail(DCAST_EINVAL, "%s", dcast_last_error());
	return 0;
}

int dcast_producer_register(dcast_producer *p, const char *name, int dtype, uint32_t ndim,
			    const uint64_t *shape, const void *ptr, int mem,
			    uint64_t shard_offset_elems, uint64_t shard_count_elems)
{
	prod_tensor t;
	int rc;

	if ((rc = check_name(p, name, "register")) ||
	    (rc = describe(&t, name, dtype, ndim, shape, shard_offset_elems, shard_count_elems)))
		return rc;
	return register_tensor(p, &t, ptr, mem);
}

/* The grid the tile `b` belongs to, and the tile's range in wire order. */
static int describe_tile(prod_tensor *t, const dcast_box *b)
{
	uint64_t index;

	if (!dcast_box_is_tile(b, &t->desc, &index))
		return dcast_fail(DCAST_ESHAPE, "register_slice %s: the box is not a tile of an even "
				  "grid (each extent must divide its dimension, each offset be a "
				  "multiple of its extent)", t->desc.name);
	for (uint32_t d = 0; d < t->desc.ndim; d++) {
		if (t->desc.shape[d] / b->ext[d] > UINT32_MAX)
			return dcast_fail(DCAST_ESHAPE, "register_slice %s: more than 2^32 tiles "
					  "along dim %u", t->desc.name, d);
		t->desc.grid[d] = (uint32_t)(t->desc.shape[d] / b->ext[d]);
	}
	t->shard_off = index * b->elems;
	t->shard_count = b->elems;
	return 0;
}

int dcast_producer_register_slice(dcast_producer *p, const char *name, int dtype, uint32_t ndim,
				  const uint64_t *shape, const uint64_t *offset,
				  const uint64_t *extent, const void *ptr, int mem)
{
	prod_tensor t;
	dcast_box b;
	int rc;

	if ((rc = check_name(p, name, "register_slice")) ||
	    (rc = describe(&t, name, dtype, ndim, shape, 0, 0)))
		return rc;
	if (!ndim)
		return dcast_fail(DCAST_ESHAPE, "register_slice %s: a scalar has no slices", name);
	if ((rc = dcast_box_init(&b, &t.desc, ndim, offset, extent, "register_slice")) ||
	    (rc = describe_tile(&t, &b)))
		return rc;
	if (!ptr)
		t.shard_off = t.shard_count = 0; /* declares the grid, holds no tile */
	return register_tensor(p, &t, ptr, mem);
}

void dcast_producer_stats_get(const dcast_producer *p, dcast_producer_stats *out)
{
	if (!prod_sender_shown(p, out))
		prod_stats_now(p, out);
}

uint64_t dcast_producer_broker_version(const dcast_producer *p)
{
	dcast_producer_stats s;

	if (!p)
		return DCAST_VERSION_NONE;
	dcast_producer_stats_get(p, &s);
	return s.broker_version;
}

#define LOAD(f) __atomic_load_n(&p->progress.f, __ATOMIC_ACQUIRE)

void dcast_producer_progress_get(const dcast_producer *p, dcast_producer_progress *out)
{
	uint64_t start, end;

	out->active = (int)LOAD(active);
	out->version = LOAD(version);
	out->anchor = (int)LOAD(anchor);
	out->ranges_done = LOAD(ranges_done);
	out->ranges_total = LOAD(ranges_total);
	out->bytes_sent = LOAD(bytes_sent);
	out->bytes_taken = LOAD(bytes_taken);
	out->bytes_total = LOAD(bytes_total);
	start = LOAD(start_ms);
	end = out->active ? dcast_now_ms() : LOAD(end_ms);
	out->elapsed_ms = end > start ? end - start : 0; /* a publish starting meanwhile */
	out->err = (int)LOAD(err);
}

#undef LOAD

void dcast_producer_close(dcast_producer **pp)
{
	dcast_producer *p;

	if (!pp || !(p = *pp))
		return;
	prod_close_flush(p);
	prod_conn_close(p, 1);
	if (p->zctx)
		zmq_ctx_term(p->zctx);
	prod_enc_free(p);
	prod_mem_free(p);
	free(p->tensors);
	dcast_names_free(&p->names);
	free(p);
	*pp = NULL;
}
