"""torch models through the Python package against the real broker: the
unsafe cases get clear errors.  A worker binding an fp16 tensor where bf16
is published, or a (32, 64) tensor for a (64, 32) one (torch or numpy,
bind or bind_module) is refused with the tensor named, and nothing is
bound; a trainer whose parameter's storage is replaced after register
(`param.data = ...`) is followed at publish (the worker gets the new
values bit-exact, not `changed 0` forever), or refused with
on_moved="raise", or refused when the shape changed too.  Skips (77)
without torch."""
import logging
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_producer_python import procs, raises, start_broker  # noqa: E402

try:
    import torch
except ImportError:
    print("skip: no torch for /usr/bin/python3 (apt-get install python3-torch)")
    sys.exit(77)
import numpy as np  # noqa: E402

from deltacast import Consumer, DeltacastArgumentError, DeltacastError, Producer  # noqa: E402


class Tiny(torch.nn.Module):
    def __init__(self, rows=64, cols=32):
        super().__init__()
        self.proj = torch.nn.Linear(cols, rows, bias=True)
        self.register_buffer("scale", torch.ones(rows))

    def forward(self, x):
        return self.proj(x) * self.scale


def apply_until(c, version):
    """Poll and apply until c holds `version` (10 s at most)."""
    for _ in range(200):
        if c.version == version:
            return
        if c.ready_version is not None:
            c.apply(c.ready_version)
        c.poll(50)


def wait_names(c):
    for _ in range(200):
        if c.names():
            return
        c.poll(50)
    raise AssertionError("no manifest")


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def main():
    tmp = tempfile.mkdtemp(prefix="dcast-torch-bind-")
    records = Records()
    logging.getLogger("deltacast").addHandler(records)
    try:
        prod_ep, cons_ep = start_broker(tmp)
        torch.manual_seed(0)
        trainer = Tiny().to(torch.bfloat16)
        p = Producer(prod_ep, "tiny")
        names = p.register_module(trainer)
        assert sorted(names) == ["proj.bias", "proj.weight", "scale"], names
        p.publish(1)
        p.wait(1)

        c = Consumer(cons_ep, "tiny", os.path.join(tmp, "w"))
        wait_names(c)
        assert c.describe("proj.weight") == ("BF16", (64, 32))
        e = raises(DeltacastArgumentError, "DCAST_EDTYPE",
                   lambda: c.bind("proj.weight", torch.zeros(64, 32, dtype=torch.float16)),
                   "proj.weight", "BF16", "torch.float16")
        assert isinstance(e, ValueError)
        raises(DeltacastArgumentError, "DCAST_ESHAPE",
               lambda: c.bind("proj.weight", torch.zeros(32, 64, dtype=torch.bfloat16)),
               "proj.weight", "(64, 32)", "(32, 64)")
        raises(DeltacastArgumentError, "DCAST_EDTYPE",
               lambda: c.bind("proj.weight", np.zeros((64, 32), np.float16)), "proj.weight")
        raises(DeltacastArgumentError, "DCAST_ESHAPE",
               lambda: c.bind("proj.weight", np.zeros((32, 64), np.uint16)), "proj.weight")
        # bind_module: a worker model of another shape or dtype binds nothing.
        raises(DeltacastArgumentError, "DCAST_ESHAPE",
               lambda: c.bind_module(Tiny(rows=32, cols=64).to(torch.bfloat16)), "proj.weight")
        raises(DeltacastArgumentError, "DCAST_EDTYPE",
               lambda: c.bind_module(Tiny().to(torch.float16)), "proj.weight")
        worker = Tiny().to(torch.bfloat16)
        assert sorted(c.bind_module(worker)) == ["proj.bias", "proj.weight", "scale"]
        apply_until(c, 1)
        assert c.version == 1
        assert torch.equal(worker.proj.weight, trainer.proj.weight)

        # param.data replaced after register: followed, with a warning.
        with torch.no_grad():
            trainer.proj.weight.data = trainer.proj.weight.data.clone() + 1
        p.publish(2)
        p.wait(2)
        assert p.stats().changed_elems >= 64 * 32, p.stats().changed_elems  # not `changed 0`
        assert any("proj.weight" in m and "moved" in m for m in records.messages), records.messages
        apply_until(c, 2)
        assert c.version == 2 and torch.equal(worker.proj.weight, trainer.proj.weight)

        # A shape change is not a move: refused.
        trainer.proj.bias.data = torch.zeros(65, dtype=torch.bfloat16)
        raises(DeltacastArgumentError, "DCAST_ESHAPE", lambda: p.publish(3), "proj.bias", "(64,)")
        p.close()

        # on_moved="raise": refused, naming the tensor.
        t2 = Tiny().to(torch.bfloat16)
        with Producer(prod_ep, "tiny2", on_moved="raise") as p2:
            p2.register_module(t2)
            p2.publish(1)
            t2.proj.weight.data = t2.proj.weight.data.clone()
            raises(DeltacastError, "DCAST_ESTATE", lambda: p2.publish(2), "proj.weight", "moved")
        # Unsupported buffers name the tensor; filter skips them.
        m = Tiny().to(torch.bfloat16)
        m.register_buffer("phase", torch.zeros(3, dtype=torch.complex64))
        with Producer(prod_ep, "tiny3") as p3:
            raises(DeltacastArgumentError, "DCAST_EDTYPE", lambda: p3.register_module(m), "phase")
        # bool, int64 and float64 buffers (a mask, a step counter, position
        # ids, a running statistic) go out bit-exact; int64 and float64 as
        # two wire elements per value.
        m.register_buffer("mask", torch.rand(40) > 0.5)
        m.register_buffer("steps", torch.tensor([(1 << 40) + 7, -3], dtype=torch.int64))
        m.register_buffer("pos", torch.arange(1000, dtype=torch.int64) * 3_000_000_000)
        m.register_buffer("stat", torch.randn(5, 7, dtype=torch.float64))
        with Producer(prod_ep, "tiny4") as p4:
            got = p4.register_module(m, filter=lambda n, t: t.dtype != torch.complex64,
                                     name_map=lambda n: "model." + n)
            assert got["proj.weight"] == "model.proj.weight" and "phase" not in got
            assert got["mask"] == "model.mask" and got["steps"] == "model.steps"
            p4.publish(1)
            p4.wait(1)
            w4 = Tiny().to(torch.bfloat16)
            w4.register_buffer("mask", torch.zeros(40, dtype=torch.bool))
            w4.register_buffer("steps", torch.zeros(2, dtype=torch.int64))
            w4.register_buffer("pos", torch.zeros(1000, dtype=torch.int64))
            w4.register_buffer("stat", torch.zeros(5, 7, dtype=torch.float64))
            with Consumer(cons_ep, "tiny4", os.path.join(tmp, "w4")) as c4:
                wait_names(c4)
                assert c4.describe("model.mask") == ("BOOL", (40,))
                c4.bind_module(w4, name_map=lambda n: "model." + n)
                apply_until(c4, 1)
                assert c4.describe("model.steps") == ("I64", (2,))
                assert c4.describe("model.stat") == ("F64", (5, 7))
                assert c4.version == 1 and torch.equal(w4.mask, m.mask) and w4.mask.any()
                for name in ("steps", "pos", "stat"):
                    assert torch.equal(getattr(w4, name), getattr(m, name)), name
                # a delta: the counter steps, a few positions move
                m.steps += 1
                m.pos[::97] += 1
                p4.publish(2)
                p4.wait(2)
                assert p4.stats().changed_elems <= 2 * (2 + 11), p4.stats().changed_elems
                apply_until(c4, 2)
                for name in ("steps", "pos", "stat"):
                    assert torch.equal(getattr(w4, name), getattr(m, name)), name
        c.close()
        print("test_python_torch_bind: ok")
        return 0
    finally:
        logging.getLogger("deltacast").removeHandler(records)
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
                pr.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
