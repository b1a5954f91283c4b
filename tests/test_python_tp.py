"""Tensor-parallel slices through the Python package against the real
broker.  A small torch model (a LayerNorm, an MLP and a
head; bf16 and fp32 tensors) is trained by P "ranks" in one process (P = 2,
then 4), each a Producer part that registers only its local shards with
Producer.register_slice: up.weight / up.bias split on dim 0 (Megatron's
column-parallel Linear: output features), down.weight split on dim 1
(row-parallel: input features), head.weight (fp32) split in two on dim 0
and held by two of the parts only (with P = 4 the others declare the grid
with tensor=None), while the replicated norm and down.bias go out from
part 0 alone (the others register an empty shard).  Versions: an anchor,
then sparse deltas (optimizer steps on the full reference model, each
rank's slice copied into its shard), one dense; one version replaces a
shard's storage (`shard.data = ...`), which publish follows.

Two workers check every version bit for bit against the reference:
 - a TP-1 worker binds a full-shape copy of the model with bind_module
   before the first apply (tiled tensors become natural-layout views);
 - a worker of another TP degree (4 against 2 parts, 2 against 4) binds
   every one of its ranks' shards with bind_slice into torch tensors,
   plus a numpy box that cuts across the producers' tiles, after the
   first apply; it also reads an odd box with read_slice, and tensor() of
   a tiled tensor is a read-only natural-layout copy.
Bad calls get clear errors.  Skips (77) without torch."""
import contextlib
import logging
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_producer_python import drive, run_with_broker  # noqa: E402

try:
    import torch
except ImportError:
    print("skip: no torch for /usr/bin/python3 (apt-get install python3-torch)")
    sys.exit(77)
import numpy as np  # noqa: E402

from test_python_torch_bind import Records, raises  # noqa: E402

from deltacast import Consumer, DeltacastArgumentError, DeltacastError, Producer  # noqa: E402

DEADLINE_S = 20  # per wait for a version


class Model(torch.nn.Module):
    def __init__(self, d=64, h=128, out=32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, h)
        self.down = torch.nn.Linear(h, d)
        self.head = torch.nn.Linear(d, out, bias=False)
        # an int64 buffer split on dim 1 (8-byte values: two wire elements)
        self.register_buffer("pos", torch.arange(16 * 8, dtype=torch.int64).reshape(16, 8)
                             * 3_000_000_007)
        self.up.to(torch.bfloat16)
        self.down.to(torch.bfloat16)

    def forward(self, x):
        x = self.norm(x)
        x = x + self.down(torch.relu(self.up(x.to(torch.bfloat16)))).float()
        return self.head(x)


# name -> (the dim it is split on, None: replicated; tiles along it, None:
# one per part).  With fewer tiles than parts, every (P // tiles)-th part
# holds one and the others declare the grid with tensor=None.
SPLIT = {"norm.weight": (None, None), "norm.bias": (None, None),
         "up.weight": (0, None), "up.bias": (0, None),
         "down.weight": (1, None), "down.bias": (None, None),
         "head.weight": (0, 2), "pos": (1, None)}
WIRE_NAME = {torch.bfloat16: "bf16", torch.float32: "f32", torch.int64: "i64"}


def box_of(shape, dim, rank, ranks):
    """(offset, extent) of rank's block of a tensor split on `dim`."""
    off, ext = [0] * len(shape), list(shape)
    if dim is not None:
        ext[dim] = shape[dim] // ranks
        off[dim] = rank * ext[dim]
    return tuple(off), tuple(ext)


def index(off, ext):
    return tuple(slice(o, o + e) for o, e in zip(off, ext))


def bits(t):
    """The bit patterns of a torch tensor or numpy array, as numpy."""
    unsigned = {2: np.uint16, 4: np.uint32, 8: np.uint64}
    if isinstance(t, np.ndarray):
        return t.view(unsigned[t.itemsize])
    t = t.detach().cpu().contiguous()
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(width).numpy().view(unsigned[t.element_size()])


def same(a, b, what):
    assert np.array_equal(bits(a), bits(b)), f"{what} differs"


def wait_names(c, n):
    end = time.monotonic() + DEADLINE_S
    while len(c.names()) < n:
        assert time.monotonic() < end, "no manifest"
        c.poll(50)


class Rank:
    """One trainer rank: a Producer part and its local shards."""

    def __init__(self, prod_ep, model, part, parts, ref):
        self.p = Producer(prod_ep, model, part, parts, range_elems=500)  # chunks cross tiles
        self.shards = {}  # name -> (local tensor, offset)
        for name, (dim, tiles) in SPLIT.items():
            full = ref[name]
            if dim is None:  # replicated: part 0 sends it
                local = full.clone() if part == 0 else torch.empty(0, dtype=full.dtype)
                self.p.register(name, local, shape=tuple(full.shape))
                if part == 0:
                    self.shards[name] = (local, (0,) * full.dim())
                continue
            tiles = tiles or parts
            every = parts // tiles
            off, ext = box_of(tuple(full.shape), dim, part // every, tiles)
            if part % every:  # holds no tile: declares the grid
                self.p.register_slice(name, None, tuple(full.shape), off,
                                      dtype=WIRE_NAME[full.dtype], extent=ext)
                continue
            local = full[index(off, ext)].clone()
            self.p.register_slice(name, local, full.shape, off)
            self.shards[name] = (local, off)

    def load(self, ref):
        """Copy this rank's slices of the reference into its shards."""
        for name, (local, off) in self.shards.items():
            local.copy_(ref[name][index(off, tuple(local.shape))])


def step(ref, gen, frac):
    """An optimizer step on the reference: about `frac` of each tensor's
    elements change (in place)."""
    for t in ref.values():
        mask = torch.rand(t.shape, generator=gen) < frac
        noise = torch.randn(t.shape, generator=gen) * 0.01
        t.copy_(torch.where(mask, (t.float() + noise).to(t.dtype), t))


def publish(ranks, v):
    for r in ranks:
        r.p.publish(v)
    for r in ranks:
        r.p.wait(v, 20000)


def check_producer_errors(prod_ep):
    with Producer(prod_ep, "bad") as p:
        w = torch.zeros(6, 2, dtype=torch.bfloat16)
        raises(DeltacastArgumentError, "DCAST_ESHAPE",
               lambda: p.register_slice("w", w, (6, 8), (0, 3)), "w", "not a tile")
        raises(DeltacastArgumentError, "DCAST_ESHAPE",
               lambda: p.register_slice("w", torch.zeros(6, 3, dtype=torch.bfloat16), (6, 8),
                                        (0, 0)), "not a tile")
        raises(DeltacastArgumentError, "DCAST_ESHAPE",
               lambda: p.register_slice("w", w, (6, 8), (0, 8)), "outside")
        raises(DeltacastArgumentError, "DCAST_ESHAPE",
               lambda: p.register_slice("w", w, (6, 8, 1), (0, 0, 0)), "dims")
        raises(DeltacastArgumentError, "DCAST_ESHAPE",
               lambda: p.register_slice("w", w, (6, 8), (0,)), "dims")
        raises(DeltacastArgumentError, "DCAST_EDTYPE",
               lambda: p.register_slice("w", w, (6, 8), (0, 2), dtype="f16"), "w")
        raises(DeltacastArgumentError, "DCAST_EINVAL",
               lambda: p.register_slice("w", torch.zeros(2, 6, dtype=torch.bfloat16).t(),
                                        (6, 8), (0, 2)), "contiguous")
        raises(DeltacastArgumentError, "DCAST_EINVAL",
               lambda: p.register_slice("w", None, (6, 8), (0, 2)), "dtype=", "extent=")
        raises(DeltacastArgumentError, "DCAST_EINVAL",
               lambda: p.register_slice("w", w, (6, -8), (0, 2)), "shape")
        raises(DeltacastArgumentError, "DCAST_EINVAL",
               lambda: p.register_slice("w", [1, 2], (6, 8), (0, 2)), "numpy array or a torch")
        raises(DeltacastArgumentError, "DCAST_ESHAPE",
               lambda: p.register_slice("w", w, (6, 8), (0, 2), extent=(6, 4)), "extent")
        p.register_slice("w", w, (6, 8), (0, 2))
        # another grid for the same tensor
        raises(DeltacastArgumentError, "DCAST_ESHAPE",
               lambda: p.register_slice("w", torch.zeros(6, 4, dtype=torch.bfloat16), (6, 8),
                                        (0, 4)), "grid")
        # numpy shards take part too (bf16 as uint16 bit patterns)
        p.register_slice("n", np.zeros((3, 8), np.uint16), (6, 8), (3, 0), dtype="bf16")


def run(prod_ep, cons_ep, tmp, parts, wtp, records):
    with contextlib.ExitStack() as stack:  # closes consumers and producers, pass or fail
        run_in(stack, prod_ep, cons_ep, tmp, parts, wtp, records)


def run_in(stack, prod_ep, cons_ep, tmp, parts, wtp, records):
    model = f"tp{parts}"
    torch.manual_seed(parts)
    gen = torch.Generator().manual_seed(100 + parts)
    trainer = Model()
    ref = {n: t.detach() for n, t in [*trainer.named_parameters(), *trainer.named_buffers()]}
    ranks = []
    for r in range(parts):
        ranks.append(Rank(prod_ep, model, r, parts, ref))
        stack.enter_context(ranks[-1].p)
    for r in ranks:
        r.load(ref)
    publish(ranks, 1)

    whole = stack.enter_context(Consumer(cons_ep, model, os.path.join(tmp, model + "-whole"),
                                         16 << 20))
    tp = stack.enter_context(Consumer(cons_ep, model, os.path.join(tmp, model + "-tp"), 16 << 20))
    wait_names(whole, len(SPLIT))
    assert whole.grid("up.weight") == (parts, 1), whole.grid("up.weight")
    assert whole.grid("up.bias") == (parts,) and whole.grid("down.weight") == (1, parts)
    assert whole.grid("head.weight") == (2, 1) and whole.grid("norm.weight") is None
    assert whole.describe("down.weight") == ("BF16", (64, 128))
    assert whole.describe("head.weight") == ("F32", (32, 64))

    # TP-1 worker: a full-shape model, bound before the first apply.
    worker = Model()
    with torch.no_grad():
        for t in [*worker.parameters(), *worker.buffers()]:
            t.zero_()
    assert sorted(whole.bind_module(worker)) == sorted(SPLIT)
    assert whole.describe("pos") == ("I64", (16, 8)) and whole.grid("pos") == (1, parts)
    wparams = dict([*worker.named_parameters(), *worker.named_buffers()])
    # bad binds name the problem
    raises(DeltacastArgumentError, "DCAST_ESHAPE",
           lambda: whole.bind_slice("up.weight", torch.zeros(64, 64, dtype=torch.bfloat16),
                                    (100, 0)), "up.weight", "outside")
    raises(DeltacastArgumentError, "DCAST_ESHAPE",
           lambda: whole.bind_slice("up.weight", torch.zeros(64, 64, dtype=torch.bfloat16),
                                    (0, 8)), "outside", "dim 1")
    raises(DeltacastArgumentError, "DCAST_ESHAPE",
           lambda: whole.bind_slice("up.weight", torch.zeros(64, dtype=torch.bfloat16), (0, 0)),
           "dims")
    raises(DeltacastArgumentError, "DCAST_EDTYPE",
           lambda: whole.bind_slice("up.weight", torch.zeros(8, 8, dtype=torch.float16), (0, 0)),
           "up.weight", "BF16", "torch.float16")
    raises(DeltacastArgumentError, "DCAST_EDTYPE",
           lambda: whole.bind_slice("head.weight", np.zeros((8, 8), np.uint16), (0, 0)), "F32")
    raises(DeltacastArgumentError, "DCAST_EINVAL",
           lambda: whole.bind_slice("up.weight", torch.zeros(8, 16, dtype=torch.bfloat16)[:, ::2],
                                    (0, 0)), "contiguous")
    raises(DeltacastError, "DCAST_ENOTFOUND",
           lambda: whole.bind_slice("nope", torch.zeros(8, dtype=torch.bfloat16), (0,)), "nope")
    # an untiled tensor bound whole takes no slices
    raises(DeltacastError, "DCAST_ESTATE",
           lambda: whole.bind_slice("norm.weight", torch.zeros(8), (0,)), "bound whole")
    drive(whole, 1)
    drive(tp, 1)
    raises(DeltacastArgumentError, "DCAST_ESHAPE",
           lambda: tp.read_slice("down.weight", (60, 0), (5, 8)), "outside")
    raises(DeltacastArgumentError, "DCAST_ESHAPE",
           lambda: tp.read_slice("down.weight", (0, 0, 0)), "dims")

    # The other TP degree: every rank's block, in torch tensors, bound after
    # the first apply; plus a numpy box across the producers' tiles.
    views = []  # (name, offset, tensor)
    for r in range(wtp):
        for name, (dim, _) in SPLIT.items():
            if dim is None:
                continue
            full = ref[name]
            off, ext = box_of(tuple(full.shape), dim, r, wtp)
            local = torch.zeros(ext, dtype=full.dtype)
            tp.bind_slice(name, local, off)
            views.append((name, off, local))
    odd = np.zeros((30, 41), np.uint16)  # rows 5..34, columns 7..47 of down.weight
    tp.bind_slice("down.weight", odd, np.array([5, 7]))
    views.append(("down.weight", (5, 7), odd))
    norm_slice = torch.zeros(10)  # an untiled tensor takes slices too
    tp.bind_slice("norm.bias", norm_slice, (3,))
    views.append(("norm.bias", (3,), norm_slice))
    head = torch.zeros(32, 64)  # a tiled tensor with slices bound is bound whole too
    tp.bind("head.weight", head)
    views.append(("head.weight", (0, 0), head))
    raises(DeltacastError, "DCAST_ESTATE",  # not so an untiled one
           lambda: tp.bind("norm.bias", torch.zeros(64)), "slices")

    for v in range(1, 7):
        if v > 1:
            step(ref, gen, 1.0 if v == 4 else 0.02)  # 4: dense
            if v == 3:  # rank 1 replaces a shard's storage: followed at publish
                local, off = ranks[1].shards["down.weight"]
                local.data = local.data.clone()
            for r in ranks:
                r.load(ref)
            publish(ranks, v)
            if v > 4:
                assert ranks[0].p.stats().changed_elems < ranks[0].p.stats().elems // 10
            drive(whole, v)
            drive(tp, v)
        for name, t in wparams.items():
            same(t, ref[name], f"v{v} whole {name}")
        for name, off, local in views:
            same(local, ref[name][index(off, tuple(local.shape))], f"v{v} slice {name} @{off}")
        got = tp.read_slice("down.weight", (9, 13), (50, 101))
        assert got.dtype == np.uint16 and got.shape == (50, 101)
        same(got, ref["down.weight"][9:59, 13:114], f"v{v} read_slice")
        got = tp.read_slice("up.weight", (17, 0))  # the rest of the tensor
        assert got.shape == (111, 64)
        same(got, ref["up.weight"][17:], f"v{v} read_slice rest")
        same(tp.read_slice("head.weight"), ref["head.weight"], f"v{v} read_slice whole")
        same(tp.read_slice("norm.weight", shape=(5,)), ref["norm.weight"][:5], f"v{v} norm")
        same(whole.read_slice("norm.bias", (60,)), ref["norm.bias"][60:], f"v{v} bound norm")
        same(whole.read_slice("down.weight", (1, 3), (2, 2)), ref["down.weight"][1:3, 3:5],
             f"v{v} bound down.weight")
        for name in SPLIT:  # tensor(): natural layout, tiled or not
            same(tp.tensor(name), ref[name], f"v{v} tensor({name})")
    assert any("down.weight" in m and "moved" in m for m in records.messages), records.messages

    # tensor() of a tiled tensor: a read-only copy that does not follow
    # later versions; of an untiled one: a live view.  A bf16 tensor comes
    # as torch.bfloat16 (numpy has no type for it), as numpy bit patterns
    # with as_numpy=True.
    assert tp.tensor("up.weight").dtype == torch.bfloat16
    assert tp.tensor("up.weight", as_numpy=True).dtype == np.uint16
    snap, live = tp.tensor("up.weight", as_numpy=True), tp.tensor("norm.weight")
    assert not snap.flags.writeable
    try:
        snap[0, 0] = 1
        raise AssertionError("tensor() copy is writeable")
    except ValueError:
        pass
    before = snap.copy()
    step(ref, gen, 0.02)
    for r in ranks:
        r.load(ref)
    publish(ranks, 7)
    drive(whole, 7)
    drive(tp, 7)
    assert np.array_equal(snap, before)
    same(tp.tensor("up.weight"), ref["up.weight"], "v7 tensor(up.weight)")
    same(live, ref["norm.weight"], "v7 live tensor(norm.weight)")
    for name, t in wparams.items():
        same(t, ref[name], f"v7 whole {name}")
    for name, off, local in views:
        same(local, ref[name][index(off, tuple(local.shape))], f"v7 slice {name} @{off}")
    # a worker's forward pass gives the trainer's outputs bit for bit
    x = torch.randn(3, 64, generator=gen)
    with torch.no_grad():
        for name, t in trainer.named_parameters():
            assert t.data_ptr() == ref[name].data_ptr()
        assert torch.equal(worker(x), trainer(x))



def main():
    records = Records()
    logging.getLogger("deltacast").addHandler(records)

    def body(tmp, prod_ep, cons_ep):
        check_producer_errors(prod_ep)
        run(prod_ep, cons_ep, tmp, 2, 4, records)
        run(prod_ep, cons_ep, tmp, 4, 2, records)
    try:
        run_with_broker("dcast-python-tp-", body)
    finally:
        logging.getLogger("deltacast").removeHandler(records)
    print("test_python_tp: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
