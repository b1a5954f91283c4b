/* The compact encoding on the CPU: exact position bits, the sequential bit
 * writer, and the checking decoder.  The code formats themselves live in
 * codec_shared.h (shared with the GPU); docs/protocol.md has the layout. */
#include <inttypes.h>
#include <string.h>
#include "codec_cpt2.h"
#include "dcast_common.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "payloads are little-endian");

static inline uint64_t dcast_bw_tell(const dcast_bitwriter *w)
{
	return (uint64_t)(w->p - w->start) * 8 + w->nbits;
}

static void wr32le(uint8_t *p, uint32_t v)
{
	memcpy(p, &v, 4);
}

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define LIKELY(x) __builtin_expect(!!(x), 1)

/* The usual element of a coded stream: gap quotient q below QESC and
 * ulp difference zz below VT (nearly all of them).  Its bits, but for the
 * k low bits of the gap, depend on (q, zz) alone, so they are prebuilt per
 * chunk: usual[q][zz] holds q ones, a zero, room for the k low bits, then
 * zz's value code, less q << (k + q + 1), so that adding gap << (q + 1)
 * (q << k plus the low bits) puts the low bits in; usual_len[q][zz] is the
 * length.  The value code is at most LMAX + 5 = 17 bits, so with
 * k <= FAST_KMAX an element fits one flush (at most 56 bits). */
#define VT 64u
#define FAST_KMAX 19u

/* What an element's bits come from: the plan, the table, the new values
 * (raw mode reads them from cur). */
typedef struct emitter {
	const dcast_changes *ch;
	const dcast_cpt_plan *p;
	const uint8_t *cur;
	unsigned es;
	int bmi2;
	uint64_t usual[DCAST_CPT_QESC * VT];
	uint8_t usual_len[DCAST_CPT_QESC * VT];
} emitter;

/* Row 0 from the value codes; row q is row 0 moved up by q ones.  Built
 * from local copies of row 0, which nothing aliases, so that the rows are
 * vector loops: a chunk with few changes pays little for the table. */
static void usual_build(emitter *em)
{
	const dcast_cpt_plan *p = em->p;
	uint64_t row0[VT] = { 0 }; /* zz 0 is never a change */
	uint8_t len0[VT] = { 0 };
	for (uint32_t z = 1; z < VT; z++) {
		unsigned len;
		row0[z] = dcast_cpt_value_bits(p, z, 0, &len) << (p->k + 1);
		len0[z] = (uint8_t)(1 + p->k + len);
	}
	for (unsigned q = 0; q < DCAST_CPT_QESC; q++) {
		uint64_t ones = (1ull << q) - 1, bias = (uint64_t)q << (p->k + q + 1);
		for (uint32_t z = 0; z < VT; z++)
			em->usual[q * VT + z] = (row0[z] << q | ones) - bias;
		for (uint32_t z = 0; z < VT; z++)
			em->usual_len[q * VT + z] = (uint8_t)(len0[z] + q);
	}
}

/* Any element's bits, by the general code functions: the Rice code and
 * the value, or (when they would not fit one flush) each alone. */
typedef struct elem_bits {
	uint64_t bits[2];
	unsigned len[2];
} elem_bits;

static elem_bits elem_any(const emitter *em, uint64_t i, uint32_t gap)
{
	const dcast_cpt_plan *p = em->p;
	unsigned rlen = dcast_rice_len(gap, p->k), vlen;
	uint32_t newv = dcast_load_elem(em->cur + (uint64_t)em->ch->pos[i] * em->es, em->es);
	uint64_t rbits = dcast_rice_bits(gap, p->k), vbits = dcast_cpt_value_bits(p, em->ch->zz[i], newv, &vlen);
	if (rlen + vlen <= 56)
		return (elem_bits){ { rbits | vbits << rlen, 0 }, { rlen + vlen, 0 } };
	return (elem_bits){ { rbits, vbits }, { rlen, vlen } };
}

static ALWAYS_INLINE void put_any(dcast_bitwriter *w, elem_bits e)
{
	dcast_bw_put(w, e.bits[0], e.len[0]);
	if (e.len[1])
		dcast_bw_put(w, e.bits[1], e.len[1]);
}

/* The usual element's bits (see usual_build): the table entry plus the
 * gap moved past the q ones and the zero.  Returns 0 for any other
 * element. */
static ALWAYS_INLINE int elem_usual(const emitter *em, unsigned k, uint32_t gap, uint32_t zz,
				    uint64_t *bits, unsigned *len)
{
	unsigned q = gap >> k;
	if (!LIKELY(q < DCAST_CPT_QESC && zz < VT))
		return 0;
	unsigned at = q * VT + zz;
	*bits = em->usual[at] + ((uint64_t)gap << (q + 1));
	*len = em->usual_len[at];
	return 1;
}

/* Elements [first, end) of a coded stream with k <= FAST_KMAX, two at a
 * time: two usual elements usually share one flush, which halves the
 * writer's dependency chain.  The writer lives in registers here. */
static ALWAYS_INLINE void emit_coded(const emitter *em, uint64_t first, uint64_t end, dcast_bitwriter *wp)
{
	const uint32_t *pos = em->ch->pos, *zzv = em->ch->zz + first, *p = pos + first;
	uint32_t next = first ? pos[first - 1] + 1 : 0;
	const unsigned k = em->p->k; /* a local: the writer's byte stores alias everything */
	dcast_bitwriter w = *wp;
	uint64_t i = first;
	for (; i + 2 <= end; i += 2, p += 2, zzv += 2) {
		uint32_t g0 = p[0] - next, g1 = p[1] - p[0] - 1;
		uint64_t b0, b1;
		unsigned l0, l1;
		next = p[1] + 1;
		if (LIKELY(elem_usual(em, k, g0, zzv[0], &b0, &l0) &&
			   elem_usual(em, k, g1, zzv[1], &b1, &l1))) {
			if (LIKELY(l0 + l1 <= 56)) {
				dcast_bw_put(&w, b0 | b1 << l0, l0 + l1);
			} else {
				dcast_bw_put(&w, b0, l0);
				dcast_bw_put(&w, b1, l1);
			}
		} else {
			put_any(&w, elem_any(em, i, g0));
			put_any(&w, elem_any(em, i + 1, g1));
		}
	}
	if (i < end)
		put_any(&w, elem_any(em, i, pos[i] - next));
	*wp = w;
}

static void emit_general(const emitter *em, uint64_t first, uint64_t end, dcast_bitwriter *w)
{
	const uint32_t *pos = em->ch->pos;
	uint32_t next = first ? pos[first - 1] + 1 : 0;
	for (uint64_t i = first; i < end; i++) {
		put_any(w, elem_any(em, i, pos[i] - next));
		next = pos[i] + 1;
	}
}

/* emit_coded built twice: for BMI2 and for any x86-64. */
DCAST_TARGET_BMI2 static void emit_coded_bmi2(const emitter *em, uint64_t first, uint64_t end,
					      dcast_bitwriter *w)
{
	emit_coded(em, first, end, w);
}

static void emit_coded_plain(const emitter *em, uint64_t first, uint64_t end, dcast_bitwriter *w)
{
	emit_coded(em, first, end, w);
}

static void emit_run(const emitter *em, uint64_t first, uint64_t end, dcast_bitwriter *w)
{
	if (em->p->mode != DCAST_CPT_CODED || em->p->k > FAST_KMAX)
		emit_general(em, first, end, w);
	else if (em->bmi2)
		emit_coded_bmi2(em, first, end, w);
	else
		emit_coded_plain(em, first, end, w);
}

uint64_t dcast_cpt_emit(const dcast_changes *ch, const dcast_cpt_plan *p, const void *cur,
			unsigned es, uint8_t *out)
{
	uint8_t *idx = out + dcast_cpt_hdr_bytes(p->mode, p->w);
	dcast_bitwriter w = { out + dcast_cpt_stream_off(p), out + dcast_cpt_stream_off(p), 0, 0 };
	emitter em = { .ch = ch, .p = p, .cur = cur, .es = es, .bmi2 = dcast_simd_bmi2() };
	dcast_cpt_hdr_write(p, out);
	if (p->mode == DCAST_CPT_CODED && p->k <= FAST_KMAX)
		usual_build(&em);
	for (uint64_t first = 0; first < ch->n; first += DCAST_CPT_BLOCK) {
		uint64_t end = ch->n - first < DCAST_CPT_BLOCK ? ch->n : first + DCAST_CPT_BLOCK;
		if (first) {
			uint8_t *e = idx + (first / DCAST_CPT_BLOCK - 1) * DCAST_CPT_INDEX_ENTRY;
			wr32le(e, (uint32_t)dcast_bw_tell(&w));
			wr32le(e + 4, ch->pos[first - 1]);
		}
		emit_run(&em, first, end, &w);
	}
	return dcast_bw_tell(&w) - p->val_bits;
}

/* The prefix-code lookup, filled symbol by symbol (the GPU fills it entry
 * by entry with dcast_cpt_lut_fill; both give the same table). */
void dcast_cpt_lut_build(const dcast_cpt_table *t, unsigned nsym, uint16_t *lut)
{
	memset(lut, 0, DCAST_CPT_LUT_SIZE * sizeof(*lut));
	for (unsigned s = 0; s < nsym; s++) {
		unsigned l = t->len[s];
		for (unsigned j = l ? t->code[s] : DCAST_CPT_LUT_SIZE; j < DCAST_CPT_LUT_SIZE; j += 1u << l)
			lut[j] = (uint16_t)(s << 4 | l);
	}
}

int dcast_cpt_fail(int enc, int e, uint64_t elem)
{
	return dcast_fail(DCAST_ECORRUPT, "%s payload, element %" PRIu64 ": %s", dcast_cpt_name(enc), elem,
			  dcast_cpt_errstr(e));
}

/* Block by block, checking each index entry against where the stream
 * actually is. */
static int cpt_decode_blocks(const dcast_cpt_dec *d, const uint8_t *idx, uint64_t changed,
			     uint32_t *pos, uint32_t *val)
{
	uint64_t bit = 0, next = 0;
	for (uint64_t b = 0; b * DCAST_CPT_BLOCK < changed; b++) {
		uint64_t first = b * DCAST_CPT_BLOCK;
		uint64_t n = changed - first < DCAST_CPT_BLOCK ? changed - first : DCAST_CPT_BLOCK;
		if (b) {
			const uint8_t *e = idx + (b - 1) * DCAST_CPT_INDEX_ENTRY;
			if (dcast_rd32le(e) != bit || (uint64_t)dcast_rd32le(e + 4) + 1 != next)
				return dcast_cpt_fail(DCAST_ENC_COMPACT, DCAST_CPT_EINDEX, first);
		}
		int e = dcast_cpt_decode_run(d, &bit, &next, n, pos + first, val ? val + first : NULL);
		if (e)
			return dcast_cpt_fail(DCAST_ENC_COMPACT, e, first);
	}
	int e = dcast_cpt_check_trail(d, bit);
	return e ? dcast_cpt_fail(DCAST_ENC_COMPACT, e, changed) : DCAST_OK;
}

/* Parse the header and find the stream: d (all but lut) and t filled.
 * v2's block index has an entry per 4096 changes, its stream is 16-bit
 * words. */
int dcast_cpt_open(const dcast_chunk_info *info, const uint8_t *payload, dcast_cpt_dec *d,
		    dcast_cpt_table *t)
{
	const char *name = dcast_cpt_name((int)info->encoding);
	int v2 = info->encoding == DCAST_ENC_COMPACT2;
	const char *bad = dcast_cpt_hdr_parse(payload, info->payload_bytes, 8 * info->elem_size, d, t);
	if (bad)
		return dcast_fail(DCAST_ECORRUPT, "%s payload: %s", name, bad);
	uint64_t off = dcast_cpt_hdr_bytes(d->mode, d->w) +
		       (v2 ? dcast_cpt2_index_bytes(info->changed) : dcast_cpt_index_bytes(info->changed));
	if (off > info->payload_bytes)
		return dcast_fail(DCAST_EPAYLOAD_SIZE, "%s payload: %" PRIu64 " bytes, header and block index need %" PRIu64,
				  name, info->payload_bytes, off);
	if (v2 && (info->payload_bytes - off) % 2)
		return dcast_fail(DCAST_EPAYLOAD_SIZE, "%s payload: %" PRIu64 " bytes after the block index, "
				  "not a whole number of 16-bit words", name, info->payload_bytes - off);
	d->stream = payload + off;
	d->stream_bytes = info->payload_bytes - off;
	d->count = info->count;
	d->lut = NULL;
	return DCAST_OK;
}

int dcast_cpt_decode_checked(const dcast_chunk_info *info, const uint8_t *payload, uint32_t *pos,
			     uint32_t *val, unsigned *mode)
{
	dcast_cpt_dec d;
	dcast_cpt_table t;
	uint16_t lut[DCAST_CPT_LUT_SIZE];
	int rc = dcast_cpt_open(info, payload, &d, &t);
	if (rc)
		return rc;
	d.lut = lut;
	if (d.mode == DCAST_CPT_CODED)
		dcast_cpt_lut_build(&t, dcast_cpt_nsym(d.w), lut);
	*mode = d.mode;
	return cpt_decode_blocks(&d, payload + dcast_cpt_hdr_bytes(d.mode, d.w), info->changed, pos, val);
}

int dcast_cpt_decode(const dcast_chunk_info *info, const uint8_t *payload, uint32_t *pos,
		     uint32_t *val, unsigned *mode)
{
	dcast_cpt_dec d;
	dcast_cpt_table t;
	int rc = dcast_cpt_open(info, payload, &d, &t);
	if (rc)
		return rc;
	*mode = d.mode;
	if (!dcast_cpt_decode_fast(&d, &t, payload + dcast_cpt_hdr_bytes(d.mode, d.w), info->changed, pos, val))
		return DCAST_OK;
	return dcast_cpt_decode_checked(info, payload, pos, val, mode);
}
