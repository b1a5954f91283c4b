"""Progress from the Python API, read from another thread: a Producer's
progress() while an anchor is published (publish() and wait() on a thread
of their own), and a Consumer's bytes_received() while an anchor stages.
The broker is stopped (SIGSTOP) as soon as a transfer is seen moving, so
each reading is taken mid-transfer whatever the machine's speed: the broker
grants a 1 MiB window to the producer, and the consumer's budget is 2 MiB,
so neither side can run ahead of it."""
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_producer_python import procs, run_with_broker  # noqa: E402

import numpy as np  # noqa: E402

from deltacast import Consumer, Producer  # noqa: E402

ELEMS = 1 << 20
RANGE = 1 << 16  # 256 KiB chunks of float32


def until(what, cond, deadline_s=30):
    """Poll cond() (no sleep: readings must catch a transfer mid-way)."""
    deadline = time.monotonic() + deadline_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {deadline_s} s")


def held(broker, read, total):
    """Stop the broker at the first reading above 0; the reading must stay
    below total and unchanged while it is stopped.  Returns it."""
    until("a transfer moving", lambda: read() > 0)
    broker.send_signal(signal.SIGSTOP)
    try:
        first = read()
        assert 0 < first < total, f"reading {first} of {total} is not mid-transfer"
        return first
    finally:
        broker.send_signal(signal.SIGCONT)


def producer_case(broker, prod_ep, arrays, total):
    p = Producer(prod_ep, "progress", range_elems=RANGE)
    for n, a in arrays.items():
        p.register(n, a)
    errors = []

    def publish():
        try:
            p.publish(1)
            p.wait(1, 60000)
        except Exception as e:  # reported by the main thread
            errors.append(e)
    t = threading.Thread(target=publish)
    t.start()
    until("publish started", lambda: p.progress().active)
    seen = held(broker, lambda: p.progress().bytes_taken, total)
    t.join(60)
    assert not t.is_alive() and not errors, errors
    pr = p.progress()
    assert not pr.active and pr.anchor and pr.bytes_total == total, (pr.active, pr.bytes_total)
    assert pr.bytes_taken == total and pr.bytes_sent == total, (pr.bytes_taken, pr.bytes_sent)
    p.close()
    print(f"producer: progress() read {seen} of {total} bytes mid-anchor, then {pr.bytes_taken}")


def consumer_case(broker, cons_ep, tmp, total):
    c = Consumer(cons_ep, "progress", os.path.join(tmp, "c"), budget_bytes=2 << 20)
    seen = held(broker, c.bytes_received, total)
    assert c.version is None, "applied before the anchor arrived whole"
    until("version 1 ready", lambda: c.ready_version == 1)
    c.apply(1)
    assert c.bytes_received() >= total
    c.close()
    print(f"consumer: bytes_received() read {seen} of {total} bytes while the anchor staged")


def main():
    arrays = {n: np.random.default_rng(i).standard_normal(ELEMS).astype(np.float32)
              for i, n in enumerate(("a", "b"))}
    total = sum(a.nbytes for a in arrays.values())

    def body(tmp, prod_ep, cons_ep):
        broker = procs[0]
        producer_case(broker, prod_ep, arrays, total)
        consumer_case(broker, cons_ep, tmp, total)
    run_with_broker("dcast-progress-", body, "--producer-window-bytes", str(1 << 20))
    print("test_python_progress: ok")


if __name__ == "__main__":
    main()
