"""Progress from the Python API, read from another thread: a Producer's
progress() while an anchor is published (publish() and wait() on a thread
of their own), and a Consumer's bytes_received() while an anchor stages.
The broker is stopped (SIGSTOP) as soon as a transfer is seen moving, so
each reading is taken mid-transfer whatever the machine's speed: the broker
grants a 1 MiB window to the producer, and the consumer's budget is 2 MiB,
so neither side can run ahead of it.  The reading is taken twice once every
thread of the broker is stopped: the second may have moved by what was in
flight when the broker stopped (at most that window or budget), no more,
and both are below the anchor's size.

On a loaded machine this thread can be descheduled between seeing the
transfer move and stopping the broker for long enough that the whole
anchor went through; that attempt proves nothing, so it is printed and
the case runs again on a fresh transfer (the producer under a new model
name, the consumer a new one in a new directory), up to ATTEMPTS times.
Any other wrong reading fails at once."""
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
TENSORS = ("a", "b", "c", "d")  # 16 MiB of float32: a wider window to stop in
PRODUCER_WINDOW = 1 << 20  # the broker's --producer-window-bytes
CONSUMER_BUDGET = 2 << 20  # the consumer's budget_bytes: its window
RANGE = 1 << 16  # 256 KiB chunks of float32
ATTEMPTS = 5


def until(what, cond, deadline_s=30):
    """Poll cond() (no sleep: readings must catch a transfer mid-way)."""
    deadline = time.monotonic() + deadline_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {deadline_s} s")


def all_stopped(pid):
    """Every thread of process pid is stopped by a signal (state T)."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return bool(states) and all(s in ("T", "t") for s in states)


def held(broker, read, total, slack):
    """Stop the broker at the first reading above 0 and read twice once all
    its threads are stopped: both readings must be below total, the second
    at most slack above the first (bytes already in flight, within the
    window the broker had granted, still land).  Returns the first reading,
    or None when the transfer raced past its end before the broker
    stopped."""
    until("a transfer moving", lambda: read() > 0)
    broker.send_signal(signal.SIGSTOP)
    try:
        until("the broker stopped", lambda: all_stopped(broker.pid))
        first = read()
        second = read()
        if first == total:
            return None
        assert 0 < first < total, f"reading {first} of {total} is not mid-transfer"
        assert first <= second <= first + slack and second < total, \
            f"reading moved from {first} to {second} of {total} with the broker stopped (slack {slack})"
        return first
    finally:
        broker.send_signal(signal.SIGCONT)


def retried(case, what):
    """case(attempt) until it returns a mid-transfer reading, ATTEMPTS at
    most; each attempt that raced past the end is printed."""
    for attempt in range(ATTEMPTS):
        seen = case(attempt)
        if seen is not None:
            return seen
        print(f"{what}: attempt {attempt + 1} read the whole anchor before the broker "
              f"stopped; again on a fresh transfer", flush=True)
    raise AssertionError(f"{what}: every one of {ATTEMPTS} attempts raced past the end")


def producer_once(broker, prod_ep, model, arrays, total):
    p = Producer(prod_ep, model, range_elems=RANGE)
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
    try:
        until("publish started", lambda: p.progress().active)
        seen = held(broker, lambda: p.progress().bytes_taken, total, PRODUCER_WINDOW)
    finally:
        t.join(60)
    assert not t.is_alive() and not errors, errors
    pr = p.progress()
    assert not pr.active and pr.anchor and pr.bytes_total == total, (pr.active, pr.bytes_total)
    assert pr.bytes_taken == total and pr.bytes_sent == total, (pr.bytes_taken, pr.bytes_sent)
    p.close()
    if seen is not None:
        print(f"producer: progress() read {seen} of {total} bytes mid-anchor, then {pr.bytes_taken}")
    return seen


def consumer_once(broker, cons_ep, model, directory, total):
    c = Consumer(cons_ep, model, directory, budget_bytes=CONSUMER_BUDGET)
    try:
        seen = held(broker, c.bytes_received, total, CONSUMER_BUDGET)
        if seen is not None:
            assert c.version is None, "applied before the anchor arrived whole"
        until("version 1 ready", lambda: c.ready_version == 1)
        c.apply(1)
        assert c.bytes_received() >= total
    finally:
        c.close()
    if seen is not None:
        print(f"consumer: bytes_received() read {seen} of {total} bytes while the anchor staged")
    return seen


def main():
    arrays = {n: np.random.default_rng(i).standard_normal(ELEMS).astype(np.float32)
              for i, n in enumerate(TENSORS)}
    total = sum(a.nbytes for a in arrays.values())

    def body(tmp, prod_ep, cons_ep):
        broker = procs[0]
        models = []

        def producer_case(attempt):
            models.append(f"progress{attempt}")
            return producer_once(broker, prod_ep, models[-1], arrays, total)

        def consumer_case(attempt):
            return consumer_once(broker, cons_ep, models[-1], os.path.join(tmp, f"c{attempt}"),
                                 total)
        retried(producer_case, "producer")
        retried(consumer_case, "consumer")
    run_with_broker("dcast-progress-", body, "--producer-window-bytes", str(PRODUCER_WINDOW))
    print("test_python_progress: ok")


if __name__ == "__main__":
    main()
