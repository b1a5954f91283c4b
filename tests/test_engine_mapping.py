"""deltacast.engine against a real broker: a trainer publishes two tiny
models in their unfused HF layout (tests/engine_models.py: a Llama and a
MoE), and engine workers hold them in vLLM's fused, sharded layout, one
process per rank, each with its own Consumer (engine.EngineWorker), its mapping planned from
vLLM's stacked_params_mapping and expert mapping and bound with
engine.bind into poisoned (NaN) parameters (torch Parameters, bf16 ones
included, for the Llama at TP 2 when torch imports; numpy arrays else):
  Llama at TP 1, 2 and 4 (at TP 4 the two kv heads are replicated),
  MoE at TP 1, 2 and 4 (experts split by TP) and at TP 2 with EP 2
  (each rank holds two whole experts).
Versions: an anchor, two sparse deltas, a dense one, a sparse one.  After
each, every worker saves its engine parameters; the engine forward built
from all ranks' parameters (column-parallel outputs concatenated,
row-parallel partial sums added in rank order, vocabulary-parallel
lookups added) equals the trainer's unfused forward bit for bit.  Weights
are small integers, activations clipped, so every float sum is exact
whatever its order (see engine_models.py)."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_producer_python import procs, run_with_broker  # noqa: E402

import numpy as np  # noqa: E402

import engine_models as M  # noqa: E402
from deltacast import DeltacastArgumentError, Producer, engine  # noqa: E402

DEADLINE_S = 30
CONFIGS = [("llama", 1, 1), ("llama", 2, 1), ("llama", 4, 1),
           ("moe", 1, 1), ("moe", 2, 1), ("moe", 4, 1), ("moe", 2, 2)]
VERSIONS = {1: None, 2: "sparse", 3: "sparse", 4: "dense", 5: "sparse"}


def as_torch(params):
    """The parameters as torch Parameters (bf16 as torch.bfloat16), the
    way an engine holds them; None without torch."""
    try:
        import torch
    except ImportError:
        return None
    out = {}
    for n, a in params.items():
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype == np.uint16 \
            else torch.from_numpy(a)
        out[n] = torch.nn.Parameter(t.clone(), requires_grad=False)
    return out


def as_numpy(params):
    import torch
    return {n: (t.data.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16
                else t.data.numpy()) for n, t in params.items()}


def worker(cons_ep, kind, tp, ep, rank, dir):
    """One engine rank: bind, then on each version number read from stdin,
    apply it, save the parameters to dir/vN.npz and say "applied N".
    The Llama at TP 2 holds torch Parameters (when torch imports), the
    others numpy arrays."""
    params = M.poisoned(M.engine_shapes(kind, tp, ep))
    held = as_torch(params) if (kind, tp) == ("llama", 2) else None
    if held is not None:
        params = held
    w = engine.EngineWorker(cons_ep, kind, dir, params, M.LAYOUTS, M.engine_ranks(tp, ep, rank),
                            stacked=M.STACKED, experts=M.EXPERT_MAP, timeout_ms=DEADLINE_S * 1000,
                            budget_bytes=16 << 20)
    try:
        print(f"bound {w.binds} {'torch' if held else 'numpy'}", flush=True)
        for line in sys.stdin:
            v = int(line)
            w.apply(v)
            assert w.version == v
            np.savez(os.path.join(dir, f"v{v}.npz"), **(as_numpy(params) if held else params))
            print(f"applied {v}", flush=True)
    finally:
        w.close()


class Worker:
    def __init__(self, cons_ep, kind, tp, ep, rank, tmp):
        self.dir = os.path.join(tmp, f"{kind}-tp{tp}-ep{ep}-r{rank}")
        self.p = subprocess.Popen([sys.executable, __file__, "worker", cons_ep, kind, str(tp),
                                   str(ep), str(rank), self.dir],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(self.p)

    def expect(self, word):
        line = self.p.stdout.readline()
        assert line.startswith(word), f"{self.dir}: {line!r} (want {word}; exit {self.p.poll()})"
        return line

    def load(self, v):
        with np.load(os.path.join(self.dir, f"v{v}.npz")) as z:
            return {n: z[n] for n in z.files}


def trainers(prod_ep):
    out = {}
    for kind in ("llama", "moe"):
        model = M.trainer_model(kind, seed=7 if kind == "llama" else 8)
        p = Producer(prod_ep, kind, range_elems=300)  # chunks cross tensors
        for name, a in model.items():
            p.register(name, a, dtype="bf16" if a.dtype == np.uint16 else None)
        out[kind] = (p, model)
    return out


def check_refused_worker(cons_ep, tmp):
    """A worker whose engine holds the Llama at TP 2 while it says TP 1 is
    refused at bind time, naming the parameter; nothing stays open."""
    params = M.poisoned(M.engine_shapes("llama", 2, 1))
    try:
        engine.EngineWorker(cons_ep, "llama", os.path.join(tmp, "refused"), params, M.LAYOUTS,
                            engine.Ranks(0, 1), stacked=M.STACKED, budget_bytes=16 << 20)
    except DeltacastArgumentError as e:
        assert "model.embed_tokens.weight" in str(e) and "holds 128 rows" in str(e), e
        return
    raise AssertionError("a worker of the wrong TP degree was bound")


def check_version(groups, models, v):
    ids = np.arange(M.VOCAB)[::-1].copy()
    for (kind, tp, ep), ws in groups.items():
        ranks = [w.load(v) for w in ws]
        for r, params in enumerate(ranks):
            for n, a in params.items():
                assert not np.isnan(M.f32(a)).any(), f"v{v} {kind} tp{tp} ep{ep} rank {r}: {n} unwritten"
        want = M.trainer_forward(models[kind], ids, kind)
        got = M.engine_forward(ranks, ids, kind, tp, ep)
        assert np.array_equal(want.view(np.uint32), got.view(np.uint32)), \
            f"v{v} {kind} tp{tp} ep{ep}: the engine forward differs"


def body(tmp, prod_ep, cons_ep):
    rng = np.random.default_rng(1)
    ts = trainers(prod_ep)
    try:
        for p, _ in ts.values():
            p.publish(1)
        check_refused_worker(cons_ep, tmp)
        groups = {cfg: [Worker(cons_ep, *cfg, r, tmp) for r in range(cfg[1])] for cfg in CONFIGS}
        every = [w for ws in groups.values() for w in ws]
        held = {w.expect("bound").split()[2] for w in every}
        print(f"engine parameters held as {sorted(held)}")
        for v, how in VERSIONS.items():
            if how is not None:
                for p, model in ts.values():
                    M.step(model, rng, dense=how == "dense")
                    p.publish(v)
            for p, _ in ts.values():
                p.wait(v, DEADLINE_S * 1000)
            for w in every:
                w.p.stdin.write(f"{v}\n")
                w.p.stdin.flush()
            for w in every:
                w.expect(f"applied {v}")
            check_version(groups, {k: m for k, (_, m) in ts.items()}, v)
            print(f"v{v} ({how or 'anchor'}): {len(groups)} engine layouts equal the trainer's")
        for w in every:
            w.p.stdin.close()
            assert w.p.wait(DEADLINE_S) == 0
    finally:
        for p, _ in ts.values():
            p.close()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        _, _, cons_ep, kind, tp, ep, rank, dir = sys.argv
        worker(cons_ep, kind, int(tp), int(ep), int(rank), dir)
        return 0
    # the trainer's producers sit idle while 16 workers check each version
    # on a small machine: a long heartbeat keeps the broker from dropping them
    run_with_broker("dcast-engine-mapping-", body, "--heartbeat-ms", "10000")
    print("test_engine_mapping: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
