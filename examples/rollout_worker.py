"""A rollout worker on deltacast: it generates tokens with the tiny
transformer of tiny_lm.py in batches, while the consumer's own thread
receives and checks new versions; it applies a new version only between
batches (its pause points), and tags every output with the version of the
weights that produced it.

    python3 examples/rollout_worker.py --broker tcp://127.0.0.1:5556 --dir /tmp/worker0

The worker first waits for the broker's WELCOME (wait_confirmed): a
version its directory holds from an earlier run is not served until the
broker confirms it, and a broker that cannot be reached is named in the
error.  The model's parameters are bound to the consumer (bind_module):
apply() writes each version straight into them (the newest READY one,
however many are waiting), nothing is copied or reloaded.
Prints one line per batch:
    batch N version V: PROMPT -> GENERATED      (the first sequence of the batch)
--out DIR also saves each batch as DIR/batch-N.pt (torch.save of a dict:
version, prompt_len, tokens, logits), to check against the trainer's
weights for that version (tests/test_torch_rollout.py does)."""
import argparse
import os
import sys

import torch

from deltacast import Consumer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_lm import TinyLM, generate, progressions  # noqa: E402


def wait_manifest(c, poll_ms=50):
    """Block until the consumer knows the model's tensors (manifest or local checkpoint)."""
    while not c.names():
        c.poll(poll_ms)  # events are optional: this only waits for one


def save(out_dir, batch, record):
    path = os.path.join(out_dir, f"batch-{batch:05d}.pt")
    torch.save(record, path + ".tmp")
    os.replace(path + ".tmp", path)


def run(broker, model_name, dir, out_dir=None, until_version=None, batches=None, batch_size=4,
        prompt_len=8, new_tokens=8, seed=0, poll_ms=50, confirm_ms=30000):
    """Generate batches until one ran on a version >= until_version, or
    `batches` batches (None: forever).  Returns the number of batches."""
    model = TinyLM().eval()
    gen = torch.Generator().manual_seed(seed)
    model_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    with Consumer(broker, model_name, dir, model_bytes=model_bytes) as c:
        c.wait_confirmed(confirm_ms)  # DCAST_ECLOSED naming the broker when it is unreachable
        wait_manifest(c, poll_ms)
        c.bind_module(model)  # the parameters become the live tensors
        n = 0
        while batches is None or n < batches:
            ready = c.ready_version
            if ready is not None:  # the pause point, between batches: the newest
                c.apply(ready)     # version, and every READY one before it, in one call
            version = c.version  # what the weights hold until the next apply
            if version is None:
                c.poll(poll_ms)
                continue
            prompts = progressions(gen, batch_size, prompt_len)
            tokens, logits = generate(model, prompts, new_tokens)
            if out_dir:
                save(out_dir, n, {"version": version, "prompt_len": prompt_len,
                                  "tokens": tokens, "logits": logits})
            print(f"batch {n} version {version}: {' '.join(map(str, tokens[0, :prompt_len].tolist()))}"
                  f" -> {' '.join(map(str, tokens[0, prompt_len:].tolist()))}", flush=True)
            n += 1
            if until_version is not None and version >= until_version:
                break
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--broker", default="tcp://127.0.0.1:5556")
    ap.add_argument("--model", default="tiny-lm")
    ap.add_argument("--dir", required=True, help="local checkpoint directory")
    ap.add_argument("--out", help="save every batch here")
    ap.add_argument("--until-version", type=int, help="stop after a batch on this version")
    ap.add_argument("--batches", type=int, help="stop after this many batches")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    run(a.broker, a.model, a.dir, a.out, a.until_version, a.batches, a.batch_size, seed=a.seed)


if __name__ == "__main__":
    main()
