"""A trainer that publishes its weights through deltacast: the tiny
transformer of tiny_lm.py, trained in place (bf16 AdamW), published as
version 1 before the first step (an anchor) and as the next version after
every step (deltas against the last acknowledged one).  Restarted
against a broker that already holds versions of the model, it numbers
its versions on from the broker's newest (Producer.broker_version).

    python3 examples/trainer_torch.py --broker tcp://127.0.0.1:5555 --steps 300

Run a broker first:
    build/deltacast-broker --producers tcp://127.0.0.1:5555 --consumers tcp://127.0.0.1:5556
and any number of examples/rollout_worker.py.  Prints one line per version:
    published V anchor|delta bytes B changed C/E loss L
--save-dir DIR also writes each published version's weights to DIR/vV.pt
(torch.save of the state dict), to check workers against.  --paced takes a
step only when a line arrives on stdin (EOF stops), so that a driver sets
the pace."""
import argparse
import os
import sys

import torch

from deltacast import Producer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_lm import TinyLM, train_step  # noqa: E402


def save(model, save_dir, version):
    """DIR/vV.pt: the weights of `version`, written whole (tmp, rename)."""
    path = os.path.join(save_dir, f"v{version}.pt")
    torch.save({k: t.clone() for k, t in model.state_dict().items()}, path + ".tmp")
    os.replace(path + ".tmp", path)


def publish(p, model, version, save_dir, loss):
    """Send `version` and wait for the broker's acknowledgement; then save it."""
    p.publish(version)
    p.wait(version)
    if save_dir:
        save(model, save_dir, version)
    s = p.stats()
    print(f"published {version} {'anchor' if s.anchor else 'delta'} bytes {s.payload_bytes} "
          f"changed {s.changed_elems}/{s.elems} loss {loss:.4f}", flush=True)


def run(broker, model_name, steps, save_dir=None, paced=False, seed=0, lr=3e-3):
    """Train `steps` steps, publishing versions first .. first + steps,
    first being 1, or one above the broker's newest."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    if save_dir:
        os.makedirs(save_dir, exist_ok=True)
    with Producer(broker, model_name) as p:
        p.register_module(model)  # the parameters themselves: opt.step() updates them in place
        first = (p.broker_version or 0) + 1  # a restarted trainer goes on from there
        if first > 1:
            print(f"the broker holds version {first - 1}: publishing from {first}", flush=True)
        publish(p, model, first, save_dir, float("nan"))
        for version in range(first + 1, first + steps + 1):
            if paced and not sys.stdin.readline():
                break
            loss = train_step(model, opt, gen)
            publish(p, model, version, save_dir, loss)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--broker", default="tcp://127.0.0.1:5555")
    ap.add_argument("--model", default="tiny-lm")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--save-dir")
    ap.add_argument("--paced", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    run(a.broker, a.model, a.steps, a.save_dir, a.paced, a.seed, a.lr)


if __name__ == "__main__":
    main()
