"""Consumer.tensor() of a BF16 tensor is a torch.bfloat16 tensor where torch
imports: a trainer publishes a torch bf16 weight through a real broker;
the worker's tensor("w") has dtype torch.bfloat16 and the trainer's
values bit for bit, is a view that follows the next apply(), and
as_numpy=True gives the uint16 bit patterns of the same memory.  Skips
(77) without torch."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_producer_python import drive, run_with_broker  # noqa: E402

try:
    import torch
except ImportError:
    print("skip: no torch for this python (apt-get install python3-torch)")
    sys.exit(77)
import numpy as np  # noqa: E402

from deltacast import Consumer, Producer  # noqa: E402

DEADLINE_S = 20


def body(tmp, prod_ep, cons_ep):
    torch.manual_seed(4)
    w = torch.randn(48, 16).to(torch.bfloat16)
    with Producer(prod_ep, "tbf16") as p, \
            Consumer(cons_ep, "tbf16", os.path.join(tmp, "w"), budget_bytes=16 << 20) as c:
        p.register("w", w)
        p.publish(1)
        p.wait(1, DEADLINE_S * 1000)
        drive(c, 1)
        got = c.tensor("w")
        assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16, type(got)
        assert got.shape == w.shape and torch.equal(got, w)
        bits = c.tensor("w", as_numpy=True)
        assert bits.dtype == np.uint16
        assert np.array_equal(bits, w.view(torch.int16).numpy().view(np.uint16))
        w[3, :] += 1
        p.publish(2)
        p.wait(2, DEADLINE_S * 1000)
        drive(c, 2)
        assert torch.equal(got, w), "tensor() is not a view of the live tensor"
    print("tensor() of BF16: torch.bfloat16, live view, as_numpy bits: ok")


if __name__ == "__main__":
    run_with_broker("dcast-worker-torch-", body)
    print("test_worker_torch: ok")
