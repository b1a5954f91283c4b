/* A new producer process adopts the broker's newest version as its
 * baseline, so that its first version goes out as a delta rather than an
 * anchor every worker downloads again.  It fetches that version as a
 * consumer of its own model would (the consumer library checks every chunk
 * and the COMMIT digests), checks that it is the broker's run and that its
 * tensors are the ones registered, and copies this part's shards into the
 * baseline.  It stands above the producer and the consumer libraries
 * (docs/architecture.md, "Layers"): nothing in producer/ calls it. */
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "deltacast/consumer.h"
#include "producer_shared.h"

#define BASE_BUDGET_MIN (64ull << 20)

/* The consumer's staging budget: one chunk payload must fit a quarter. */
static uint64_t fetch_budget(const dcast_producer *p)
{
	uint64_t need = 8ull * p->pool.slot_bytes;

	return need > BASE_BUDGET_MIN ? need : BASE_BUDGET_MIN;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st, (void)flag, (void)ftw;
	remove(path);
	return 0;
}

/* A directory of our own under $TMPDIR (or /tmp), removed afterwards. */
static int temp_dir(char *out, size_t cap)
{
	const char *tmp = getenv("TMPDIR");

	snprintf(out, cap, "%s/dcast-baseline-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(out))
		return dcast_fail(DCAST_EIO, "fetch_baseline: cannot create a directory %s", out);
	return 0;
}

static int open_consumer(const dcast_producer *p, const char *endpoint, const char *dir,
			 dcast_consumer **c)
{
	dcast_consumer_opts o;
	char client[DCAST_MAX_CLIENT + 1];

	dcast_consumer_opts_init(&o);
	o.auto_apply = 1;
	o.verify_digests = 1;
	snprintf(client, sizeof(client), "%.55s-baseline", p->client[0] ? p->client : "producer");
	o.client = client;
	if (p->curve_server[0]) {
		o.curve_server_key = p->curve_server;
		o.curve_public_key = p->curve_public;
		o.curve_secret_key = p->curve_secret;
	}
	return dcast_consumer_open(endpoint, p->model, dir, fetch_budget(p), &o, c);
}

/* The version the consumer holds must be the broker's newest, of its run. */
static int check_fetched(const dcast_producer *p, dcast_consumer *c, uint64_t want)
{
	uint64_t got = dcast_consumer_version(c), run = dcast_consumer_run(c);

	if (got != want)
		return dcast_fail(DCAST_ESTATE, "fetch_baseline: the broker served version %lld, not "
				  "its newest committed %llu (poisoned, or a newer one arrived)",
				  (long long)got, (unsigned long long)want);
	if (p->conn.run && run != p->conn.run)
		return dcast_fail(DCAST_ESTATE, "fetch_baseline: fetched version %llu of run %llx, "
				  "the broker's stream is run %llx", (unsigned long long)got,
				  (unsigned long long)run, (unsigned long long)p->conn.run);
	return 0;
}

/* The broker's tensors are the registered ones, in the same order (the
 * index is part of every digest). */
static int check_manifest(const dcast_producer *p, dcast_consumer *c)
{
	uint32_t n = dcast_consumer_tensor_count(c);
	int rc = prod_tensor_count_matches(p, n, "fetch_baseline");

	for (uint32_t i = 0; i < p->n_tensors && !rc; i++) {
		dcast_tensor_desc got;

		memset(&got, 0, sizeof(got));
		dcast_consumer_tensor_at(c, i, &got);
		rc = prod_tensor_matches(p, i, &got, "fetch_baseline");
	}
	return rc;
}

/* Copy this part's shards (wire order, as the consumer keeps them) into
 * the baseline. */
static int adopt(dcast_producer *p, dcast_consumer *c, uint64_t version)
{
	int rc = 0;

	prod_baseline_dropped(p);
	for (uint32_t i = 0; i < p->n_tensors && !rc; i++) {
		const prod_tensor *t = &p->tensors[i];
		void *ptr;
		dcast_mem mem;

		if ((rc = dcast_consumer_tensor(c, t->desc.name, &ptr, NULL, &mem)))
			return rc;
		DCAST_ASSERT(mem == DCAST_MEM_HOST); /* nothing is bound to the consumer */
		rc = prod_base_fill(p, i, (const unsigned char *)ptr + t->shard_off * t->elem_size);
	}
	if (!rc)
		prod_baseline_adopted(p, version);
	return rc;
}

static int fetch_into(dcast_producer *p, const char *endpoint, const char *dir,
		      uint64_t version, int timeout_ms)
{
	dcast_consumer *c = NULL;
	int rc;

	if (!(rc = open_consumer(p, endpoint, dir, &c)) && !(rc = dcast_consumer_wait_version(c, version, timeout_ms)) &&
	    !(rc = check_fetched(p, c, version)) && !(rc = check_manifest(p, c)))
		rc = adopt(p, c, version);
	if (rc && rc != DCAST_ESHAPE)
		rc = dcast_fail(rc, "fetch_baseline: version %llu of %s from %s: %s",
				(unsigned long long)version, p->model, endpoint, dcast_last_error());
	dcast_consumer_close(&c);
	return rc;
}

static int check_args(const dcast_producer *p, const char *endpoint)
{
	if (!p || (endpoint && !*endpoint))
		return dcast_fail(DCAST_EINVAL, "fetch_baseline: NULL producer or an empty consumer "
				  "endpoint");
	if (p->last_version != DCAST_VERSION_NONE || p->pending_version != DCAST_VERSION_NONE)
		return dcast_fail(DCAST_ESTATE, "fetch_baseline: only before the first publish");
	return 0;
}

int dcast_producer_fetch_baseline(dcast_producer *p, const char *consumer_endpoint,
				  const char *dir, int timeout_ms)
{
	uint64_t version;
	char tmp[4096], ep[PROD_ENDPOINT_MAX];
	int rc;

	if ((rc = check_args(p, consumer_endpoint)) || (rc = prod_freeze(p)))
		return rc;
	version = p->conn.broker_version;
	if (version == DCAST_VERSION_NONE || p->conn.need_anchor) {
		DCAST_LOG_I("producer %s part %u: the broker holds no version to take as a baseline%s",
			    p->model, p->part, p->conn.need_anchor ? " (it asks for an anchor)" : "");
		return 0;
	}
	if ((rc = prod_consumer_endpoint(p, consumer_endpoint, ep, sizeof(ep), "fetch_baseline")) ||
	    (!dir && (rc = temp_dir(tmp, sizeof(tmp)))))
		return rc;
	rc = fetch_into(p, ep, dir ? dir : tmp, version, timeout_ms);
	if (!dir)
		nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	if (!rc)
		DCAST_LOG_I("producer %s part %u: baseline is version %llu, fetched from %s",
			    p->model, p->part, (unsigned long long)version, ep);
	return rc;
}
