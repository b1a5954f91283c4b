"""All ranks or none: the ranks of one serving engine (tensor- or
expert-parallel processes, each with its own Consumer) move to a new
version together, or not at all.

    agree = TorchAgreement()                # or FileAgreement(dir, rank, size)
    ...                                     # at each pause point, on every rank:
    served = apply_all_ranks(consumer, agree)
    print(served.version)                   # what the engine serves now

apply_all_ranks() is a collective: every rank calls it at the same pause
point.  Round 1 all-gathers, per rank, the versions its consumer could
hold after one apply (the one it holds, once the broker confirmed its run,
and its READY chain, Consumer.ready_versions()); the target is the newest
version in every rank's list.  Each rank applies it (one apply() call,
however many READY versions lead up to it: newest first, in one pause) or
does nothing when there is none: a rank that falls behind, or whose
consumer is not confirmed by the broker yet, holds every rank back.
Round 2 all-gathers what each rank holds afterwards, so every rank returns
the same Served: the version the whole engine serves (None while ranks
differ or hold nothing), and each rank's.  An apply that fails on one
rank (the consumer keeps its previous version) raises DeltacastError
DCAST_ESTATE on every rank, naming the rank, its error and every rank's
version, after round 2, so no rank is left waiting in a collective.

The agreement step is pluggable: anything with rank, size and
all_gather(value) -> [value of rank 0, 1, ...] (values are small dicts of
ints and strings).  TorchAgreement uses torch.distributed (the engine's own
process group); FileAgreement uses files in a directory every rank sees
(tests, or engines without torch.distributed)."""
from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, NamedTuple, Optional

from ._lib import DeltacastError, fail, need_int


class Served(NamedTuple):
    """What apply_all_ranks() left: version, the version every rank holds
    (None when they differ or none holds one); ranks, each rank's version
    (None: none, or not confirmed by the broker); applied, whether this
    call applied a version."""
    version: Optional[int]
    ranks: List[Optional[int]]
    applied: bool


class Agreement:
    """The collective apply_all_ranks() runs on: rank (0..size-1), size,
    and all_gather(value), which every rank calls in the same order and
    which returns every rank's value, by rank."""
    rank: int = 0
    size: int = 1

    def all_gather(self, value: Dict[str, Any]) -> List[Dict[str, Any]]:
        raise NotImplementedError


class TorchAgreement(Agreement):
    """all_gather over torch.distributed (all_gather_object) in `group`
    (None: the default group, initialised by the engine)."""

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise fail("DCAST_ESTATE", "TorchAgreement: torch.distributed is not initialised "
                                       "(init_process_group first, or use FileAgreement)")
        self._dist, self.group = dist, group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)

    def all_gather(self, value: Dict[str, Any]) -> List[Dict[str, Any]]:
        out: List[Any] = [None] * self.size
        self._dist.all_gather_object(out, value, group=self.group)
        return out


class FileAgreement(Agreement):
    """all_gather through files in `dir` (shared by the ranks: the same
    host, or a shared file system): round n, rank r writes
    dir/n.r.json (atomically: a temporary file renamed) and waits until
    every rank's file of round n is there; it removes its file of round
    n - 2, which every rank has read.  timeout_ms (-1: forever): a rank
    missing that long raises DeltacastError DCAST_ETIMEDOUT naming the
    ranks not there.  Every rank must start at round 0 with an empty
    directory of its own rounds."""

    def __init__(self, dir: str, rank: int, size: int, timeout_ms: int = 60000) -> None:
        self.size = need_int("FileAgreement: size", size, 1)
        self.rank = need_int("FileAgreement: rank", rank, 0, size - 1)
        self.timeout_ms = need_int("FileAgreement: timeout_ms", timeout_ms, -1)
        self.dir, self.round = os.fspath(dir), 0
        os.makedirs(self.dir, exist_ok=True)

    def _path(self, n: int, rank: int) -> str:
        return os.path.join(self.dir, f"{n}.{rank}.json")

    def _read(self, n: int, rank: int) -> Optional[Dict[str, Any]]:
        try:
            with open(self._path(n, rank)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def all_gather(self, value: Dict[str, Any]) -> List[Dict[str, Any]]:
        n, self.round = self.round, self.round + 1
        tmp = self._path(n, self.rank) + ".tmp"
        with open(tmp, "w") as f:
            json.dump(value, f)
        os.replace(tmp, self._path(n, self.rank))
        end, pause = time.monotonic() + self.timeout_ms / 1000.0, 0.001
        got: List[Optional[Dict[str, Any]]] = [None] * self.size
        while True:
            got = [g if g is not None else self._read(n, r) for r, g in enumerate(got)]
            missing = [r for r, g in enumerate(got) if g is None]
            if not missing:
                break
            if self.timeout_ms >= 0 and time.monotonic() > end:
                raise fail("DCAST_ETIMEDOUT", f"FileAgreement {self.dir}: round {n}: ranks "
                                              f"{missing} of {self.size} not there in "
                                              f"{self.timeout_ms} ms")
            time.sleep(pause)  # the other ranks' files are the event: polled
            pause = min(2 * pause, 0.02)
        if n >= 2:
            try:
                os.unlink(self._path(n - 2, self.rank))
            except FileNotFoundError:
                pass
        return [g for g in got if g is not None]


def _reachable(consumer: Any) -> List[int]:
    """The versions the consumer can hold after one apply: the one it holds
    (confirmed by the broker) and its READY chain; [] before the broker
    confirmed its run (its state may be an earlier run's)."""
    if not consumer.confirmed:
        return []
    held = consumer.version
    return ([held] if held is not None else []) + consumer.ready_versions()


def _target(lists: List[List[int]], upto: Optional[int]) -> Optional[int]:
    common = [v for v in set(lists[0]).intersection(*lists[1:]) if upto is None or v <= upto]
    return max(common) if common else None


def apply_all_ranks(consumer: Any, agreement: Agreement, upto: Optional[int] = None) -> Served:
    """On every rank of an engine at one pause point (a collective): apply
    the newest version that every rank holds READY (or holds already), on
    every rank, in one apply() call each; returns Served (the same on every
    rank).  upto: never past this version (the one a driver asked for;
    every rank must pass the same).  Errors: DeltacastError DCAST_ESTATE on
    every rank when an apply failed on one (see the module doc); what
    agreement.all_gather raises."""
    lists = [v["can"] for v in agreement.all_gather({"can": _reachable(consumer)})]
    target, error, applied = _target(lists, upto), None, False
    if target is not None and consumer.version != target:
        try:
            consumer.apply(target)
            applied = True
        except DeltacastError as e:
            error = f"{e.name}: {e.detail}"
    after = agreement.all_gather({"have": consumer.version, "error": error})
    ranks = [a["have"] for a in after]
    failed = [(r, a["error"]) for r, a in enumerate(after) if a["error"]]
    if failed:
        why = "; ".join(f"rank {r}: {e}" for r, e in failed)
        raise fail("DCAST_ESTATE", f"all ranks or none: the apply of version {target} failed "
                                   f"({why}); the ranks hold {ranks}")
    same = ranks[0] if all(r == ranks[0] for r in ranks) else None
    return Served(same, ranks, applied)
