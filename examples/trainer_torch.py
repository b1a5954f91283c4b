"""A trainer loop that publishes its weights after every optimizer step.

    python3 examples/trainer_torch.py tcp://127.0.0.1:5555

Needs torch (not required by the tests).  Run a broker first:
    build/deltacast-broker --producers tcp://127.0.0.1:5555 --consumers tcp://127.0.0.1:5556
"""
import sys

import torch

from deltacast import Producer

model = torch.nn.Linear(1024, 1024).to(torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

with Producer(sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555", "example") as p:
    for name, param in model.named_parameters():
        p.register(name, param)  # the parameter itself: a replaced param.data is followed
    for step in range(1, 11):
        loss = model(torch.randn(8, 1024, dtype=torch.bfloat16)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()  # in place: the registered data_ptr()s stay valid
        p.publish(step)  # anchor first, then deltas against the last acknowledged step
        p.wait(step)
        s = p.stats()
        print(f"step {step}: {'anchor' if s.anchor else 'delta'} {s.payload_bytes} bytes, "
              f"{s.changed_elems}/{s.elems} changed")
