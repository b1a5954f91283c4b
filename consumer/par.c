/* A parallel loop for the consumer's O(model) passes that a caller waits
 * for anyway: an anchor's range digests at apply (verify.c) and the file
 * digest of the live tensors (store/anchor.c: an anchor's header at its COMMIT,
 * the load's check).  Threads are started for the loop and joined before
 * it returns; items are taken in turn, so sizes may differ. */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>
#include "consumer_impl.h"

typedef struct par_job {
	void (*fn)(void *arg, unsigned i);
	void *arg;
	unsigned n;
	atomic_uint next;
} par_job;

static void *par_worker(void *p)
{
	par_job *j = p;

	for (unsigned i; (i = atomic_fetch_add(&j->next, 1)) < j->n;)
		j->fn(j->arg, i);
	return NULL;
}

static unsigned par_threads(unsigned n, uint64_t bytes)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned k = cpus < 1 ? 1 : cpus > CS_PAR_THREADS ? CS_PAR_THREADS : (unsigned)cpus;

	return bytes < CS_PAR_MIN_BYTES ? 1 : k < n ? k : n;
}

void cs_par_for(unsigned n, uint64_t bytes, void (*fn)(void *arg, unsigned i), void *arg)
{
	par_job j = { fn, arg, n, 0 };
	pthread_t th[CS_PAR_THREADS];
	unsigned k = par_threads(n, bytes), started = 0;

	for (unsigned i = 1; i < k; i++) /* a thread that does not start leaves its share to the others */
		started += pthread_create(&th[started], NULL, par_worker, &j) == 0;
	par_worker(&j);
	for (unsigned i = 0; i < started; i++)
		pthread_join(th[i], NULL);
}
