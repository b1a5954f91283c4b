/* The CPU delta codec: encode a range against its baseline (one compare
 * pass, then the chosen encoding), and check-then-apply or revert a payload.
 * Apply validates the whole payload before it writes one byte of dst. */
#include <inttypes.h>
#include <string.h>
#include "codec_cpt2.h"
#include "dcast_batch.h"
#include "dcast_common.h"

const char *dcast_encoding_name(int encoding)
{
	static const char *names[DCAST_ENC_COMPACT] = { "dense", "idx32", "bitmask" };
	if (encoding >= DCAST_ENC_COMPACT && encoding < DCAST_ENC_COUNT)
		return dcast_cpt_name(encoding);
	return encoding >= 0 && encoding < DCAST_ENC_COMPACT ? names[encoding] : "?";
}

size_t dcast_codec_bound(uint64_t count, unsigned elem_size)
{
	unsigned es = elem_size == 1 || elem_size == 2 ? elem_size : 4;
	return (size_t)(count * (4 + es) + count / 8 + 64);
}

static int check_range(uint64_t count, unsigned es)
{
	if (es != 1 && es != 2 && es != 4)
		return dcast_fail(DCAST_EINVAL, "codec: elem_size %u is not 1, 2 or 4", es);
	if (count > DCAST_MAX_CHUNK_ELEMS)
		return dcast_fail(DCAST_EINVAL, "codec: count %" PRIu64 " exceeds DCAST_MAX_CHUNK_ELEMS (%u)",
				  count, DCAST_MAX_CHUNK_ELEMS);
	return DCAST_OK;
}

/* Sizes of every encoding; the compact plan is completed as a side effect.
 * With `exact` 0 the compact sizes are upper bounds (v1's from the
 * position bits' bound, v2 at most a word a lane more per block): encode
 * learns the exact ones from the emitter (encode_auto) and skips a pass. */
static void all_sizes(const dcast_changes *ch, uint64_t count, unsigned es, int exact,
		      dcast_cpt_plan *plan, uint64_t sizes[DCAST_ENC_COUNT])
{
	dcast_simple_sizes(count, es, ch->n, sizes);
	dcast_cpt_plan_make(&ch->stats, 8 * es, plan);
	plan->pos_bits = dcast_cpt_pos_bits_bound(&ch->stats, plan->k);
	sizes[DCAST_ENC_COMPACT] = dcast_cpt_bytes(plan);
	sizes[DCAST_ENC_COMPACT2] = sizes[DCAST_ENC_COMPACT] + dcast_cpt2_nblocks(ch->n) * DCAST_CPT2_LANES * 2;
	if (!exact)
		return;
	sizes[DCAST_ENC_COMPACT2] = dcast_cpt2_size(ch, plan, &plan->pos_bits);
	sizes[DCAST_ENC_COMPACT] = dcast_cpt_bytes(plan);
}

int dcast_codec_check_encode(uint64_t count, unsigned es, int force, size_t out_cap)
{
	int rc = check_range(count, es);
	if (rc)
		return rc;
	if (force >= DCAST_ENC_COUNT)
		return dcast_fail(DCAST_EINVAL, "codec: unknown encoding %d", force);
	if (out_cap < dcast_codec_bound(count, es))
		return dcast_fail(DCAST_EINVAL, "codec: out_cap %zu below dcast_codec_bound() = %zu",
				  out_cap, dcast_codec_bound(count, es));
	return DCAST_OK;
}

static void emit_idx32(const dcast_changes *ch, const uint8_t *cur, unsigned es, uint8_t *out)
{
	for (uint64_t i = 0; i < ch->n; i++, out += 4 + es) {
		memcpy(out, &ch->pos[i], 4);
		memcpy(out + 4, cur + (uint64_t)ch->pos[i] * es, es);
	}
}

static void emit_bitmask(const dcast_changes *ch, const uint8_t *cur, uint64_t count, unsigned es,
			 uint8_t *out)
{
	uint64_t mb = dcast_bitmask_bytes(count);
	memset(out, 0, mb);
	for (uint64_t i = 0; i < ch->n; i++) {
		out[ch->pos[i] >> 3] |= (uint8_t)(1u << (ch->pos[i] & 7));
		memcpy(out + mb + i * es, cur + (uint64_t)ch->pos[i] * es, es);
	}
}

/* Write the payload; returns its exact size. */
static uint64_t emit(int enc, const dcast_changes *ch, dcast_cpt_plan *plan, const void *cur,
		     uint64_t count, unsigned es, const uint64_t sizes[DCAST_ENC_COUNT], uint8_t *out)
{
	switch (enc) {
	case DCAST_ENC_DENSE: memcpy(out, cur, count * es); break;
	case DCAST_ENC_IDX32: emit_idx32(ch, cur, es, out); break;
	case DCAST_ENC_BITMASK: emit_bitmask(ch, cur, count, es, out); break;
	case DCAST_ENC_COMPACT2: return dcast_cpt2_emit(ch, plan, cur, es, out, &plan->pos_bits);
	default:
		plan->pos_bits = dcast_cpt_emit(ch, plan, cur, es, out);
		return dcast_cpt_bytes(plan);
	}
	return sizes[enc];
}

/* The bounds chose a compact encoding: v2 is written first, which makes
 * both compact sizes exact (same codes, same position bits), then what
 * the exact sizes choose is written over it unless that is v2. */
static uint64_t encode_auto(const dcast_changes *ch, dcast_cpt_plan *plan, const void *cur, uint64_t count,
			    unsigned es, uint64_t sizes[DCAST_ENC_COUNT], uint8_t *out, int *enc)
{
	uint64_t bytes = emit(DCAST_ENC_COMPACT2, ch, plan, cur, count, es, sizes, out);
	*enc = DCAST_ENC_COMPACT2;
	if (!bytes)
		return 0;
	sizes[DCAST_ENC_COMPACT2] = bytes;
	sizes[DCAST_ENC_COMPACT] = dcast_cpt_bytes(plan);
	*enc = dcast_pick_smallest(sizes);
	return *enc == DCAST_ENC_COMPACT2 ? bytes : emit(*enc, ch, plan, cur, count, es, sizes, out);
}

static int encode_anchor(const void *cur, uint64_t count, unsigned es, int force, void *out,
			 dcast_chunk_info *info)
{
	if (force >= 0 && force != DCAST_ENC_DENSE)
		return dcast_fail(DCAST_EINVAL, "codec: an anchor (base NULL) is dense, not %s",
				  dcast_encoding_name(force));
	memcpy(out, cur, count * es);
	*info = (dcast_chunk_info){ DCAST_ENC_DENSE, es, count, count, count * es };
	return DCAST_OK;
}

static inline __attribute__((always_inline)) void update_base_es(const dcast_changes *ch,
								  const uint8_t *cur, uint8_t *base,
								  unsigned es, uint8_t *old, dcast_ld_move *d)
{
	for (uint64_t i = 0; i < ch->n; i++) {
		uint64_t at = (uint64_t)ch->pos[i] * es;
		uint32_t o = dcast_load_elem(base + at, es), n = dcast_load_elem(cur + at, es);
		if (old)
			dcast_store_elem(old + i * es, es, o);
		dcast_store_elem(base + at, es, n);
		if (d)
			dcast_ld_move_add(d, ch->pos[i], o, n);
	}
}

/* One loop per element size and digest or none, so each element is a
 * single move, not a call. */
static void update_base(const dcast_changes *ch, const uint8_t *cur, uint8_t *base, unsigned es,
			uint8_t *old, dcast_ld_move *d)
{
	if (d) {
		switch (es) {
		case 1: update_base_es(ch, cur, base, 1, old, d); return;
		case 2: update_base_es(ch, cur, base, 2, old, d); return;
		default: update_base_es(ch, cur, base, 4, old, d); return;
		}
	}
	switch (es) {
	case 1: update_base_es(ch, cur, base, 1, old, NULL); return;
	case 2: update_base_es(ch, cur, base, 2, old, NULL); return;
	default: update_base_es(ch, cur, base, 4, old, NULL); return;
	}
}

/* Where DCAST_ENCODE_SAVE_OLD puts the old values; NULL (and an error) when
 * out has no room for them. */
static uint8_t *old_values_at(int enc, const dcast_changes *ch, uint64_t count, unsigned es,
			      uint64_t bytes, uint8_t *out, size_t out_cap)
{
	uint64_t at = (bytes + 7) & ~(uint64_t)7;
	uint64_t need = (enc == DCAST_ENC_DENSE ? count : ch->n) * es;
	if (at > out_cap || need > out_cap - at) {
		dcast_fail(DCAST_EINVAL, "codec: out_cap %zu has no room for %" PRIu64
			   " bytes of old values past a %" PRIu64 "-byte payload", out_cap, need, bytes);
		return NULL;
	}
	return out + at;
}

/* Without DCAST_ENCODE_COMPACT2, the choice among 0..3: compact when its
 * bound is already the smallest (the emitter learns its exact size),
 * else its exact size set against the others. */
static int pick_v1(const dcast_changes *ch, dcast_cpt_plan *plan, uint64_t sizes[DCAST_ENC_COUNT])
{
	sizes[DCAST_ENC_COMPACT2] = UINT64_MAX;
	if (dcast_pick_smallest(sizes) == DCAST_ENC_COMPACT)
		return DCAST_ENC_COMPACT;
	plan->pos_bits = dcast_cpt_pos_bits(ch, plan->k);
	sizes[DCAST_ENC_COMPACT] = dcast_cpt_bytes(plan);
	return dcast_pick_smallest(sizes);
}

static int encode_delta(const void *cur, void *base, uint64_t count, unsigned elem_size, int force_encoding,
			unsigned flags, void *out, size_t out_cap, dcast_chunk_info *info, dcast_ld_move *d)
{
	int rc;
	dcast_changes ch;
	dcast_cpt_plan plan;
	uint64_t sizes[DCAST_ENC_COUNT];
	if ((rc = dcast_scan(cur, base, count, elem_size, &ch)))
		return rc;
	all_sizes(&ch, count, elem_size, 0, &plan, sizes);
	int v2 = force_encoding < 0 && (flags & DCAST_ENCODE_COMPACT2);
	int enc = force_encoding >= 0 ? force_encoding : v2 ? dcast_pick_smallest(sizes) : pick_v1(&ch, &plan, sizes);
	uint64_t bytes = v2 && enc >= DCAST_ENC_COMPACT
				 ? encode_auto(&ch, &plan, cur, count, elem_size, sizes, out, &enc)
				 : emit(enc, &ch, &plan, cur, count, elem_size, sizes, out);
	uint8_t *old = NULL;
	if (!bytes && enc == DCAST_ENC_COMPACT2)
		return dcast_fail(DCAST_ENOMEM, "codec: no memory for a compact2 block's lanes");
	if ((flags & DCAST_ENCODE_UPDATE_BASE) && (flags & DCAST_ENCODE_SAVE_OLD) &&
	    !(old = old_values_at(enc, &ch, count, elem_size, bytes, out, out_cap)))
		return DCAST_EINVAL;
	if (old && enc == DCAST_ENC_DENSE)
		memcpy(old, base, count * elem_size); /* dense: revert wants the whole range */
	if (flags & DCAST_ENCODE_UPDATE_BASE)
		update_base(&ch, cur, base, elem_size, enc == DCAST_ENC_DENSE ? NULL : old, d);
	*info = (dcast_chunk_info){ (uint32_t)enc, elem_size, count, ch.n, bytes };
	return DCAST_OK;
}

int dcast_codec_encode(const void *cur, void *base, uint64_t count, unsigned elem_size,
		       int force_encoding, unsigned flags, void *out, size_t out_cap,
		       dcast_chunk_info *info)
{
	int rc = dcast_codec_check_encode(count, elem_size, force_encoding, out_cap);
	if (rc)
		return rc;
	if (!base)
		return encode_anchor(cur, count, elem_size, force_encoding, out, info);
	return encode_delta(cur, base, count, elem_size, force_encoding, flags, out, out_cap, info, NULL);
}

int dcast_codec_encode_digest(const void *cur, void *base, uint64_t count, unsigned elem_size,
			      int force_encoding, unsigned flags, void *out, size_t out_cap,
			      dcast_chunk_info *info, uint32_t tensor, uint64_t start, uint64_t *digest)
{
	dcast_ld_move d;
	int rc = dcast_codec_check_encode(count, elem_size, force_encoding, out_cap);

	if (rc)
		return rc;
	if (!base || !digest || !(flags & DCAST_ENCODE_UPDATE_BASE))
		return dcast_fail(DCAST_EINVAL, "codec encode_digest: %s", !base ? "base is NULL (an anchor)"
								  : !digest ? "digest is NULL"
									    : "flags lack DCAST_ENCODE_UPDATE_BASE");
	dcast_ld_move_init(&d, tensor, start);
	if ((rc = encode_delta(cur, base, count, elem_size, force_encoding, flags, out, out_cap, info, &d)))
		return rc;
	*digest += d.acc;
	return DCAST_OK;
}

int dcast_codec_sizes(const void *cur, const void *base, uint64_t count, unsigned elem_size,
		      uint64_t sizes[DCAST_ENC_COUNT], uint64_t *changed)
{
	int rc = check_range(count, elem_size);
	if (rc)
		return rc;
	if (!base)
		return dcast_fail(DCAST_EINVAL, "codec sizes: base is NULL");
	dcast_changes ch;
	dcast_cpt_plan plan;
	if ((rc = dcast_scan(cur, base, count, elem_size, &ch)))
		return rc;
	all_sizes(&ch, count, elem_size, 1, &plan, sizes);
	*changed = ch.n;
	return DCAST_OK;
}

/* ---- checks shared by apply and revert ---- */

int dcast_codec_check_info(const dcast_chunk_info *info, const void *payload, const void *dst)
{
	int rc = check_range(info->count, info->elem_size);
	if (rc)
		return rc;
	if (info->encoding >= DCAST_ENC_COUNT)
		return dcast_fail(DCAST_EINVAL, "codec: unknown encoding %u", info->encoding);
	if (info->changed > info->count)
		return dcast_fail(DCAST_ECORRUPT, "codec: changed %" PRIu64 " exceeds count %" PRIu64,
				  info->changed, info->count);
	if ((!payload && info->payload_bytes) || (!dst && info->count))
		return dcast_fail(DCAST_EINVAL, "codec: NULL payload or dst");
	return DCAST_OK;
}

int dcast_codec_check_size(const dcast_chunk_info *info, uint64_t want)
{
	if (info->payload_bytes == want)
		return DCAST_OK;
	return dcast_fail(DCAST_EPAYLOAD_SIZE, "%s payload: %" PRIu64 " bytes, expected %" PRIu64,
			  dcast_encoding_name((int)info->encoding), info->payload_bytes, want);
}

int dcast_idx32_check(const dcast_chunk_info *info, const uint8_t *pl)
{
	unsigned es = info->elem_size;
	int rc = dcast_codec_check_size(info, info->changed * (4 + es));
	uint64_t next = 0;
	for (uint64_t i = 0; !rc && i < info->changed; i++) {
		uint32_t p = dcast_rd32le(pl + i * (4 + es));
		if (p >= info->count)
			return dcast_fail(DCAST_ECORRUPT, "idx32 payload: element %" PRIu64 " position %u >= count %" PRIu64,
					  i, p, info->count);
		if (p < next)
			return dcast_fail(DCAST_ECORRUPT, "idx32 payload: element %" PRIu64 " position %u not above the previous",
					  i, p);
		next = (uint64_t)p + 1;
	}
	return rc;
}

int dcast_bitmask_check(const dcast_chunk_info *info, const uint8_t *pl)
{
	uint64_t mb = dcast_bitmask_bytes(info->count), ones = 0;
	int rc = dcast_codec_check_size(info, mb + info->changed * info->elem_size);
	if (rc)
		return rc;
	for (uint64_t i = 0; i < mb; i++)
		ones += (unsigned)__builtin_popcount(pl[i]);
	if ((info->count & 7) && (pl[mb - 1] >> (info->count & 7)))
		return dcast_fail(DCAST_ECORRUPT, "bitmask payload: bits past count %" PRIu64 " are set",
				  info->count);
	if (ones != info->changed)
		return dcast_fail(DCAST_ECORRUPT, "bitmask payload: %" PRIu64 " bits set, changed says %" PRIu64,
				  ones, info->changed);
	return DCAST_OK;
}

int dcast_cpt_check_changed(const dcast_chunk_info *info)
{
	/* Every element costs at least 2 bits: refuse before allocating. */
	if (info->changed > info->payload_bytes * 4)
		return dcast_fail(DCAST_ECORRUPT, "compact payload: %" PRIu64 " bytes cannot hold %" PRIu64 " changes",
				  info->payload_bytes, info->changed);
	return DCAST_OK;
}

int dcast_cpt_load(const dcast_chunk_info *info, const uint8_t *pl, dcast_cpt_decoded *dec)
{
	int rc = dcast_cpt_check_changed(info);

	if (rc)
		return rc;
	size_t n = info->changed ? info->changed : 1;
	dec->pos = dcast_scratch(DCAST_SCRATCH_DEC_POS, (n + DCAST_PREFETCH_AHEAD) * 4);
	dec->val = dcast_scratch(DCAST_SCRATCH_DEC_VAL, n * 4);
	if (!dec->pos || !dec->val)
		return dcast_fail(DCAST_ENOMEM, "compact payload: no memory for %" PRIu64 " changes", info->changed);
	memset(dec->pos + info->changed, 0, DCAST_PREFETCH_AHEAD * 4); /* prefetched, never written */
	if (info->encoding == DCAST_ENC_COMPACT2)
		return dcast_cpt2_decode(info, pl, dec->pos, dec->val, &dec->mode);
	return dcast_cpt_decode(info, pl, dec->pos, dec->val, &dec->mode);
}

/* ---- writers, run only after the checks passed ---- */

static inline void swap_elem(uint8_t *d, unsigned es, uint32_t v, uint8_t *old_out, uint64_t i)
{
	if (old_out)
		memcpy(old_out + i * es, d, es);
	dcast_store_elem(d, es, v);
}

static void idx32_write(const dcast_chunk_info *info, const uint8_t *pl, uint8_t *dst,
			uint8_t *old_out, const uint8_t *old)
{
	unsigned es = info->elem_size;
	for (uint64_t i = 0; i < info->changed; i++) {
		const uint8_t *r = pl + i * (4 + es);
		uint8_t *d = dst + (uint64_t)dcast_rd32le(r) * es;
		swap_elem(d, es, dcast_load_elem(old ? old + i * es : r + 4, es), old_out, i);
	}
}

static void bitmask_write(const dcast_chunk_info *info, const uint8_t *pl, uint8_t *dst,
			  uint8_t *old_out, const uint8_t *old)
{
	unsigned es = info->elem_size;
	uint64_t mb = dcast_bitmask_bytes(info->count), i = 0;
	const uint8_t *vals = old ? old : pl + mb;
	for (uint64_t byte = 0; byte < mb; byte++) {
		for (unsigned bits = pl[byte]; bits; bits &= bits - 1, i++) {
			uint64_t p = byte * 8 + (unsigned)__builtin_ctz(bits);
			swap_elem(dst + p * es, es, dcast_load_elem(vals + i * es, es), old_out, i);
		}
	}
}

static inline __attribute__((always_inline)) void cpt_write_es(const dcast_chunk_info *info,
								const dcast_cpt_decoded *dec, uint8_t *dst,
								uint8_t *old_out, const uint8_t *old,
								unsigned es)
{
	for (uint64_t i = 0; i < info->changed; i++) {
		uint8_t *d = dst + (uint64_t)dec->pos[i] * es;
		/* the positions are known ahead: fetch their lines early (pos[]
		 * has slack past changed, see dcast_cpt_load) */
		__builtin_prefetch(dst + (uint64_t)dec->pos[i + DCAST_PREFETCH_AHEAD] * es, 1);
		uint32_t v = old ? dcast_load_elem(old + i * es, es)
			   : dec->mode == DCAST_CPT_RAW ? dec->val[i]
							: dcast_ulp_apply(dcast_load_elem(d, es), dec->val[i], 8 * es);
		swap_elem(d, es, v, old_out, i);
	}
}

/* The common apply (coded differences, nothing saved) without the
 * per-element choices of cpt_write_es. */
static inline __attribute__((always_inline)) void cpt_add_es(uint64_t changed, const dcast_cpt_decoded *dec,
							      uint8_t *dst, unsigned es)
{
	const uint32_t *pos = dec->pos, *val = dec->val;
	for (uint64_t i = 0; i < changed; i++) {
		uint8_t *d = dst + (uint64_t)pos[i] * es;
		__builtin_prefetch(dst + (uint64_t)pos[i + DCAST_PREFETCH_AHEAD] * es, 1);
		dcast_store_elem(d, es, dcast_ulp_apply(dcast_load_elem(d, es), val[i], 8 * es));
	}
}

static void cpt_write(const dcast_chunk_info *info, const dcast_cpt_decoded *dec, uint8_t *dst,
		      uint8_t *old_out, const uint8_t *old)
{
	if (!old && !old_out && dec->mode == DCAST_CPT_CODED) {
		switch (info->elem_size) {
		case 1: cpt_add_es(info->changed, dec, dst, 1); return;
		case 2: cpt_add_es(info->changed, dec, dst, 2); return;
		default: cpt_add_es(info->changed, dec, dst, 4); return;
		}
	}
	switch (info->elem_size) {
	case 1: cpt_write_es(info, dec, dst, old_out, old, 1); break;
	case 2: cpt_write_es(info, dec, dst, old_out, old, 2); break;
	default: cpt_write_es(info, dec, dst, old_out, old, 4); break;
	}
}

static void idx32_positions(const dcast_chunk_info *info, const uint8_t *pl, uint32_t *pos)
{
	for (uint64_t i = 0; i < info->changed; i++)
		pos[i] = dcast_rd32le(pl + i * (4 + info->elem_size));
}

static void bitmask_positions(const dcast_chunk_info *info, const uint8_t *pl, uint32_t *pos)
{
	uint64_t mb = dcast_bitmask_bytes(info->count), i = 0;

	for (uint64_t byte = 0; byte < mb; byte++)
		for (unsigned bits = pl[byte]; bits; bits &= bits - 1)
			pos[i++] = (uint32_t)(byte * 8 + (unsigned)__builtin_ctz(bits));
}

/* Check the payload, then write new values (old == NULL) or the saved old
 * ones (revert). */
static int apply_or_revert(const dcast_chunk_info *info, const uint8_t *pl, uint8_t *dst,
			   uint8_t *old_out, const uint8_t *old, uint32_t *pos_out)
{
	int rc = dcast_codec_check_info(info, pl, dst);
	uint64_t dense = info->count * info->elem_size;
	dcast_cpt_decoded dec;
	if (rc)
		return rc;
	switch (info->encoding) {
	case DCAST_ENC_DENSE:
		if ((rc = dcast_codec_check_size(info, dense)))
			return rc;
		if (old_out && dense)
			memcpy(old_out, dst, dense);
		if (dense)
			memcpy(dst, old ? old : pl, dense);
		return DCAST_OK;
	case DCAST_ENC_IDX32:
		if ((rc = dcast_idx32_check(info, pl)))
			return rc;
		idx32_write(info, pl, dst, old_out, old);
		if (pos_out)
			idx32_positions(info, pl, pos_out);
		return DCAST_OK;
	case DCAST_ENC_BITMASK:
		if ((rc = dcast_bitmask_check(info, pl)))
			return rc;
		bitmask_write(info, pl, dst, old_out, old);
		if (pos_out)
			bitmask_positions(info, pl, pos_out);
		return DCAST_OK;
	default:
		if ((rc = dcast_cpt_load(info, pl, &dec)))
			return rc;
		cpt_write(info, &dec, dst, old_out, old);
		if (pos_out && info->changed)
			memcpy(pos_out, dec.pos, info->changed * 4);
		return DCAST_OK;
	}
}

/* ---- resolving a payload against its range, before apply ---- */

static inline __attribute__((always_inline)) void resolve_one(uint64_t i, uint32_t p, uint32_t newv,
							       const uint8_t *range, uint32_t *pos,
							       uint8_t *old_vals, uint8_t *new_vals, dcast_ld_move *d,
							       unsigned es)
{
	uint32_t o = dcast_load_elem(range + (uint64_t)p * es, es);

	pos[i] = p;
	dcast_store_elem(old_vals + i * es, es, o);
	dcast_store_elem(new_vals + i * es, es, newv);
	if (d)
		dcast_ld_move_add(d, p, o, newv);
}

static void idx32_resolve(const dcast_chunk_info *info, const uint8_t *pl, const uint8_t *range, uint32_t *pos,
			  uint8_t *old_vals, uint8_t *new_vals, dcast_ld_move *d)
{
	unsigned es = info->elem_size;

	for (uint64_t i = 0; i < info->changed; i++) {
		const uint8_t *r = pl + i * (4 + es);
		resolve_one(i, dcast_rd32le(r), dcast_load_elem(r + 4, es), range, pos, old_vals, new_vals, d, es);
	}
}

static void bitmask_resolve(const dcast_chunk_info *info, const uint8_t *pl, const uint8_t *range,
			    uint32_t *pos, uint8_t *old_vals, uint8_t *new_vals, dcast_ld_move *d)
{
	unsigned es = info->elem_size;
	uint64_t mb = dcast_bitmask_bytes(info->count), i = 0;

	for (uint64_t byte = 0; byte < mb; byte++)
		for (unsigned bits = pl[byte]; bits; bits &= bits - 1, i++)
			resolve_one(i, (uint32_t)(byte * 8 + (unsigned)__builtin_ctz(bits)),
				    dcast_load_elem(pl + mb + i * es, es), range, pos, old_vals, new_vals, d, es);
}

/* The compact loop, per element size, with and without a digest: the
 * hash runs while the next old values are on their way from memory. */
static inline __attribute__((always_inline)) void cpt_resolve_es(uint64_t changed, const dcast_cpt_decoded *dec,
								  const uint8_t *range, uint32_t *pos,
								  uint8_t *old_vals, uint8_t *new_vals, dcast_ld_move *d,
								  unsigned es)
{
	for (uint64_t i = 0; i < changed; i++) {
		uint32_t p = dec->pos[i];
		uint32_t o = dcast_load_elem(range + (uint64_t)p * es, es);
		__builtin_prefetch(range + (uint64_t)dec->pos[i + DCAST_PREFETCH_AHEAD] * es);
		resolve_one(i, p, dec->mode == DCAST_CPT_RAW ? dec->val[i] : dcast_ulp_apply(o, dec->val[i], 8 * es),
			    range, pos, old_vals, new_vals, d, es);
	}
}

static void cpt_resolve_any(uint64_t n, const dcast_cpt_decoded *dec, const uint8_t *range, uint32_t *pos,
			    uint8_t *old_vals, uint8_t *new_vals, dcast_ld_move *d, unsigned es)
{
	if (d) {
		switch (es) {
		case 1: cpt_resolve_es(n, dec, range, pos, old_vals, new_vals, d, 1); return;
		case 2: cpt_resolve_es(n, dec, range, pos, old_vals, new_vals, d, 2); return;
		default: cpt_resolve_es(n, dec, range, pos, old_vals, new_vals, d, 4); return;
		}
	}
	switch (es) {
	case 1: cpt_resolve_es(n, dec, range, pos, old_vals, new_vals, NULL, 1); return;
	case 2: cpt_resolve_es(n, dec, range, pos, old_vals, new_vals, NULL, 2); return;
	default: cpt_resolve_es(n, dec, range, pos, old_vals, new_vals, NULL, 4); return;
	}
}

static int cpt_resolve(const dcast_chunk_info *info, const uint8_t *pl, const uint8_t *range, uint32_t *pos,
		       uint8_t *old_vals, uint8_t *new_vals, dcast_ld_move *d)
{
	dcast_cpt_decoded dec;
	int rc = dcast_cpt_load(info, pl, &dec);

	if (!rc)
		cpt_resolve_any(info->changed, &dec, range, pos, old_vals, new_vals, d, info->elem_size);
	return rc;
}

static int resolve_any(const dcast_chunk_info *info, const uint8_t *pl, const uint8_t *range, uint32_t *pos,
		       uint8_t *old_vals, uint8_t *new_vals, dcast_ld_move *d)
{
	int rc;

	switch (info->encoding) {
	case DCAST_ENC_DENSE:
		return dcast_fail(DCAST_EINVAL, "codec resolve: a dense payload names no positions");
	case DCAST_ENC_IDX32:
		if (!(rc = dcast_idx32_check(info, pl)))
			idx32_resolve(info, pl, range, pos, old_vals, new_vals, d);
		return rc;
	case DCAST_ENC_BITMASK:
		if (!(rc = dcast_bitmask_check(info, pl)))
			bitmask_resolve(info, pl, range, pos, old_vals, new_vals, d);
		return rc;
	default:
		return cpt_resolve(info, pl, range, pos, old_vals, new_vals, d);
	}
}

int dcast_codec_resolve(const dcast_chunk_info *info, const void *payload, const void *range, uint32_t *pos,
			void *old_vals, void *new_vals, uint32_t tensor, uint64_t start, uint64_t *digest)
{
	dcast_ld_move d;
	int rc = dcast_codec_check_info(info, payload, range);

	if (rc)
		return rc;
	if (info->changed && (!pos || !old_vals || !new_vals))
		return dcast_fail(DCAST_EINVAL, "codec resolve: NULL array for %" PRIu64 " changes", info->changed);
	dcast_ld_move_init(&d, tensor, start);
	if ((rc = resolve_any(info, payload, range, pos, old_vals, new_vals, digest ? &d : NULL)))
		return rc;
	if (digest)
		*digest += d.acc;
	return DCAST_OK;
}

/* idx32 and bitmask payloads carry new values: codes of mode RAW. */
static void raw_codes(const uint8_t *vals, uint64_t stride, uint64_t n, unsigned es, uint32_t *code)
{
	for (uint64_t i = 0; i < n; i++)
		code[i] = dcast_load_elem(vals + i * stride, es);
}

static int decode_sparse(const dcast_chunk_info *info, const uint8_t *pl, uint32_t *pos, uint32_t *code,
			 unsigned *mode)
{
	unsigned es = info->elem_size;
	dcast_cpt_decoded dec;
	int rc;

	*mode = DCAST_BATCH_RAW;
	switch (info->encoding) {
	case DCAST_ENC_DENSE:
		return dcast_fail(DCAST_EINVAL, "codec decode: a dense payload names no positions");
	case DCAST_ENC_IDX32:
		if (!(rc = dcast_idx32_check(info, pl))) {
			idx32_positions(info, pl, pos);
			raw_codes(pl + 4, 4 + es, info->changed, es, code);
		}
		return rc;
	case DCAST_ENC_BITMASK:
		if (!(rc = dcast_bitmask_check(info, pl))) {
			bitmask_positions(info, pl, pos);
			raw_codes(pl + dcast_bitmask_bytes(info->count), es, info->changed, es, code);
		}
		return rc;
	default:
		if ((rc = dcast_cpt_load(info, pl, &dec)) || !info->changed)
			return rc;
		memcpy(pos, dec.pos, info->changed * 4);
		memcpy(code, dec.val, info->changed * 4);
		*mode = dec.mode == DCAST_CPT_RAW ? DCAST_BATCH_RAW : DCAST_BATCH_ULP;
		return DCAST_OK;
	}
}

int dcast_batch_decode(const dcast_chunk_info *info, const void *payload, uint32_t *pos, uint32_t *code,
		       unsigned *mode)
{
	int rc = dcast_codec_check_info(info, payload, payload ? payload : (const void *)pos);

	if (rc)
		return rc;
	if (info->changed && (!pos || !code))
		return dcast_fail(DCAST_EINVAL, "codec decode: NULL array for %" PRIu64 " changes", info->changed);
	return decode_sparse(info, payload, pos, code, mode);
}

static inline __attribute__((always_inline)) void scatter_es(const uint32_t *pos, const uint8_t *vals, uint64_t n,
							      uint8_t *dst, unsigned es)
{
	for (uint64_t i = 0; i < n; i++) {
		if (i + DCAST_PREFETCH_AHEAD < n)
			__builtin_prefetch(dst + (uint64_t)pos[i + DCAST_PREFETCH_AHEAD] * es, 1);
		memcpy(dst + (uint64_t)pos[i] * es, vals + i * es, es);
	}
}

void dcast_codec_scatter(const uint32_t *pos, const void *vals, uint64_t n, unsigned elem_size, void *dst)
{
	switch (elem_size) {
	case 1: scatter_es(pos, vals, n, dst, 1); break;
	case 2: scatter_es(pos, vals, n, dst, 2); break;
	default: scatter_es(pos, vals, n, dst, 4); break;
	}
}

int dcast_codec_apply(const dcast_chunk_info *info, const void *payload, void *dst, void *old_out)
{
	return apply_or_revert(info, payload, dst, old_out, NULL, NULL);
}

int dcast_codec_apply_positions(const dcast_chunk_info *info, const void *payload, void *dst, void *old_out,
				uint32_t *pos_out)
{
	return apply_or_revert(info, payload, dst, old_out, NULL, pos_out);
}

int dcast_codec_revert(const dcast_chunk_info *info, const void *payload, void *dst,
		       const void *old)
{
	uint64_t need = info->encoding == DCAST_ENC_DENSE ? info->count : info->changed;
	if (!old && need)
		return dcast_fail(DCAST_EINVAL, "codec revert: old is NULL");
	return apply_or_revert(info, payload, dst, NULL, old ? old : "", NULL);
}

