"""deltacast.engine.plan refuses broken mappings at bind time, without a
broker, naming the trainer tensor, the engine parameter and the boxes:
two boxes that overlap, engine elements no box writes, a dtype or shape
mismatch, a trainer tensor that maps to no engine parameter, an engine
parameter that nothing maps to, a shard id the layout does not take, bad
ranks.  It also checks the boxes vLLM's layouts give (kv heads replicated
at TP 4, a rank whose vocabulary rows are all padding, experts on
another EP rank) and that contiguous_pieces cuts a box that is not
contiguous in the engine's storage into pieces holding the same
elements."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

import engine_models as M  # noqa: E402
from test_producer_python import raises  # noqa: E402
from deltacast import DeltacastArgumentError, DeltacastError  # noqa: E402
from deltacast.engine import (ColumnParallel, MergedColumnParallel, Piece, Ranks,  # noqa: E402
                              contiguous_pieces, plan, stacked_from_packed)

QKV = "model.layers.0.self_attn.qkv_proj.weight"


def specs(model):
    return {n: ("BF16" if a.dtype == np.uint16 else "F32", a.shape) for n, a in model.items()}


def llama(tp=1, rank=0, **kw):
    """plan() of the tiny Llama for one rank; kw replaces arguments."""
    args = dict(trainer=specs(M.trainer_model("llama", 1)),
                engine=M.poisoned(M.engine_shapes("llama", tp, 1)), layouts=M.LAYOUTS,
                ranks=Ranks(rank, tp), stacked=M.STACKED)
    args.update(kw)
    return plan(args.pop("trainer"), args.pop("engine"), args.pop("layouts"), args.pop("ranks"),
                **args)


def check_layouts():
    p = llama(4, 3)  # TP 4: 1 q head per rank; 2 kv heads, each on 2 ranks
    got = {pc.trainer: pc for pc in p.pieces if pc.param == QKV}
    q, k, v = (got[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qkv")
    assert q.trainer_offset == (12, 0) and q.param_offset == (0, 0) and q.param_extent == (4, 16)
    assert k.trainer_offset == (4, 0) and k.param_offset == (4, 0)  # kv head 3 // 2 = 1
    assert v.trainer_offset == (4, 0) and v.param_offset == (8, 0)
    # vocabulary 70 padded to 128, 32 rows per rank: rank 3 holds padding only
    assert not [pc for pc in p.pieces if pc.param == "lm_head.weight"]
    assert ("lm_head.weight", (0, 0), (32, 16)) in p.padding
    p = llama(4, 2)
    lm = [pc for pc in p.pieces if pc.param == "lm_head.weight"]
    assert [(pc.trainer_offset, pc.trainer_extent) for pc in lm] == [((64, 0), (6, 16))]
    assert ("lm_head.weight", (6, 0), (26, 16)) in p.padding
    # EP 2: rank 1 holds experts 2 and 3 whole; experts 0 and 1 are not its own
    moe = plan(specs(M.trainer_model("moe", 1)), M.poisoned(M.engine_shapes("moe", 2, 2)),
               M.LAYOUTS, Ranks(1, 2, 1, 2), stacked=M.STACKED, experts=M.EXPERT_MAP)
    w13 = sorted((pc.param_offset, pc.trainer) for pc in moe.pieces
                 if pc.param.endswith("w13_weight"))
    assert [t.split(".")[-3:-1] for _, t in w13] == [["2", "gate_proj"], ["2", "up_proj"],
                                                     ["3", "gate_proj"], ["3", "up_proj"]], w13
    assert [o for o, _ in w13] == [(0, 0, 0), (0, 8, 0), (1, 0, 0), (1, 8, 0)]
    # a plain column-parallel weight and bias
    p = plan({"w": ("F32", (8, 3)), "b": ("F32", (8,))},
             {"w": np.zeros((2, 3), np.float32), "b": np.zeros(2, np.float32)},
             {"^[wb]$": ColumnParallel()}, Ranks(3, 4))
    assert [(pc.trainer_offset, pc.trainer_extent) for pc in p.pieces] == [((6, 0), (2, 3)),
                                                                          ((6,), (2,))]


def check_refusals():
    # overlap: v mapped as a second "k"
    bad = [s if s[1] != ".v_proj" else (".qkv_proj", ".v_proj", "k") for s in M.STACKED]
    raises(DeltacastArgumentError, "DCAST_ESHAPE", lambda: llama(stacked=bad), QKV, "overlaps",
           "v_proj", "k_proj", "offset (16, 0) extent (8, 16)")
    # uncovered: the trainer publishes no v_proj
    trainer = {n: s for n, s in specs(M.trainer_model("llama", 1)).items() if ".v_proj.w" not in n}
    raises(DeltacastArgumentError, "DCAST_ESHAPE", lambda: llama(trainer=trainer), QKV,
           "128 of 512 elements are written by no trainer tensor", "q_proj", "k_proj")
    # dtype: an fp16 engine parameter for a bf16 tensor
    engine = M.poisoned(M.engine_shapes("llama", 2, 1))
    engine[QKV] = np.zeros(engine[QKV].shape, np.float16)
    raises(DeltacastArgumentError, "DCAST_EDTYPE", lambda: llama(2, 0, engine=engine), QKV,
           "q_proj", "BF16", "float16")
    # shape: an engine qkv of the TP-1 shape on a TP-2 rank (uncovered rows),
    # one too small (a box outside it), a trainer tensor of the wrong size
    engine = M.poisoned(M.engine_shapes("llama", 2, 1))
    engine[QKV] = np.zeros((32, 16), np.uint16)
    raises(DeltacastArgumentError, "DCAST_ESHAPE", lambda: llama(2, 0, engine=engine), QKV,
           "(32, 16)", "written by no trainer tensor")
    engine[QKV] = np.zeros((12, 16), np.uint16)
    raises(DeltacastArgumentError, "DCAST_ESHAPE", lambda: llama(2, 0, engine=engine), QKV,
           "does not fit", "extent (4, 16)")
    trainer = specs(M.trainer_model("llama", 1))
    trainer["model.layers.1.mlp.up_proj.weight"] = ("BF16", (30, 16))
    raises(DeltacastArgumentError, "DCAST_ESHAPE", lambda: llama(trainer=trainer),
           "model.layers.1.mlp.up_proj.weight (30, 16)", "gate_up_proj", "32 rows")
    trainer["model.layers.1.mlp.up_proj.weight"] = ("BF16", (32, 16))
    trainer["model.norm.weight"] = ("F32", (17,))
    raises(DeltacastArgumentError, "DCAST_ESHAPE", lambda: llama(trainer=trainer),
           "model.norm.weight (17,)", "(16,)", "shapes differ")
    # names: a tensor the engine lacks, a parameter nothing writes; ignore
    trainer["model.norm.weight"] = ("F32", (16,))
    trainer["model.rotary_emb.inv_freq"] = ("F32", (2,))
    raises(DeltacastError, "DCAST_ENOTFOUND", lambda: llama(trainer=trainer),
           "model.rotary_emb.inv_freq", "does not have")
    llama(trainer=trainer, ignore=[r"rotary_emb"])
    engine = M.poisoned(M.engine_shapes("llama", 1, 1))
    engine["model.extra.weight"] = np.zeros(3, np.float32)
    raises(DeltacastArgumentError, "DCAST_EINVAL", lambda: llama(engine=engine),
           "model.extra.weight", "written by no trainer tensor")
    # a shard id for a layout without shards, a bad shard id, no shard id
    raises(DeltacastArgumentError, "DCAST_EINVAL",
           lambda: llama(stacked=M.STACKED + [(".norm", ".norm", 0)]), "model.norm.weight",
           "Replicated", "takes no shard id")
    raises(DeltacastArgumentError, "DCAST_ESHAPE",
           lambda: llama(stacked=[(".qkv_proj", ".q_proj", "x")] + M.STACKED), "'x'")
    raises(DeltacastError, "DCAST_ENOTFOUND", lambda: llama(stacked=M.STACKED[:3]),
           "model.layers.0.mlp.gate_proj.weight")
    raises(DeltacastArgumentError, "DCAST_EINVAL",
           lambda: plan({"w": ("F32", (2, 2))}, {"w": np.zeros((2, 2), np.float32)},
                        {"w": MergedColumnParallel([2])}), "MergedColumnParallel",
           "takes shard ids")
    raises(DeltacastArgumentError, "DCAST_EINVAL", lambda: llama(ranks=Ranks(2, 2)), "tp_rank")
    # uneven splits name the dim
    raises(DeltacastArgumentError, "DCAST_ESHAPE",
           lambda: plan({"w": ("F32", (6, 2))}, {"w": np.zeros((2, 2), np.float32)},
                        {"w": ColumnParallel()}, Ranks(0, 4)), "dim 0", "does not divide by 4")


def check_contiguous_pieces():
    """A box stacked along dim 1 of a (3, 8) parameter is cut into one
    piece per row; together they move the same elements."""
    pshape = (3, 8)
    pc = Piece("t", (0, 2), (3, 4), "p", (0, 4), (3, 4))
    parts = contiguous_pieces(pc, pshape)
    assert len(parts) == 3 and all(p.param_extent == (1, 4) for p in parts)
    t = np.arange(5 * 9).reshape(5, 9)
    want, got = np.zeros(pshape, int), np.zeros(pshape, int)
    want[0:3, 4:8] = t[0:3, 2:6]
    for p in parts:
        (to, te), (po, pe) = (p.trainer_offset, p.trainer_extent), (p.param_offset, p.param_extent)
        got[po[0]:po[0] + pe[0], po[1]:po[1] + pe[1]] = t[to[0]:to[0] + te[0], to[1]:to[1] + te[1]]
    assert np.array_equal(want, got)
    # a 3-D box with unit dims on both sides: [1, 2, 4] of (2, 4, 8) onto (2, 4) of (9, 9)
    pc = Piece("t", (3, 1), (2, 4), "p", (1, 1, 4), (1, 2, 4))
    parts = contiguous_pieces(pc, (2, 4, 8))
    assert [(p.trainer_offset, p.param_offset) for p in parts] == [((3, 1), (1, 1, 4)),
                                                                   ((4, 1), (1, 2, 4))]
    whole = Piece("t", (0, 0), (2, 8), "p", (1, 0, 0), (1, 2, 8))
    assert contiguous_pieces(whole, (2, 2, 8)) == [whole]
    # the merged layout's boxes are rows: contiguous as they are
    p = plan({"g": ("F32", (4, 8)), "u": ("F32", (4, 8))}, {"gu": np.zeros((4, 8), np.float32)},
             {"gu": MergedColumnParallel([4, 4])}, Ranks(1, 2),
             stacked=[("gu", "g", 0), ("gu", "u", 1)])
    assert all(contiguous_pieces(pc, (4, 8)) == [pc] for pc in p.pieces)


def check_packed():
    """vLLM's packed_modules_mapping gives the stacked table."""
    got = stacked_from_packed({"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                               "gate_up_proj": ["gate_proj", "up_proj"]})
    assert got == M.STACKED, got


def main():
    check_layouts()
    check_refusals()
    check_contiguous_pieces()
    check_packed()
    print("test_engine_coverage: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
