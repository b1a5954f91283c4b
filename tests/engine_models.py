"""Tiny numpy models in the trainer's unfused layout and in vLLM's fused,
sharded layout, for the engine-binding tests (tests/test_engine_*.py).

A Llama (fused qkv with biases, merged gate_up, row-parallel o and down,
padded vocabulary-parallel embedding and head) and a MoE (the same
attention, a replicated router and FusedMoE-style stacked w13 / w2
experts).  Every weight is a small integer (-2..2, norms 1..2) stored
exactly in bf16 or f32, inputs are token ids, and every activation is
clipped to [-8, 8]: every sum the forward computes is a sum of integers
below 2**24, exact in float32 in any order.  So an engine forward that
gathers the ranks' column-parallel outputs and adds their row-parallel
partial sums (in rank order, as an all-reduce would) must equal the
unfused forward bit for bit when, and only when, every rank holds the
right elements."""
import numpy as np

from deltacast.engine import (FusedExperts, MergedColumnParallel, QKVParallel, Ranks, RowParallel,
                              VocabParallel)

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 70, 16, 4, 2, 4
INTER, EXPERTS, TOP_K, MOE_INTER, LAYERS = 32, 4, 2, 8, 2
CLIP = 8.0
PADDED_VOCAB = 128  # 70 padded to a multiple of 64

# vLLM's tables for Llama and Mixtral-style models
STACKED = [(".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"),
           (".qkv_proj", ".v_proj", "v"), (".gate_up_proj", ".gate_proj", 0),
           (".gate_up_proj", ".up_proj", 1)]
EXPERT_MAP = [("experts.w13_" if w in ("gate_proj", "up_proj") else "experts.w2_",
               f"experts.{e}.{w}.", e, s)
              for e in range(EXPERTS) for s, w in (("w1", "gate_proj"), ("w2", "down_proj"),
                                                   ("w3", "up_proj"))]
LAYOUTS = [(r"qkv_proj\.(weight|bias)$", QKVParallel(HEADS, KV_HEADS, HEAD_DIM)),
           (r"gate_up_proj\.weight$", MergedColumnParallel([INTER, INTER])),
           (r"(o_proj|down_proj)\.weight$", RowParallel()),
           (r"(embed_tokens|lm_head)\.weight$", VocabParallel(VOCAB)),
           (r"experts\.w(13|2)_weight$", FusedExperts(EXPERTS))]


def bf16(f):
    """float32 values exactly representable in bf16 -> bf16 bit patterns."""
    return (np.asarray(f, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def f32(a):
    """An array of bf16 bits (uint16) or float32 as float32."""
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def trainer_model(kind, seed):
    """{HF name: array} of the unfused trainer model (bf16 as uint16 bits)."""
    rng = np.random.default_rng(seed)

    def w(*shape, dtype="bf16", lo=-2, hi=2):
        v = rng.integers(lo, hi + 1, size=shape).astype(np.float32)
        return bf16(v) if dtype == "bf16" else v

    m = {"model.embed_tokens.weight": w(VOCAB, HIDDEN), "model.norm.weight": w(HIDDEN, dtype="f32", lo=1),
         "lm_head.weight": w(VOCAB, HIDDEN)}
    for l in range(LAYERS if kind == "llama" else 1):
        p = f"model.layers.{l}."
        m[p + "input_layernorm.weight"] = w(HIDDEN, dtype="f32", lo=1)
        m[p + "post_attention_layernorm.weight"] = w(HIDDEN, dtype="f32", lo=1)
        for n, heads in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
            m[p + f"self_attn.{n}_proj.weight"] = w(heads * HEAD_DIM, HIDDEN)
            m[p + f"self_attn.{n}_proj.bias"] = w(heads * HEAD_DIM, dtype="f32")
        m[p + "self_attn.o_proj.weight"] = w(HIDDEN, HEADS * HEAD_DIM)
        if kind == "llama":
            m[p + "mlp.gate_proj.weight"] = w(INTER, HIDDEN)
            m[p + "mlp.up_proj.weight"] = w(INTER, HIDDEN)
            m[p + "mlp.down_proj.weight"] = w(HIDDEN, INTER)
            continue
        m[p + "mlp.gate.weight"] = w(EXPERTS, HIDDEN, dtype="f32")
        for e in range(EXPERTS):
            m[p + f"mlp.experts.{e}.gate_proj.weight"] = w(MOE_INTER, HIDDEN, dtype="f32")
            m[p + f"mlp.experts.{e}.up_proj.weight"] = w(MOE_INTER, HIDDEN, dtype="f32")
            m[p + f"mlp.experts.{e}.down_proj.weight"] = w(HIDDEN, MOE_INTER, dtype="f32")
    return m


def step(model, rng, dense):
    """One optimizer step in place: a few elements (or, dense, every one)
    move to another allowed value."""
    for name, a in model.items():
        norm = name.endswith("norm.weight")
        v = f32(a)
        if dense:
            new = (3 - v) if norm else ((v + 3) % 5 - 2)  # 1 <-> 2; every -2..2 moves
        else:
            new = np.where(rng.random(v.shape) < 0.03,
                           rng.integers(1 if norm else -2, 3, size=v.shape), v)
        a[...] = bf16(new) if a.dtype == np.uint16 else new.astype(np.float32)


def engine_ranks(tp, ep, rank):
    return Ranks(tp_rank=rank, tp_size=tp, ep_rank=rank if ep > 1 else 0, ep_size=ep)


def engine_shapes(kind, tp, ep):
    """{vLLM name: (numpy dtype, shape)} of one rank's engine model."""
    ql, kvl = HEADS // tp, max(1, KV_HEADS // tp)
    per = PADDED_VOCAB // tp
    s = {"model.embed_tokens.weight": ("uint16", (per, HIDDEN)),
         "model.norm.weight": ("float32", (HIDDEN,)), "lm_head.weight": ("uint16", (per, HIDDEN))}
    mtp = 1 if ep > 1 else tp
    for l in range(LAYERS if kind == "llama" else 1):
        p = f"model.layers.{l}."
        s[p + "input_layernorm.weight"] = ("float32", (HIDDEN,))
        s[p + "post_attention_layernorm.weight"] = ("float32", (HIDDEN,))
        s[p + "self_attn.qkv_proj.weight"] = ("uint16", ((ql + 2 * kvl) * HEAD_DIM, HIDDEN))
        s[p + "self_attn.qkv_proj.bias"] = ("float32", ((ql + 2 * kvl) * HEAD_DIM,))
        s[p + "self_attn.o_proj.weight"] = ("uint16", (HIDDEN, ql * HEAD_DIM))
        if kind == "llama":
            s[p + "mlp.gate_up_proj.weight"] = ("uint16", (2 * INTER // tp, HIDDEN))
            s[p + "mlp.down_proj.weight"] = ("uint16", (HIDDEN, INTER // tp))
            continue
        s[p + "mlp.gate.weight"] = ("float32", (EXPERTS, HIDDEN))
        s[p + "mlp.experts.w13_weight"] = ("float32", (EXPERTS // ep, 2 * MOE_INTER // mtp, HIDDEN))
        s[p + "mlp.experts.w2_weight"] = ("float32", (EXPERTS // ep, HIDDEN, MOE_INTER // mtp))
    return s


def poisoned(shapes):
    """Engine parameters filled with NaN (bf16 0x7fc1), so an element no
    piece writes shows."""
    return {n: np.full(shape, 0x7FC1 if dt == "uint16" else np.nan, dtype=dt)
            for n, (dt, shape) in shapes.items()}


def _clip(x):
    return np.clip(x, -CLIP, CLIP)


def _attention(q, k, v, heads, kv_heads):
    """Per token and head, q * k + v of the head's kv group (a stand-in for
    attention with the same head grouping)."""
    t = q.shape[0]
    q = q.reshape(t, heads, HEAD_DIM)
    k, v = k.reshape(t, kv_heads, HEAD_DIM), v.reshape(t, kv_heads, HEAD_DIM)
    g = np.arange(heads) // (heads // kv_heads)
    return _clip(q * k[:, g] + v[:, g]).reshape(t, heads * HEAD_DIM)


def _mlp(h, gate, up, down):
    return _clip(np.maximum(h @ f32(gate).T, 0) * (h @ f32(up).T)) @ f32(down).T


def _top(h, router):
    return np.argsort(-(h @ f32(router).T), axis=1, kind="stable")[:, :TOP_K]


def trainer_forward(m, ids, kind):
    """The unfused model's logits [tokens, VOCAB]."""
    x = f32(m["model.embed_tokens.weight"])[ids]
    for l in range(LAYERS if kind == "llama" else 1):
        p = f"model.layers.{l}."
        h = x * m[p + "input_layernorm.weight"]
        q, k, v = (h @ f32(m[p + f"self_attn.{n}_proj.weight"]).T + m[p + f"self_attn.{n}_proj.bias"]
                   for n in "qkv")
        x = x + _clip(_attention(q, k, v, HEADS, KV_HEADS) @ f32(m[p + "self_attn.o_proj.weight"]).T)
        h = x * m[p + "post_attention_layernorm.weight"]
        if kind == "llama":
            x = x + _clip(_mlp(h, m[p + "mlp.gate_proj.weight"], m[p + "mlp.up_proj.weight"],
                               m[p + "mlp.down_proj.weight"]))
            continue
        top = _top(h, m[p + "mlp.gate.weight"])
        out = np.zeros_like(x)
        for e in range(EXPERTS):
            rows = (top == e).any(axis=1)
            ex = p + f"mlp.experts.{e}."
            out[rows] += _mlp(h[rows], m[ex + "gate_proj.weight"], m[ex + "up_proj.weight"],
                              m[ex + "down_proj.weight"])
        x = x + _clip(out)
    return (x * m["model.norm.weight"]) @ f32(m["lm_head.weight"]).T


def _replicated(ranks, name):
    """A replicated parameter, the same bits on every rank."""
    for e in ranks[1:]:
        assert np.array_equal(e[name].view(np.uint8), ranks[0][name].view(np.uint8)), name
    return ranks[0][name]


def _embed(ranks, ids, tp):
    """VocabParallelEmbedding: each rank looks up the ids in its rows,
    zeros elsewhere; the ranks' results are added (all-reduce)."""
    per = PADDED_VOCAB // tp
    x = np.zeros((len(ids), HIDDEN), np.float32)
    for r, e in enumerate(ranks):
        mine = (ids >= r * per) & (ids < (r + 1) * per)
        x[mine] += f32(e["model.embed_tokens.weight"])[ids[mine] - r * per]
    return x


def _engine_attention(ranks, p, h, tp):
    ql, kvl = HEADS // tp, max(1, KV_HEADS // tp)
    total = np.zeros_like(h)
    for e in ranks:  # column-parallel qkv, row-parallel o: partial sums in rank order
        qkv = h @ f32(e[p + "self_attn.qkv_proj.weight"]).T + e[p + "self_attn.qkv_proj.bias"]
        q, k, v = np.split(qkv, [ql * HEAD_DIM, (ql + kvl) * HEAD_DIM], axis=1)
        total += _attention(q, k, v, ql, kvl) @ f32(e[p + "self_attn.o_proj.weight"]).T
    return _clip(total)


def _engine_moe(ranks, p, h, tp, ep):
    top = _top(h, _replicated(ranks, p + "mlp.gate.weight"))
    total = np.zeros_like(h)
    for r, e in enumerate(ranks):
        mine = FusedExperts(EXPERTS).local_experts(engine_ranks(tp, ep, r))
        w13, w2 = e[p + "mlp.experts.w13_weight"], e[p + "mlp.experts.w2_weight"]
        n = w13.shape[1] // 2
        for local, g in enumerate(mine):
            rows = (top == g).any(axis=1)
            total[rows] += _mlp(h[rows], w13[local, :n], w13[local, n:], w2[local])
    return _clip(total)


def engine_forward(ranks, ids, kind, tp, ep):
    """Logits [tokens, VOCAB] from the ranks' engine parameters, gathered
    the way the engine combines them; checks the padding rows are zero."""
    x = _embed(ranks, ids, tp)
    for l in range(LAYERS if kind == "llama" else 1):
        p = f"model.layers.{l}."
        x = x + _engine_attention(ranks, p, x * _replicated(ranks, p + "input_layernorm.weight"), tp)
        h = x * _replicated(ranks, p + "post_attention_layernorm.weight")
        if kind == "moe":
            x = x + _engine_moe(ranks, p, h, tp, ep)
            continue
        total = np.zeros_like(h)
        for e in ranks:
            gate, up = np.split(e[p + "mlp.gate_up_proj.weight"], 2)
            total += _mlp(h, gate, up, e[p + "mlp.down_proj.weight"])
        x = x + _clip(total)
    x = x * _replicated(ranks, "model.norm.weight")
    logits = np.concatenate([x @ f32(e["lm_head.weight"]).T for e in ranks], axis=1)
    assert not logits[:, VOCAB:].any(), "padding rows of lm_head are not zero"
    return logits[:, :VOCAB]
