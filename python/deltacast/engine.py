"""Engine binding: map the trainer's unfused tensors onto a serving engine's
fused, sharded parameters, check that the mapping writes every engine
element exactly once, and bind each piece straight into the engine's
parameter storage (host or CUDA) with Consumer.bind_slice.

    ranks = Ranks(tp_rank=r, tp_size=4)
    layouts = [(r"qkv_proj\\.weight$", QKVParallel(32, 8, 128)),
               (r"gate_up_proj\\.weight$", MergedColumnParallel([11008, 11008])),
               (r"(o_proj|down_proj)\\.weight$", RowParallel()),
               (r"(embed_tokens|lm_head)\\.weight$", VocabParallel(32000))]
    p = plan(trainer_specs(consumer), dict(model.named_parameters()), layouts, ranks,
             stacked=stacked_params_mapping)         # vLLM's own table
    bind(consumer, p, dict(model.named_parameters()))

The core is pure: plan() turns names, shapes, dtypes and layouts into a
Plan (a list of Pieces: trainer name and box, engine parameter and box)
and refuses, naming both sides and their boxes, a dtype or shape
mismatch, two boxes that overlap, an engine element no box writes, a
trainer tensor that maps to no engine parameter, and an engine parameter
no trainer tensor maps to (unless `ignore` names them).  bind() only
makes views and calls bind_slice; nothing is copied at apply time.

Layouts follow vLLM (main branch, late 2026; the same layouts live in
SGLang's sglang/srt/layers, which copied them), read from:
  vllm/model_executor/layers/linear.py: ColumnParallelLinear (dim 0 split
    by TP rank), RowParallelLinear (weight dim 1 split, bias whole),
    MergedColumnParallelLinear (output_sizes stacked on dim 0, each split),
    QKVParallelLinear.weight_loader (q, then k, then v on dim 0; per rank
    num_heads // tp q heads and max(1, num_kv_heads // tp) kv heads; with
    fewer kv heads than ranks, rank r holds kv head r // (tp // num_kv_heads));
  vllm/model_executor/layers/vocab_parallel_embedding.py: pad_vocab_size
    (DEFAULT_VOCAB_PADDING_SIZE 64: the vocabulary is padded to a multiple
    of 64, then split evenly on dim 0; _get_indices: rank r holds rows
    [r * per, (r + 1) * per) of the padded table, of which those below the
    vocabulary size are real); weight_loader zero-fills the rest;
  vllm/model_executor/layers/fused_moe/layer.py: w13_weight
    [E_local, 2 * I / tp, H] (w1 = gate rows first, then w3 = up), w2_weight
    [E_local, H, I / tp] (split on dim 2); determine_expert_map "linear":
    EP rank r owns base * r + min(r, rem) .. + base (+1 when r < rem);
    with expert parallelism on, FusedMoEParallelConfig makes the experts'
    TP size 1 (each expert whole on its EP rank), else they split by TP;
    make_expert_params_mapping: (param_name, weight_name, expert_id,
    shard_id) such as ("experts.w13_", "experts.0.gate_proj.", 0, "w1");
  vllm/model_executor/models/llama.py: stacked_params_mapping, tuples
    (param_name, shard_name, shard_id) such as (".qkv_proj", ".q_proj", "q")
    and (".gate_up_proj", ".gate_proj", 0), applied with str.replace.

Padding rows (a vocabulary padded past its real size) are declared by
the layout, excluded from the exactly-once rule (no trainer tensor has
them, no box may write them) and zero-filled by bind(), as vLLM's own
loader does.  docs/engines.md shows the whole flow for vLLM and SGLang."""
from __future__ import annotations

import re
from typing import (Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple,
                    Union)

from . import _dtypes
from ._lib import fail

Box = Tuple[Tuple[int, ...], Tuple[int, ...]]  # (offset, extent)
Spec = Tuple[str, Tuple[int, ...]]            # (wire dtype, shape)


class Ranks(NamedTuple):
    """The worker's place: tensor-parallel rank and size, expert-parallel
    rank and size (vLLM: ep_size = tp * dp with --enable-expert-parallel,
    ep_rank = dp_rank * tp + tp_rank)."""
    tp_rank: int = 0
    tp_size: int = 1
    ep_rank: int = 0
    ep_size: int = 1


class Piece(NamedTuple):
    """One box of a trainer tensor bound onto one box of an engine
    parameter: same elements in the same row-major order (the extents
    equal once dims of extent 1 are dropped)."""
    trainer: str
    trainer_offset: Tuple[int, ...]
    trainer_extent: Tuple[int, ...]
    param: str
    param_offset: Tuple[int, ...]
    param_extent: Tuple[int, ...]


class Plan(NamedTuple):
    """What plan() found: pieces, padding boxes per parameter (zero-filled
    by bind), and the engine parameters it covers."""
    pieces: List[Piece]
    padding: List[Tuple[str, Tuple[int, ...], Tuple[int, ...]]]
    params: List[str]


def _mismatch(what: str, trainer: str, tshape: Sequence[int], param: str,
              pshape: Sequence[int]) -> Exception:
    return fail("DCAST_ESHAPE", f"engine mapping: trainer tensor {trainer} {tuple(tshape)} -> "
                                f"engine parameter {param} {tuple(pshape)}: {what}")


def _split(n: int, parts: int, what: str) -> int:
    if n % parts:
        raise ValueError(f"{what} {n} does not divide by {parts}")
    return n // parts


def _rows(tshape: Sequence[int], t0: int, p0: int, n: int) -> Tuple[Box, Box]:
    """Rows t0..t0+n of the trainer tensor onto rows p0..p0+n of the parameter
    (the other dims whole)."""
    rest = tuple(tshape[1:])
    zeros = (0,) * len(rest)
    return ((t0,) + zeros, (n,) + rest), ((p0,) + zeros, (n,) + rest)


class Layout:
    """How an engine parameter holds a trainer tensor on one rank.
    boxes(): [(trainer box, parameter box)] for `shard` (the shard id of
    the stacked or expert mapping, None for a plain tensor); padding():
    parameter boxes no trainer tensor writes.  A ValueError names what
    does not fit (plan() adds both names)."""
    takes_shards = False

    def boxes(self, shard: Any, tshape: Tuple[int, ...], pshape: Tuple[int, ...],
              ranks: Ranks) -> List[Tuple[Box, Box]]:
        raise NotImplementedError

    def padding(self, pshape: Tuple[int, ...], ranks: Ranks) -> List[Box]:
        return []


class Replicated(Layout):
    """Every rank holds the whole tensor (norms, routers, RowParallel biases)."""

    def boxes(self, shard, tshape, pshape, ranks):
        if tshape != pshape:
            raise ValueError("the shapes differ (a replicated parameter holds the whole tensor)")
        zeros = (0,) * len(tshape)
        return [((zeros, tshape), (zeros, pshape))]


class ColumnParallel(Layout):
    """ColumnParallelLinear: dim 0 (output features) split by TP rank."""

    def boxes(self, shard, tshape, pshape, ranks):
        n = _split(tshape[0], ranks.tp_size, "dim 0 of the trainer tensor")
        return [_rows(tshape, ranks.tp_rank * n, 0, n)]


class RowParallel(Layout):
    """RowParallelLinear: the weight's dim 1 (input features) split by TP
    rank; a 1-D bias is whole on every rank."""

    def boxes(self, shard, tshape, pshape, ranks):
        if len(tshape) < 2:
            return Replicated().boxes(shard, tshape, pshape, ranks)
        n = _split(tshape[1], ranks.tp_size, "dim 1 of the trainer tensor")
        off = (0, ranks.tp_rank * n) + (0,) * (len(tshape) - 2)
        ext = (tshape[0], n) + tuple(tshape[2:])
        return [((off, ext), ((0,) * len(pshape), ext))]


class MergedColumnParallel(Layout):
    """MergedColumnParallelLinear (gate_up_proj): the trainer tensors of
    `output_sizes` (full sizes) stacked on dim 0, each split by TP rank;
    shard ids 0, 1, ... (vLLM's stacked_params_mapping)."""
    takes_shards = True

    def __init__(self, output_sizes: Sequence[int]) -> None:
        self.output_sizes = [int(s) for s in output_sizes]

    def boxes(self, shard, tshape, pshape, ranks):
        if not isinstance(shard, int) or not 0 <= shard < len(self.output_sizes):
            raise ValueError(f"shard id {shard!r} is not one of 0..{len(self.output_sizes) - 1}")
        if tshape[0] != self.output_sizes[shard]:
            raise ValueError(f"shard {shard} has {self.output_sizes[shard]} rows in the layout")
        n = _split(tshape[0], ranks.tp_size, "dim 0 of the trainer tensor")
        at = sum(_split(s, ranks.tp_size, "an output size") for s in self.output_sizes[:shard])
        return [_rows(tshape, ranks.tp_rank * n, at, n)]


class QKVParallel(Layout):
    """QKVParallelLinear: q, k, v stacked on dim 0, shard ids "q", "k",
    "v"; heads are the model's totals."""
    takes_shards = True

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim

    def _local(self, tp: int) -> Tuple[int, int, int]:
        """(q heads, kv heads, kv replicas) per rank."""
        q = _split(self.num_heads, tp, "num_heads")
        if self.num_kv_heads >= tp:
            return q, _split(self.num_kv_heads, tp, "num_kv_heads"), 1
        return q, 1, _split(tp, self.num_kv_heads, "the TP size (kv heads replicated)")

    def boxes(self, shard, tshape, pshape, ranks):
        q, kv, replicas = self._local(ranks.tp_size)
        total = {"q": self.num_heads, "k": self.num_kv_heads, "v": self.num_kv_heads}
        if shard not in total:
            raise ValueError(f"shard id {shard!r} is not one of 'q', 'k', 'v'")
        if tshape[0] != total[shard] * self.head_dim:
            raise ValueError(f"{shard} has {total[shard]} heads of {self.head_dim} in the layout")
        hd = self.head_dim
        if shard == "q":
            return [_rows(tshape, ranks.tp_rank * q * hd, 0, q * hd)]
        head = ranks.tp_rank // replicas
        at = q * hd + (kv * hd if shard == "v" else 0)
        return [_rows(tshape, head * kv * hd, at, kv * hd)]


class VocabParallel(Layout):
    """VocabParallelEmbedding / ParallelLMHead: the vocabulary padded to a
    multiple of `padding_size`, split evenly on dim 0; the padding rows
    are padding (zero-filled, written by no trainer box)."""

    def __init__(self, vocab_size: int, padding_size: int = 64) -> None:
        self.vocab_size, self.padding_size = vocab_size, padding_size

    def _rows(self, ranks: Ranks) -> Tuple[int, int, int]:
        """(first vocabulary row, real rows, rows per rank) of this rank."""
        padded = -(-self.vocab_size // self.padding_size) * self.padding_size
        per = _split(padded, ranks.tp_size, f"the padded vocabulary ({self.vocab_size} ->)")
        start = ranks.tp_rank * per
        return start, max(0, min(start + per, self.vocab_size) - start), per

    def boxes(self, shard, tshape, pshape, ranks):
        if tshape[0] != self.vocab_size:
            raise ValueError(f"the layout's vocabulary has {self.vocab_size} rows")
        start, real, per = self._rows(ranks)
        if pshape[0] != per:
            raise ValueError(f"this rank holds {per} rows of the padded vocabulary")
        return [_rows(tshape, start, 0, real)] if real else []

    def padding(self, pshape, ranks):
        _, real, per = self._rows(ranks)
        if real == per:
            return []
        return [((real,) + (0,) * (len(pshape) - 1), (per - real,) + tuple(pshape[1:]))]


class FusedExperts(Layout):
    """FusedMoE's stacked experts: w13_weight takes shard ids (expert, "w1")
    (gate) and (expert, "w3") (up), w2_weight takes (expert, "w2") (down).
    By default (vLLM's rule) experts split by TP rank when ep_size is 1,
    else each is whole on the EP rank that owns it ("linear" placement).
    local_experts: the global expert ids this rank holds, in local order
    (another placement, e.g. from the layer's expert_map); moe_tp: the
    experts' own (TP rank, TP size) (SGLang's moe_tp_rank, moe_tp_size)."""
    takes_shards = True

    def __init__(self, num_experts: int, local_experts: Optional[Sequence[int]] = None,
                 moe_tp: Optional[Tuple[int, int]] = None) -> None:
        self.num_experts = num_experts
        self.local = list(local_experts) if local_experts is not None else None
        self.moe_tp = moe_tp

    def local_experts(self, ranks: Ranks) -> List[int]:
        """The global experts this rank holds, in local order."""
        if self.local is not None:
            return self.local
        base, rem = divmod(self.num_experts, ranks.ep_size)
        start = ranks.ep_rank * base + min(ranks.ep_rank, rem)
        return list(range(start, start + base + (1 if ranks.ep_rank < rem else 0)))

    def _tp(self, ranks: Ranks) -> Tuple[int, int]:
        """(TP size, TP rank) the experts split by."""
        if self.moe_tp is not None:
            return self.moe_tp[1], self.moe_tp[0]
        return (1, 0) if ranks.ep_size > 1 else (ranks.tp_size, ranks.tp_rank)

    def boxes(self, shard, tshape, pshape, ranks):
        if not (isinstance(shard, tuple) and len(shard) == 2 and shard[1] in ("w1", "w2", "w3")):
            raise ValueError(f"shard id {shard!r} is not (expert id, 'w1' | 'w2' | 'w3')")
        expert, w = shard
        if len(tshape) != 2:
            raise ValueError("an expert's weight is 2-D")
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert {expert} is not one of the layout's {self.num_experts}")
        mine = self.local_experts(ranks)
        if expert not in mine:
            return []  # another EP rank's expert
        tp, r = self._tp(ranks)
        local = mine.index(expert)
        if w == "w2":  # down [H, I]: dim 1 split, into [E, H, I / tp]
            n = _split(tshape[1], tp, "dim 1 of the trainer tensor")
            return [(((0, r * n), (tshape[0], n)), ((local, 0, 0), (1, tshape[0], n)))]
        n = _split(tshape[0], tp, "dim 0 of the trainer tensor")
        at = 0 if w == "w1" else n
        return [(((r * n, 0), (n, tshape[1])), ((local, at, 0), (1, n, tshape[1])))]


LayoutRules = Union[Mapping[str, Layout], Sequence[Tuple[str, Layout]]]


def _layout_of(param: str, rules: Sequence[Tuple[str, Layout]]) -> Layout:
    for pattern, layout in rules:
        if re.search(pattern, param):
            return layout
    return Replicated()


def engine_name(name: str, stacked: Iterable[Sequence[Any]] = (),
                experts: Iterable[Sequence[Any]] = ()) -> Tuple[str, Any]:
    """(engine parameter name, shard id) of trainer tensor `name`, by vLLM's
    expert mapping [(param_name, weight_name, expert_id, shard_id)] first,
    then its stacked_params_mapping [(param_name, shard_name, shard_id)],
    each applied as str.replace; (name, None) when neither matches."""
    for param_name, weight_name, expert_id, shard_id in experts:
        if weight_name in name:
            return name.replace(weight_name, param_name), (int(expert_id), shard_id)
    for param_name, shard_name, shard_id in stacked:
        if shard_name in name:
            return name.replace(shard_name, param_name), shard_id
    return name, None


def _spec(name: str, t: Any) -> Spec:
    """(wire dtype, shape) of a spec tuple, numpy array or torch tensor."""
    if isinstance(t, tuple) and len(t) == 2 and isinstance(t[0], str):
        return t[0].upper(), tuple(int(d) for d in t[1])
    wire = _dtypes.wire_of(t)
    if wire is None:
        raise fail("DCAST_EDTYPE", f"engine mapping: {name} is {_dtypes.dtype_str(t)}, which "
                                   "deltacast does not carry")
    return wire, _dtypes.shape_of(t)


def _inside(box: Box, shape: Tuple[int, ...]) -> bool:
    off, ext = box
    return len(off) == len(shape) and all(o + e <= s for o, e, s in zip(off, ext, shape))


def _pieces_of(tname: str, tspec: Spec, pname: str, param: Any, layout: Layout, shard: Any,
               ranks: Ranks) -> List[Piece]:
    """The pieces of one trainer tensor in one engine parameter, checked
    for dtype, shard and shape."""
    tdtype, tshape = tspec
    pshape = _dtypes.shape_of(param)
    if not _dtypes.holds(param, tdtype):
        raise fail("DCAST_EDTYPE", f"engine mapping: trainer tensor {tname} is {tdtype}, engine "
                                   f"parameter {pname} is {_dtypes.dtype_str(param)} (it must "
                                   f"be a {_dtypes.holders(tdtype)})")
    if (shard is not None) != layout.takes_shards:
        raise fail("DCAST_EINVAL", f"engine mapping: trainer tensor {tname} -> engine parameter "
                                   f"{pname} with shard id {shard!r}, but its layout "
                                   f"{type(layout).__name__} takes "
                                   f"{'shard ids' if layout.takes_shards else 'no shard id'}")
    try:
        boxes = layout.boxes(shard, tshape, pshape, ranks) if tshape else None
    except ValueError as e:
        raise _mismatch(f"{type(layout).__name__}: {e}", tname, tshape, pname, pshape) from None
    if boxes is None:
        raise _mismatch("a scalar has no boxes (map it as a 1-element tensor)", tname, tshape,
                        pname, pshape)
    out = []
    for tbox, pbox in boxes:
        if not _inside(tbox, tshape) or not _inside(pbox, pshape):
            raise _mismatch(f"the box offset {tbox[0]} extent {tbox[1]} -> offset {pbox[0]} "
                            f"extent {pbox[1]} does not fit", tname, tshape, pname, pshape)
        out.append(Piece(tname, tbox[0], tbox[1], pname, pbox[0], pbox[1]))
    return out


def _ignored(name: str, patterns: Sequence[str]) -> bool:
    return any(re.search(p, name) for p in patterns)


def plan(trainer: Mapping[str, Any], engine: Mapping[str, Any], layouts: LayoutRules = (),
         ranks: Ranks = Ranks(), *, stacked: Iterable[Sequence[Any]] = (),
         experts: Iterable[Sequence[Any]] = (), ignore: Sequence[str] = ()) -> Plan:
    """The mapping of trainer tensors onto one rank's engine parameters.

    trainer: name -> (wire dtype, shape), numpy array or torch tensor (the
    published tensors; trainer_specs(consumer) gives them).  engine: name ->
    the rank's parameter (numpy array or torch tensor; model.named_parameters()).
    layouts: {regex: Layout} or [(regex, Layout)], first match by re.search
    on the engine name; unmatched parameters are Replicated.  stacked,
    experts: vLLM's mapping tables (see engine_name()).  ignore: regexes of
    trainer tensors and engine parameters left out (rotary caches, tied
    heads).  Raises DeltacastArgumentError (DCAST_EDTYPE, DCAST_ESHAPE,
    DCAST_EINVAL) or DeltacastError (DCAST_ENOTFOUND) naming the trainer
    tensor, the engine parameter and the boxes; nothing is bound."""
    _check_ranks(ranks)
    rules = list(layouts.items()) if isinstance(layouts, Mapping) else list(layouts)
    stacked, experts = list(stacked), list(experts)
    pieces: List[Piece] = []
    covered: Dict[str, Layout] = {}
    for tname in trainer:
        if _ignored(tname, ignore):
            continue
        pname, shard = engine_name(tname, stacked, experts)
        if pname not in engine:
            raise fail("DCAST_ENOTFOUND", f"engine mapping: trainer tensor {tname} maps to engine "
                                          f"parameter {pname}, which the engine does not have "
                                          "(map it, or ignore it)")
        layout = _layout_of(pname, rules)
        pieces += _pieces_of(tname, _spec(tname, trainer[tname]), pname, engine[pname], layout,
                             shard, ranks)
        covered[pname] = layout
    padding = [(p, off, ext) for p, lay in covered.items()
               for off, ext in lay.padding(_dtypes.shape_of(engine[p]), ranks)]
    _check_coverage(engine, covered, pieces, padding, ignore)
    return Plan(pieces, padding, list(covered))


def _check_ranks(ranks: Ranks) -> None:
    for rank, size, what in ((ranks.tp_rank, ranks.tp_size, "tp"),
                             (ranks.ep_rank, ranks.ep_size, "ep")):
        if not (isinstance(size, int) and isinstance(rank, int) and size >= 1
                and 0 <= rank < size):
            raise fail("DCAST_EINVAL", f"engine mapping: {what}_rank {rank!r} must be in "
                                       f"[0, {what}_size) with {what}_size {size!r} >= 1")


def _volume(ext: Sequence[int]) -> int:
    n = 1
    for e in ext:
        n *= e
    return n


def _overlap(a: Box, b: Box) -> bool:
    return all(ao < bo + be and bo < ao + ae for ao, ae, bo, be in zip(a[0], a[1], b[0], b[1]))


def _describe_box(who: str, box: Box) -> str:
    return f"{who} -> offset {box[0]} extent {box[1]}"


def _check_coverage(engine: Mapping[str, Any], covered: Mapping[str, Layout],
                    pieces: List[Piece], padding: List[Tuple[str, Tuple[int, ...], Tuple[int, ...]]],
                    ignore: Sequence[str]) -> None:
    """Every element of every covered parameter written exactly once (or
    declared padding); every engine parameter covered or ignored."""
    for pname in engine:
        if pname not in covered and not _ignored(pname, ignore):
            raise fail("DCAST_EINVAL", f"engine mapping: engine parameter {pname} "
                                       f"{_dtypes.shape_of(engine[pname])} is written by no "
                                       "trainer tensor (map one to it, or ignore it)")
    boxes: Dict[str, List[Tuple[str, Box]]] = {p: [] for p in covered}
    for pc in pieces:
        boxes[pc.param].append((f"trainer tensor {pc.trainer} box offset {pc.trainer_offset} "
                                f"extent {pc.trainer_extent}",
                                (pc.param_offset, pc.param_extent)))
    for p, off, ext in padding:
        boxes[p].append(("padding rows", (off, ext)))
    for pname, owned in boxes.items():
        _check_exactly_once(pname, _dtypes.shape_of(engine[pname]), owned)


def _check_exactly_once(pname: str, shape: Tuple[int, ...], owned: List[Tuple[str, Box]]) -> None:
    """No two boxes overlap (a sweep on dim 0) and their volumes add up to
    the parameter's: then every element is written exactly once."""
    if not shape:
        return
    owned = sorted(owned, key=lambda o: o[1][0][0])
    active: List[Tuple[str, Box]] = []
    for who, box in owned:
        active = [a for a in active if a[1][0][0] + a[1][1][0] > box[0][0]]
        for other, obox in active:
            if _overlap(box, obox):
                raise fail("DCAST_ESHAPE", f"engine mapping: engine parameter {pname} {shape}: "
                                           f"{_describe_box(who, box)} overlaps "
                                           f"{_describe_box(other, obox)}")
        active.append((who, box))
    written = sum(_volume(b[1]) for _, b in owned)
    if written != _volume(shape):
        listed = "; ".join(_describe_box(who, b) for who, b in owned) or "none"
        raise fail("DCAST_ESHAPE", f"engine mapping: engine parameter {pname} {shape}: "
                                   f"{_volume(shape) - written} of {_volume(shape)} elements are "
                                   f"written by no trainer tensor (boxes: {listed})")


def _nonunit(ext: Sequence[int]) -> List[int]:
    return [d for d, e in enumerate(ext) if e != 1]


def contiguous_pieces(pc: Piece, pshape: Sequence[int]) -> List[Piece]:
    """`pc` cut into pieces whose parameter boxes are contiguous in the
    parameter's row-major storage (bind_slice binds contiguous memory):
    a box is contiguous when, before its last partial dim, every dim has
    extent 1.  Otherwise it is cut along its first dim of extent > 1 (and
    the trainer's dim in the same place among those of extent > 1)."""
    ext = pc.param_extent
    partial = [d for d in range(len(ext)) if ext[d] != pshape[d]]
    first = _nonunit(ext)
    if not partial or not first or first[0] >= partial[-1]:
        return [pc]
    pd = first[0]
    td = _nonunit(pc.trainer_extent)[0]
    out: List[Piece] = []
    for i in range(ext[pd]):
        toff, text, poff, pext = (list(pc.trainer_offset), list(pc.trainer_extent),
                                  list(pc.param_offset), list(ext))
        toff[td] += i
        text[td] = 1
        poff[pd] += i
        pext[pd] = 1
        out += contiguous_pieces(Piece(pc.trainer, tuple(toff), tuple(text), pc.param,
                                       tuple(poff), tuple(pext)), pshape)
    return out


# ---- binding: views of the engine's storage ----

def trainer_specs(consumer: Any) -> Dict[str, Spec]:
    """{name: (wire dtype, shape)} of every tensor the consumer's model publishes."""
    return {n: consumer.describe(n) for n in consumer.names()}


def _view(param: Any, off: Sequence[int], ext: Sequence[int]) -> Any:
    t = param.data if hasattr(param, "data") and _dtypes.is_torch(param) else param
    return t[tuple(slice(o, o + e) for o, e in zip(off, ext))]


def _reshaped(view: Any, shape: Tuple[int, ...]) -> Any:
    """`view` (contiguous) in another shape, sharing its memory."""
    if _dtypes.is_torch(view):
        return view.view(shape)
    out = view.view()
    out.shape = shape  # raises rather than copy
    return out


def bind(consumer: Any, p: Plan, engine: Mapping[str, Any]) -> int:
    """Bind every piece of plan `p` into views of the engine's parameters
    (consumer.bind_slice; non-contiguous boxes are cut first) and zero-fill
    the padding boxes.  The parameters must stay alive and keep their
    storage until the consumer closes or unbinds.  Returns the number of
    bind_slice calls.  Errors: as Consumer.bind_slice."""
    for pname, off, ext in p.padding:
        _view(engine[pname], off, ext)[...] = 0
    calls = 0
    for pc in p.pieces:
        pshape = _dtypes.shape_of(engine[pc.param])
        for part in contiguous_pieces(pc, pshape):
            view = _view(engine[part.param], part.param_offset, part.param_extent)
            consumer.bind_slice(part.trainer, _reshaped(view, part.trainer_extent),
                                part.trainer_offset)
            calls += 1
    return calls


# ---- a worker rank: consumer, plan and binding together ----

class EngineWorker:
    """One engine rank's deltacast consumer, bound into its parameters.

    Opens a Consumer (broker, model, dir and `consumer` keywords as for
    Consumer), waits up to timeout_ms for the broker's WELCOME (a worker
    restarted on its dir while the broker is down raises DeltacastError
    DCAST_ECLOSED naming the broker, rather than serve the version in dir
    unconfirmed) and for the manifest, plans the mapping (params, layouts,
    ranks, stacked, experts, ignore as for plan()) and binds it.
    apply(version) then brings the parameters to `version` in place;
    apply_all_ranks(agreement) moves every rank of the engine to the
    newest version all of them hold READY (deltacast.worker); unbind()
    and rebind(params) follow the engine through a model reload.  On any
    error the consumer is closed and nothing stays bound.  Used by
    deltacast.vllm and deltacast.sglang."""

    def __init__(self, broker: str, model: str, dir: str, params: Mapping[str, Any],
                 layouts: LayoutRules = (), ranks: Ranks = Ranks(), *,
                 stacked: Iterable[Sequence[Any]] = (), experts: Iterable[Sequence[Any]] = (),
                 ignore: Sequence[str] = (), timeout_ms: int = 60000, **consumer: Any) -> None:
        import threading
        from .consumer import Consumer
        self.timeout_ms = timeout_ms
        self._mapping = dict(layouts=layouts, ranks=ranks, stacked=list(stacked),
                             experts=list(experts), ignore=ignore)
        self._state, self._applying = threading.Lock(), False
        self.consumer = Consumer(broker, model, dir, **consumer)
        try:
            self.consumer.wait_confirmed(timeout_ms)
            self._wait_manifest()
            self._bind(params)
        except BaseException:
            self.consumer.close()
            raise

    def _bind(self, params: Mapping[str, Any]) -> None:
        self.plan = plan(trainer_specs(self.consumer), params, **self._mapping)
        self.binds = bind(self.consumer, self.plan, params)

    def _set_applying(self, on: bool, what: str) -> None:
        with self._state:
            if on and self._applying:
                raise fail("DCAST_ESTATE", f"engine worker: {what} while an apply runs on another "
                                           "thread; call it between applies")
            self._applying = on

    def unbind(self) -> None:
        """Drop the binding into the engine's parameters (before the engine
        reloads its model into new storage); the consumer keeps the current
        version in its own memory and keeps staging.  Versions READY or
        staged stay and apply as usual; rebind() binds the new storage.
        Errors: DeltacastError DCAST_ESTATE while apply() or
        apply_all_ranks() runs on another thread."""
        self._set_applying(True, "unbind()")
        try:
            self.consumer.unbind()
            self.binds = 0
        finally:
            self._set_applying(False, "")

    def rebind(self, params: Any, layouts: Optional[LayoutRules] = None) -> None:
        """After a model reload: bind the new parameters (a {name: tensor}
        mapping, or a vLLM / SGLang torch model, whose layouts come from
        module_layouts() unless given) as the first bind did, unbinding the
        old ones first if still bound; the parameters then hold the version
        the consumer holds (apply() moves them on).  Errors: those of
        plan() and bind() (nothing stays bound then), DCAST_ESTATE as for
        unbind()."""
        if hasattr(params, "named_parameters"):
            layouts = module_layouts(params) if layouts is None else layouts
            params = dict(params.named_parameters())
        if layouts is not None:
            self._mapping["layouts"] = layouts
        self._set_applying(True, "rebind()")
        try:
            if self.binds:
                self.consumer.unbind()
                self.binds = 0
            try:
                self._bind(params)
            except BaseException:
                self.consumer.unbind()
                self.binds = 0
                raise
        finally:
            self._set_applying(False, "")

    def _deadline(self, timeout_ms: Optional[int]) -> float:
        import time
        ms = self.timeout_ms if timeout_ms is None else timeout_ms
        return time.monotonic() + ms / 1000.0

    def _wait_manifest(self) -> None:
        import time
        end = self._deadline(None)
        while not self.consumer.names():
            if time.monotonic() > end:
                raise fail("DCAST_ETIMEDOUT", f"engine worker: no manifest from the broker in "
                                              f"{self.timeout_ms} ms")
            self.consumer.poll(50)

    @property
    def version(self) -> Optional[int]:
        """The version the engine's parameters hold (None before the first,
        and while the broker has not confirmed it)."""
        return self.consumer.version

    def apply_all_ranks(self, agreement: Any, version: Optional[int] = None,
                        timeout_ms: Optional[int] = None) -> Any:
        """At a pause point, on every rank of the engine (a collective):
        apply the newest version every rank holds READY, in one apply()
        each, or none; returns deltacast.worker.Served (the version the
        engine serves, every rank's).  With `version` (the same on every
        rank): each rank first waits up to timeout_ms (default: the
        worker's) for it to be READY (or held) here, then every rank moves
        to it and never past it; when some rank does not have it in time,
        every rank raises DeltacastError DCAST_ETIMEDOUT naming the version
        the engine serves and each rank's, and none moved to it (the ranks
        may all move to a common version below it).  See deltacast.worker."""
        from .worker import apply_all_ranks
        self._set_applying(True, "apply_all_ranks()")
        try:
            if version is not None:
                self._wait_reachable(version, timeout_ms)
            served = apply_all_ranks(self.consumer, agreement, upto=version)
        finally:
            self._set_applying(False, "")
        if version is not None and served.version is not None and served.version > version:
            raise fail("DCAST_ESTATE", f"all ranks or none: asked for version {version}, the "
                                       f"engine serves {served.version} already")
        if version is not None and served.version != version:
            raise fail("DCAST_ETIMEDOUT", f"all ranks or none: version {version} is not READY on "
                                          f"every rank in time; the engine serves "
                                          f"{served.version} (the ranks hold {served.ranks})")
        return served

    def _wait_reachable(self, version: int, timeout_ms: Optional[int]) -> None:
        """Until this rank holds `version` or has it READY, or the time is
        up (the collective then tells every rank)."""
        import time
        end, c = self._deadline(timeout_ms), self.consumer
        while time.monotonic() < end:
            held = c.version
            if c.confirmed and (held == version or version in c.ready_versions()):
                return
            if held is not None and held > version:
                return
            c.poll(50)

    def apply(self, version: int, timeout_ms: Optional[int] = None) -> None:
        """Apply READY versions up to `version` (the engine's pause: no
        forward may run), waiting up to timeout_ms (default: the worker's)
        for it to be staged.  DeltacastTimeout when it does not come,
        DeltacastError when the consumer refuses it or an error event
        arrives; the parameters then hold the last version applied whole."""
        self._set_applying(True, "apply()")
        try:
            self._apply(version, timeout_ms)
        finally:
            self._set_applying(False, "")

    def _apply(self, version: int, timeout_ms: Optional[int]) -> None:
        import time
        end = self._deadline(timeout_ms)
        c = self.consumer
        while c.version != version:
            if c.version is not None and c.version > version:
                raise fail("DCAST_ESTATE", f"engine worker: asked for version {version}, the "
                                           f"parameters already hold {c.version}")
            ready = c.ready_version
            if ready is not None:
                c.apply(ready if ready < version else version)
                continue
            if time.monotonic() > end:
                raise fail("DCAST_ETIMEDOUT", f"engine worker: version {version} was not ready "
                                              f"in time (holding {c.version})")
            ev = c.poll(100)
            if ev is not None and ev.type == "error":
                raise fail("DCAST_ESTATE", f"engine worker: {ev.text} (code {ev.code}) while "
                                           f"waiting for version {version}")

    def close(self) -> None:
        """Close the consumer; the parameters keep their values."""
        self.consumer.close()


# ---- layouts read off an engine's torch modules (vLLM and SGLang) ----

def _class_names(m: Any) -> List[str]:
    return [k.__name__ for k in type(m).__mro__]


def _experts_layout(m: Any) -> Layout:
    """FusedMoE (vLLM: global_num_experts, expert_map, tp_rank/tp_size of
    the experts; SGLang: num_experts, moe_ep_rank, moe_tp_rank/_size)."""
    total = getattr(m, "global_num_experts", None) or m.num_experts
    emap = getattr(m, "expert_map", None)
    if emap is not None:
        local = [int(g) for g in sorted(range(total), key=lambda g: int(emap[g])) if emap[g] >= 0]
    elif hasattr(m, "moe_ep_rank"):
        n = m.num_local_experts
        local = list(range(m.moe_ep_rank * n, (m.moe_ep_rank + 1) * n))
    else:
        local = None
    if hasattr(m, "moe_tp_rank"):
        tp = (int(m.moe_tp_rank), int(m.moe_tp_size))
    else:
        tp = (int(m.tp_rank), int(m.tp_size))
    return FusedExperts(int(total), local, tp)


def _module_layout(m: Any) -> Optional[Tuple[str, Layout]]:
    """(parameter suffix regex, Layout) of a vLLM / SGLang layer, or None."""
    names = _class_names(m)
    if "QKVParallelLinear" in names:
        return r"(weight|bias)", QKVParallel(m.total_num_heads, m.total_num_kv_heads, m.head_size)
    if "MergedColumnParallelLinear" in names:
        return r"(weight|bias)", MergedColumnParallel(m.output_sizes)
    if "ColumnParallelLinear" in names:
        return r"(weight|bias)", ColumnParallel()
    if "RowParallelLinear" in names:
        return r"(weight|bias)", RowParallel()
    if "VocabParallelEmbedding" in names:
        if m.num_embeddings != m.org_vocab_size:
            raise fail("DCAST_EINVAL", "engine mapping: a vocabulary with added (LoRA) rows "
                                       "is not supported")
        return r"weight", VocabParallel(m.org_vocab_size, m.padding_size)
    if "FusedMoE" in names:
        return r"(w13|w2)_weight", _experts_layout(m)
    return None


def module_layouts(model: Any) -> List[Tuple[str, Layout]]:
    """[(regex, Layout)] for every parallel layer of a vLLM or SGLang torch
    model, by the layers' class names (QKVParallelLinear,
    MergedColumnParallelLinear, ColumnParallelLinear, RowParallelLinear,
    VocabParallelEmbedding and ParallelLMHead, FusedMoE) and the sizes
    they keep; other parameters are Replicated.  Quantized layers are not
    covered.  Written from the engines' sources (not run here)."""
    out = []
    for prefix, m in model.named_modules():
        found = _module_layout(m)
        if found is not None:
            out.append((rf"^{re.escape(prefix)}\.{found[0]}$", found[1]))
    return out


def stacked_from_packed(packed_modules_mapping: Mapping[str, Sequence[str]]) -> List[Tuple[str, str, Any]]:
    """vLLM's stacked_params_mapping from a model's packed_modules_mapping
    ({"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj":
    ["gate_proj", "up_proj"]}): shard ids "q", "k", "v" for a qkv
    parameter, 0, 1, ... otherwise."""
    out: List[Tuple[str, str, Any]] = []
    for param, parts in packed_modules_mapping.items():
        ids: Sequence[Any] = "qkv" if "qkv" in param and len(parts) == 3 else range(len(parts))
        out += [(f".{param}", f".{part}", i) for part, i in zip(parts, ids)]
    return out


def open_module_worker(module: Any, broker: str, model: str, dir: str, ranks: Ranks, *,
                       stacked: Optional[Iterable[Sequence[Any]]] = None,
                       experts: Optional[Iterable[Sequence[Any]]] = None,
                       ignore: Sequence[str] = (), **kw: Any) -> EngineWorker:
    """An EngineWorker for a vLLM or SGLang torch model: layouts from
    module_layouts(), parameters from named_parameters(), the stacked
    table from the model's packed_modules_mapping and the expert table
    from its get_expert_mapping() unless given.  kw: as EngineWorker."""
    if stacked is None:
        stacked = stacked_from_packed(getattr(module, "packed_modules_mapping", None) or {})
    if experts is None:
        experts = module.get_expert_mapping() if hasattr(module, "get_expert_mapping") else ()
    return EngineWorker(broker, model, dir, dict(module.named_parameters()),
                        module_layouts(module), ranks, stacked=stacked, experts=experts,
                        ignore=ignore, **kw)
