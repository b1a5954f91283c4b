"""A rollout worker loop on deltacast: generation runs on the live weights,
new versions are staged by the consumer's own thread meanwhile, applied
between generation steps (the engine's pause points), and every generated
sample carries the version of the weights that produced it.

    python3 examples/rollout_worker.py --broker tcp://127.0.0.1:5556 \
        --model policy --dir /tmp/worker0 --samples 100

The "model" here is a toy (a sum over the weights) so the loop runs
anywhere; a real worker binds its engine's parameter tensors instead."""
import argparse
import sys

import numpy as np

from deltacast import Consumer


def generate(weights, prompt):
    """Stand-in for an inference step: depends on every weight."""
    return float(sum(float(w.astype(np.float64).sum()) for w in weights.values())) + prompt


def run(broker, model, dir, samples, min_version=None, poll_ms=50, budget_bytes=64 << 20):
    """Generate `samples` samples; each is (prompt, output, version).  Waits
    for the first version (and for min_version, if given) before starting."""
    out = []
    with Consumer(broker, model, dir, budget_bytes=budget_bytes) as c:
        while not c.names() or c.version is None or (min_version and c.version < min_version):
            c.poll(poll_ms)  # events are optional: this only waits for one
            if c.ready_version is not None:
                c.apply(c.ready_version)
        weights = {}
        for name in c.names():
            live = c.tensor(name)
            weights[name] = np.empty_like(live)
            c.bind(name, weights[name])  # the engine's own buffers become the live tensors
        for prompt in range(samples):
            if c.ready_version is not None:  # the pause point: one whole version at once
                c.apply(c.ready_version)
            ev = c.poll(0)  # optional: report what the consumer's thread ran into
            if ev and ev.type in ("gap", "error"):
                print(f"worker: {ev.type} at version {ev.version}: {ev.text}", file=sys.stderr)
            version = c.version  # read together with the weights it tags
            out.append((prompt, generate(weights, prompt), version))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--broker", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--samples", type=int, default=100)
    a = ap.parse_args()
    for prompt, output, version in run(a.broker, a.model, a.dir, a.samples):
        print(f"sample {prompt} version {version} output {output:.6g}")


if __name__ == "__main__":
    main()
