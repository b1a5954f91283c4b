"""The vLLM backend's per-rank part (deltacast.vllm.RankUpdate, what
receive_weights runs on every worker) without vLLM, against real
brokers: two rank processes, each a torch model (f32 and bf16
parameters) bound by engine.open_module_worker as the backend binds
vLLM's model, agreeing over torch.distributed gloo.  Rank 0's consumer
reads broker A; rank 1's reads relay R (--upstream A), so stopping R
(SIGSTOP) holds rank 1 back.

 - receive(2) on both: both ranks serve v2, bit for bit.
 - R stopped, v3 published: READY on rank 0 only.  receive(3) raises
   DCAST_ETIMEDOUT on both ranks, naming the version served (2) and each
   rank's; neither rank moved (rank 0 still holds v2 bit for bit, v3
   READY).
 - R resumed: receive(3) moves both to v3.
 - v4 and v5 READY on both: receive(4) moves both to v4, not past it."""
import hashlib
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_producer_python import procs, run_with_broker, start_broker  # noqa: E402
from test_worker_ranks import RankProc, answer_ready  # noqa: E402

import numpy as np  # noqa: E402

from deltacast import DeltacastError, Producer  # noqa: E402

DEADLINE_S = 30
SHAPE = (128, 64)


def digest(*arrays):
    return hashlib.sha1(b"".join(a.tobytes() for a in arrays)).hexdigest()


def rank_main(model, rank, size, cons_ep, dir, agree_dir):
    """One engine rank: open the worker and the agreement as the backend
    does, then answer commands from stdin: "ready V", "receive V MS"."""
    import torch
    import torch.distributed as dist

    from deltacast import engine
    from deltacast.vllm import RankUpdate
    from deltacast.worker import TorchAgreement

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.full(SHAPE, float("nan")), requires_grad=False)
            self.b = torch.nn.Parameter(torch.zeros(64, dtype=torch.bfloat16), requires_grad=False)

    m = Model()
    dist.init_process_group("gloo", init_method=f"file://{agree_dir}/group", rank=rank,
                            world_size=size)
    w = engine.open_module_worker(m, cons_ep, model, dir, engine.Ranks(rank, size),
                                  timeout_ms=DEADLINE_S * 1000, budget_bytes=16 << 20)
    up = RankUpdate(w, TorchAgreement())
    c = w.consumer
    print("open", flush=True)
    try:
        for line in sys.stdin:
            cmd = line.split()
            if cmd[0] == "ready":
                answer_ready(c, rank, int(cmd[1]))
                continue
            state = {}
            try:
                s = up.receive(int(cmd[1]), int(cmd[2]))
                state = {"version": s.version, "ranks": s.ranks}
            except DeltacastError as e:
                state = {"error": e.name, "text": str(e)}
            state.update(mine=w.version, served=up.version, ready=c.ready_versions(),
                         digest=digest(m.w.numpy(), m.b.view(torch.int16).numpy()))
            print("served", json.dumps(state), flush=True)
    finally:
        up.close()


def Rank(model, rank, cons_ep, tmp):
    return RankProc(rank, [__file__, "rank", model, str(rank), "2", cons_ep,
                           os.path.join(tmp, f"rank{rank}"), os.path.join(tmp, "agree")])


def receive(ranks, v, ms=DEADLINE_S * 1000):
    for r in ranks:
        r.send(f"receive {v} {ms}")
    return [r.expect("served") for r in ranks]


def ready(ranks, v):
    for r in ranks:
        r.send(f"ready {v}")
    return [r.expect("ready") for r in ranks]


def body(tmp, prod_ep, cons_ep):
    os.makedirs(os.path.join(tmp, "agree"))
    relay_tmp = os.path.join(tmp, "relay")
    os.makedirs(relay_tmp)
    _, relay_ep = start_broker(relay_tmp, "--upstream", cons_ep, "--upstream-model", "vr")
    relay = procs[-1]
    rng = np.random.default_rng(4)
    w = rng.standard_normal(SHAPE).astype(np.float32)
    b = rng.integers(0, 1 << 15, 64, dtype=np.uint16)  # bf16 bit patterns
    digests = {}
    with Producer(prod_ep, "vr", range_elems=4096) as p:
        p.register("w", w)
        p.register("b", b, dtype="bf16")

        def publish(v):
            if v > 1:
                w.reshape(-1)[rng.integers(0, w.size, 100)] += 1.0
                b[rng.integers(0, b.size, 3)] ^= 1
            p.publish(v)
            p.wait(v, DEADLINE_S * 1000)
            digests[v] = digest(w, b)

        publish(1)
        publish(2)
        ranks = [Rank("vr", 0, cons_ep, tmp), Rank("vr", 1, relay_ep, tmp)]
        for r in ranks:
            r.expect("open")
        for s in receive(ranks, 2):
            assert s.get("version") == 2 and s["ranks"] == [2, 2] and s["served"] == 2, s
            assert s["digest"] == digests[2], s
        print("receive(2): both ranks serve v2, bit for bit")

        relay.send_signal(signal.SIGSTOP)  # rank 1 falls behind
        try:
            publish(3)
            assert ready(ranks[:1], 3) == [[3]]
            for s in receive(ranks, 3, 1000):
                assert s.get("error") == "DCAST_ETIMEDOUT", s
                assert "version 3" in s["text"] and "serves 2" in s["text"], s
                assert "[2, 2]" in s["text"], s
                assert s["mine"] == 2 and s["served"] is None and s["digest"] == digests[2], s
            print("receive(3) with v3 on rank 0 only: DCAST_ETIMEDOUT on both, both hold v2")
        finally:
            relay.send_signal(signal.SIGCONT)

        for s in receive(ranks, 3):
            assert s.get("version") == 3 and s["ranks"] == [3, 3], s
            assert s["digest"] == digests[3], s
        publish(4)
        publish(5)
        ready(ranks, 5)
        for s in receive(ranks, 4):
            assert s.get("version") == 4 and s["ranks"] == [4, 4] and s["mine"] == 4, s
            assert s["ready"] == [5] and s["digest"] == digests[4], s
        print("receive(3), then receive(4) with v5 READY: both at v4, not past it")
        for r in ranks:
            r.p.stdin.close()
            assert r.p.wait(DEADLINE_S) == 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        _, _, model, rank, size, cons_ep, dir, agree_dir = sys.argv
        rank_main(model, int(rank), int(size), cons_ep, dir, agree_dir)
        return 0
    try:
        import torch.distributed as dist
    except ImportError as e:
        print(f"skip: torch does not import ({e})")
        return 77
    if not (dist.is_available() and dist.is_gloo_available()):
        print("skip: torch.distributed without gloo")
        return 77
    run_with_broker("dcast-engine-vllm-ranks-", body)
    print("test_engine_vllm_ranks: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
