"""The torch examples end to end: examples/trainer_torch.py trains the tiny
transformer of examples/tiny_lm.py and publishes every step through a real
broker; examples/rollout_worker.py generates batches with it, applying new
versions only between batches and tagging each output with its version.
The test paces the trainer so that every version gets batches (a step only
after the worker generated with the version before), then replays every
output with the trainer's saved weights of its tagged version: the logits
must be equal bit for bit (and the tokens the argmax of them), and with the
version before they must differ (so the check can tell versions apart).
Skips (77) without torch."""
import os
import re
import subprocess
import sys
import time

try:
    import torch
except ImportError:
    print(f"skip: no torch for {sys.executable} (apt-get install python3-torch)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_producer_python import procs, run_with_broker  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
sys.path.insert(0, EXAMPLES)
from tiny_lm import TinyLM, replay  # noqa: E402

STEPS = 4  # versions 1 (the initial weights) .. STEPS + 1


class Proc:
    """A process whose stdout lines the test waits on."""

    def __init__(self, tmp, name, args, **kw):
        self.out = os.path.join(tmp, name + ".out")
        self.err = os.path.join(tmp, name + ".err")
        self.name = name
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.p = subprocess.Popen([sys.executable, *args], stdout=o, stderr=e, **kw)
        procs.append(self.p)

    def wait_line(self, pattern, timeout_s=60):
        """Wait until a line matches `pattern`; fails if the process exits first
        or timeout_s pass."""
        rx = re.compile(pattern, re.M)
        deadline = time.monotonic() + timeout_s
        while True:
            exited = self.p.poll() is not None
            with open(self.out) as f:
                if rx.search(f.read()):
                    return
            if exited or time.monotonic() > deadline:
                why = f"exited {self.p.returncode}" if exited else f"no line in {timeout_s} s"
                raise AssertionError(f"{self.name} {why} before /{pattern}/: "
                                     f"{open(self.out).read()[-2000:]} {open(self.err).read()[-2000:]}")
            time.sleep(0.02)

    def finish(self):
        rc = self.p.wait(timeout=120)
        assert rc == 0, f"{self.name} exit {rc}: {open(self.err).read()[-3000:]}"


def run_examples(tmp, prod, cons):
    trainer = Proc(tmp, "trainer", [os.path.join(EXAMPLES, "trainer_torch.py"), "--broker", prod,
                                    "--model", "tiny-lm", "--steps", str(STEPS), "--save-dir",
                                    os.path.join(tmp, "versions"), "--paced"],
                   stdin=subprocess.PIPE, text=True)
    worker = Proc(tmp, "worker", [os.path.join(EXAMPLES, "rollout_worker.py"), "--broker", cons,
                                  "--model", "tiny-lm", "--dir", os.path.join(tmp, "w"), "--out",
                                  os.path.join(tmp, "out"), "--until-version", str(STEPS + 1)])
    for v in range(1, STEPS + 2):
        trainer.wait_line(rf"^published {v} {'anchor' if v == 1 else 'delta'} ")
        worker.wait_line(rf"^batch \d+ version {v}:")
        if v <= STEPS:
            trainer.p.stdin.write("step\n")
            trainer.p.stdin.flush()
    worker.finish()
    trainer.p.stdin.close()
    trainer.finish()
    print(open(trainer.out).read(), end="")


def check_outputs(tmp):
    """Every output's logits against a replay with its tagged version's weights."""
    torch.set_num_threads(1)  # as the worker: the same kernels, the same bits
    weights = {v: torch.load(os.path.join(tmp, "versions", f"v{v}.pt")) for v in range(1, STEPS + 2)}
    model = TinyLM().eval()
    outputs, versions = 0, {}
    names = sorted(os.listdir(os.path.join(tmp, "out")))
    assert names and not [n for n in names if n.endswith(".tmp")], names
    for name in names:
        rec = torch.load(os.path.join(tmp, "out", name))
        v, tokens, logits, plen = rec["version"], rec["tokens"], rec["logits"], rec["prompt_len"]
        model.load_state_dict(weights[v])
        again = replay(model, tokens, plen)
        for i in range(tokens.shape[0]):
            assert torch.equal(again[:, i], logits[:, i]), \
                f"{name} output {i}: logits differ from version {v}'s weights"
        assert torch.equal(tokens[:, plen:], logits.argmax(dim=-1).T), f"{name}: tokens"
        if v > 1:
            model.load_state_dict(weights[v - 1])
            assert not torch.equal(replay(model, tokens, plen), logits), \
                f"{name}: version {v - 1}'s weights give the same logits as version {v}'s"
        outputs += tokens.shape[0]
        versions[v] = versions.get(v, 0) + 1
    assert sorted(versions) == list(range(1, STEPS + 2)), f"batches per version: {versions}"
    print(f"test_torch_rollout: {outputs} outputs in {len(names)} batches (per version: "
          f"{versions}) equal a replay with their tagged version's weights")


def main():
    def body(tmp, prod, cons):
        run_examples(tmp, prod, cons)
        check_outputs(tmp)
    run_with_broker("dcast-torch-rollout-", body)
    print("test_torch_rollout: ok")


if __name__ == "__main__":
    main()
