"""All ranks or none, newest first, against real brokers: an engine of two
ranks, one process each (engine.EngineWorker bound into numpy parameters),
agreeing through deltacast.worker.FileAgreement, then again through
TorchAgreement (torch.distributed, gloo) where torch imports.  Rank 0's consumer reads
broker A; rank 1's reads relay R (--upstream A), so stopping R (SIGSTOP)
holds rank 1 back while rank 0 keeps receiving.

 - v1 (anchor) READY on both: apply_all_ranks applies it on both.
 - R stopped; v2, v3, v4 published: READY on rank 0 only (a backlog of
   3).  apply_all_ranks applies nothing on either rank: both still serve
   v1 (bit for bit), and rank 0's backlog stays 3.
 - R resumed; v2-v4 READY on rank 1 too: one apply_all_ranks moves both
   ranks to v4 in one apply() each (backlog 3 -> 0), and both say the
   engine serves v4, with the trainer's weights bit for bit."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_producer_python import procs, run_with_broker, start_broker  # noqa: E402

import numpy as np  # noqa: E402

from deltacast import Producer, engine  # noqa: E402
from deltacast.worker import FileAgreement, TorchAgreement  # noqa: E402

DEADLINE_S = 30
SHAPE = (256, 64)


def digest(a):
    return hashlib.sha1(a.tobytes()).hexdigest()


def agreement(kind, rank, size, agree_dir):
    if kind == "file":
        return FileAgreement(agree_dir, rank, size, timeout_ms=DEADLINE_S * 1000)
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{agree_dir}/group", rank=rank,
                            world_size=size)
    return TorchAgreement()


def answer_ready(c, rank, v):
    """The "ready V" command of a rank process: wait until V is READY in
    consumer c, then say which versions are."""
    end = time.monotonic() + DEADLINE_S
    while v not in c.ready_versions():
        assert time.monotonic() < end, f"rank {rank}: {v} not READY"
        c.poll(100)
    print("ready", json.dumps(c.ready_versions()), flush=True)


def rank_main(kind, model, rank, size, cons_ep, dir, agree_dir):
    """One engine rank: bind, then answer commands read from stdin:
    "ready V" (wait until V is READY here), "sync" (apply_all_ranks)."""
    params = {"w": np.full(SHAPE, np.nan, np.float32)}
    w = engine.EngineWorker(cons_ep, model, dir, params, timeout_ms=DEADLINE_S * 1000,
                            budget_bytes=16 << 20)
    os.makedirs(agree_dir, exist_ok=True)
    agree = agreement(kind, rank, size, agree_dir)
    c = w.consumer
    print("open", flush=True)
    try:
        for line in sys.stdin:
            cmd = line.split()
            if cmd[0] == "ready":
                answer_ready(c, rank, int(cmd[1]))
            elif cmd[0] == "sync":
                before = c.backlog
                s = w.apply_all_ranks(agree)
                print("served", json.dumps({"version": s.version, "ranks": s.ranks,
                                            "applied": s.applied, "mine": w.version,
                                            "backlog": [before, c.backlog],
                                            "digest": digest(params["w"])}), flush=True)
    finally:
        w.close()


class RankProc:
    """A rank process (python `argv`) that answers each command line on
    its stdin with one line "WORD [json]" on its stdout."""

    def __init__(self, rank, argv):
        self.rank = rank
        self.p = subprocess.Popen([sys.executable, *argv], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        procs.append(self.p)

    def send(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def expect(self, word):
        line = self.p.stdout.readline()
        assert line.startswith(word), f"rank {self.rank}: {line!r} (want {word}; " \
                                      f"exit {self.p.poll()})"
        return json.loads(line.split(" ", 1)[1]) if " " in line.strip() else None


class Rank(RankProc):
    def __init__(self, kind, model, rank, cons_ep, tmp):
        super().__init__(rank, [__file__, "rank", kind, model, str(rank), "2", cons_ep,
                                os.path.join(tmp, f"{model}-rank{rank}"),
                                os.path.join(tmp, f"{model}-agree")])


def sync(ranks):
    for r in ranks:
        r.send("sync")
    return [r.expect("served") for r in ranks]


def run(kind, tmp, prod_ep, cons_ep):
    model = f"ranks-{kind}"
    relay_tmp = os.path.join(tmp, f"relay-{kind}")
    os.makedirs(relay_tmp)
    _, relay_ep = start_broker(relay_tmp, "--upstream", cons_ep, "--upstream-model", model)
    relay = procs[-1]
    rng = np.random.default_rng(3)
    w = rng.standard_normal(SHAPE).astype(np.float32)
    digests = {}
    with Producer(prod_ep, model, range_elems=4096) as p:
        p.register("w", w)

        def publish(v):
            if v > 1:
                flat = w.reshape(-1)
                flat[rng.integers(0, flat.size, 200)] += 1.0
            p.publish(v)
            p.wait(v, DEADLINE_S * 1000)
            digests[v] = digest(w)

        publish(1)
        ranks = [Rank(kind, model, 0, cons_ep, tmp), Rank(kind, model, 1, relay_ep, tmp)]
        for r in ranks:
            r.expect("open")
        for r in ranks:
            r.send("ready 1")
            r.expect("ready")
        for s in sync(ranks):
            assert s["version"] == 1 and s["ranks"] == [1, 1] and s["applied"], s
            assert s["digest"] == digests[1], s
        print(f"{kind}: v1 applied on both ranks")

        relay.send_signal(signal.SIGSTOP)  # rank 1 falls behind
        try:
            for v in (2, 3, 4):
                publish(v)
            ranks[0].send("ready 4")
            assert ranks[0].expect("ready") == [2, 3, 4]
            held = sync(ranks)
            for s in held:
                assert s["version"] == 1 and s["ranks"] == [1, 1] and not s["applied"], s
                assert s["mine"] == 1 and s["digest"] == digests[1], s
            assert held[0]["backlog"] == [3, 3], held[0]
            print(f"{kind}: v2-v4 READY on rank 0 only: no rank applied, both serve v1")
        finally:
            relay.send_signal(signal.SIGCONT)

        ranks[1].send("ready 4")
        ranks[1].expect("ready")
        for r, s in zip(ranks, sync(ranks)):
            assert s["version"] == 4 and s["ranks"] == [4, 4] and s["applied"], s
            assert s["digest"] == digests[4], f"rank {r.rank}: not the trainer's v4"
            assert s["backlog"][1] == 0, s
        print(f"{kind}: v4 on both ranks in one apply each (rank 0 backlog 3 -> 0)")
        for r in ranks:
            r.p.stdin.close()
            assert r.p.wait(DEADLINE_S) == 0


def body(tmp, prod_ep, cons_ep):
    run("file", tmp, prod_ep, cons_ep)
    try:
        import torch.distributed as dist
    except ImportError:
        print("no torch: TorchAgreement not run")
        return
    if dist.is_available() and dist.is_gloo_available():
        run("torch", tmp, prod_ep, cons_ep)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        _, _, kind, model, rank, size, cons_ep, dir, agree_dir = sys.argv
        rank_main(kind, model, int(rank), int(size), cons_ep, dir, agree_dir)
        return 0
    run_with_broker("dcast-worker-ranks-", body)
    print("test_worker_ranks: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
