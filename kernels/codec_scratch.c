/* Per-thread scratch arrays for the codec, kept between calls: a fresh
 * allocation per chunk costs more in page faults than the coding itself.
 * Each slot only grows (to what the largest chunk this thread coded needed)
 * and is freed when the thread exits. */
#include <pthread.h>
#include <stdlib.h>
#include "codec_shared.h"
#include "dcast_common.h"

typedef struct scratch_set {
	void *p[DCAST_SCRATCH_SLOTS];
	size_t cap[DCAST_SCRATCH_SLOTS];
} scratch_set;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static _Thread_local scratch_set *scratch_mine;

static void scratch_free(void *arg)
{
	scratch_set *s = arg;
	for (unsigned i = 0; i < DCAST_SCRATCH_SLOTS; i++)
		free(s->p[i]);
	free(s);
}

static void scratch_key_make(void)
{
	DCAST_ASSERT(pthread_key_create(&scratch_key, scratch_free) == 0);
}

static scratch_set *scratch_this_thread(void)
{
	if (scratch_mine)
		return scratch_mine;
	pthread_once(&scratch_once, scratch_key_make);
	scratch_set *s = calloc(1, sizeof(*s));
	if (s && pthread_setspecific(scratch_key, s)) {
		free(s);
		s = NULL;
	}
	return scratch_mine = s;
}

void *dcast_scratch(unsigned slot, size_t bytes)
{
	scratch_set *s = scratch_this_thread();
	DCAST_ASSERT(slot < DCAST_SCRATCH_SLOTS);
	if (!s)
		return NULL;
	if (bytes <= s->cap[slot])
		return s->p[slot];
	size_t cap = s->cap[slot] ? s->cap[slot] : 4096;
	while (cap < bytes)
		cap *= 2;
	void *p = realloc(s->p[slot], cap);
	if (!p)
		return NULL;
	s->p[slot] = p;
	s->cap[slot] = cap;
	return p;
}
