"""deltacast as a vLLM weight-transfer backend ("deltacast"): each vLLM
worker (one per TP / EP rank) runs an engine.EngineWorker bound into its
model's own parameters, and applies each version in place, on every rank
or on none (deltacast.worker.apply_all_ranks).

    # every vLLM process: the vllm.general_plugins entry point calls register()
    llm = LLM(model=..., weight_transfer_config=WeightTransferConfig(backend="deltacast"))
    llm.init_weight_transfer_engine({"init_info": {"broker": "tcp://broker:5556",
                                                   "model": "policy", "dir": "/local/dc"}})
    llm.start_weight_update()
    llm.update_weights({"update_info": {"version": v}})
    llm.finish_weight_update(weight_version=str(v))

receive_weights is a collective over every worker of the engine: each
rank waits (up to timeout_ms) for version v to be READY in its own
consumer, then the ranks agree over vLLM's world group (its gloo
cpu_group, deltacast.worker.TorchAgreement) and all apply v, never past
it, or none does: a rank without v in time makes every rank raise
DCAST_ETIMEDOUT naming each rank's version, and the engine keeps serving
the version every rank holds.  The backend's `served` (and RankUpdate's)
is the version the whole engine serves after the call.

What runs here and what does not.  RankUpdate, the per-rank part (open
the worker on a torch model, receive a version through an Agreement,
report the version served), imports without vLLM and is tested against
real brokers, producers and one process per rank agreeing over
torch.distributed gloo (tests/test_engine_vllm_ranks.py), as is
deltacast.engine.  The rest -- register(), ranks(), the group choice
(get_world_group().cpu_group) and the WeightTransferEngine subclass -- is
written from vLLM's sources (main branch, late 2026:
vllm/distributed/weight_transfer/base.py, WeightTransferEngine with
init_info_cls / update_info_cls, init_transfer_engine, start_weight_update,
receive_weights, finish_weight_update, shutdown, trainer_send_weights;
factory.py, WeightTransferEngineFactory.register_engine(name, module,
class_name); vllm/distributed/parallel_state.py, GroupCoordinator.cpu_group),
not run here: vLLM is not installed on the machines this package is
tested on.  This module imports without vLLM; the backend classes are
built on first use.  docs/engines.md has the whole flow."""
from __future__ import annotations

import os
from typing import Any, Optional

BACKEND = "deltacast"
_CLASSES: dict = {}


def register() -> bool:
    """Register the "deltacast" backend with vLLM's
    WeightTransferEngineFactory (lazily: this module is imported when an
    engine is created).  Returns False when vLLM does not import; True
    when registered now or before.  Point a `vllm.general_plugins` entry
    point at this function so every vLLM process runs it."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError:
        return False
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__,
                                                    "DeltacastWeightTransferEngine")
    return True


def ranks():
    """This worker's engine.Ranks from vLLM's TP group (experts take their
    placement from each FusedMoE layer, see engine.module_layouts)."""
    from vllm.distributed import (get_tensor_model_parallel_rank,
                                  get_tensor_model_parallel_world_size)
    from .engine import Ranks
    return Ranks(get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size())


def rank_dir(dir: str) -> str:
    """The local checkpoint directory of this process under `dir` (one per
    global rank: ranks on one host must not share it)."""
    import torch.distributed as dist
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return os.path.join(dir, f"rank{rank}")


class RankUpdate:
    """One engine rank's part of the backend, without vLLM: `worker` (an
    engine.EngineWorker bound into this rank's parameters) and
    `agreement` (a deltacast.worker.Agreement over every rank of the
    engine).  receive(version) moves every rank to `version` or none
    (EngineWorker.apply_all_ranks) and keeps the result in `served`."""

    def __init__(self, worker: Any, agreement: Any) -> None:
        self.worker, self.agreement, self.served = worker, agreement, None

    def receive(self, version: int, timeout_ms: Optional[int] = None) -> Any:
        """A collective: every rank calls it with the same version.
        Returns deltacast.worker.Served; errors as
        EngineWorker.apply_all_ranks (raised on every rank)."""
        self.served = None  # until every rank has said what it holds
        self.served = self.worker.apply_all_ranks(self.agreement, version, timeout_ms)
        return self.served

    @property
    def version(self) -> Optional[int]:
        """The version the whole engine serves after the last receive()
        (None before, and after one that failed)."""
        return self.served.version if self.served is not None else None

    def close(self) -> None:
        self.worker.close()


def _agreement() -> Any:
    """Every worker of this vLLM engine, over its world group's gloo group."""
    from vllm.distributed.parallel_state import get_world_group
    from .worker import TorchAgreement
    return TorchAgreement(get_world_group().cpu_group)


def _build() -> dict:
    """The backend's classes, defined against vLLM's base classes."""
    from dataclasses import dataclass, field

    from vllm.distributed.weight_transfer.base import (WeightTransferEngine,
                                                       WeightTransferInitInfo,
                                                       WeightTransferUpdateInfo)

    from .engine import open_module_worker

    @dataclass
    class DeltacastInitInfo(WeightTransferInitInfo):
        """broker, model, dir (each rank uses dir/rankN); stacked and
        experts: vLLM's mapping tables (default: the model's own); ignore:
        regexes of names left out; timeout_ms: for the manifest and each
        version; budget_bytes: the consumer's staging budget."""
        broker: str
        model: str
        dir: str
        stacked: Optional[list] = None
        experts: Optional[list] = None
        ignore: list = field(default_factory=list)
        timeout_ms: int = 600000
        budget_bytes: Optional[int] = None

    @dataclass
    class DeltacastUpdateInfo(WeightTransferUpdateInfo):
        """version: the version to hold after this update."""
        version: int
        timeout_ms: Optional[int] = None

    class DeltacastWeightTransferEngine(WeightTransferEngine):
        """In place: start and finish are no-ops, receive_weights applies
        the version into the parameters bound at init (CUDA graphs keep
        their addresses)."""
        init_info_cls = DeltacastInitInfo
        update_info_cls = DeltacastUpdateInfo

        def __init__(self, config: Any, vllm_config: Any, device: Any, model: Any) -> None:
            super().__init__(config, vllm_config, device, model)
            self.rank: Optional[RankUpdate] = None

        @property
        def served(self) -> Optional[int]:
            """The version the whole engine serves (None before the first)."""
            return self.rank.version if self.rank is not None else None

        def init_transfer_engine(self, init_info: DeltacastInitInfo) -> None:
            tables = [[tuple(t) for t in table] if table is not None else None
                      for table in (init_info.stacked, init_info.experts)]
            worker = open_module_worker(
                self.model, init_info.broker, init_info.model, rank_dir(init_info.dir), ranks(),
                stacked=tables[0], experts=tables[1], ignore=init_info.ignore,
                timeout_ms=init_info.timeout_ms, budget_bytes=init_info.budget_bytes)
            try:
                self.rank = RankUpdate(worker, _agreement())
            except BaseException:
                worker.close()
                raise

        def start_weight_update(self) -> None:
            pass  # applied in place: nothing to prepare

        def receive_weights(self, update_info: DeltacastUpdateInfo) -> None:
            if self.rank is None:
                raise RuntimeError("deltacast: init_weight_transfer_engine was not called")
            self.rank.receive(update_info.version, update_info.timeout_ms)

        def finish_weight_update(self) -> None:
            pass  # the weight-version label is set by the driver's call

        def shutdown(self) -> None:
            if self.rank is not None:
                self.rank.close()
                self.rank = None

        @staticmethod
        def trainer_send_weights(iterator: Any, trainer_args: Any) -> None:
            raise NotImplementedError("deltacast: trainers publish with deltacast.Producer "
                                      "through the broker, not through vLLM")

    return {"DeltacastInitInfo": DeltacastInitInfo, "DeltacastUpdateInfo": DeltacastUpdateInfo,
            "DeltacastWeightTransferEngine": DeltacastWeightTransferEngine}


def __getattr__(name: str) -> Any:
    """The backend classes, built on first use (ImportError without vLLM)."""
    if name not in ("DeltacastInitInfo", "DeltacastUpdateInfo", "DeltacastWeightTransferEngine"):
        raise AttributeError(f"module {__name__} has no attribute {name}")
    if not _CLASSES:
        try:
            _CLASSES.update(_build())
        except ImportError as e:
            raise ImportError(f"deltacast.vllm.{name} needs vLLM's weight-transfer API "
                              f"(vllm.distributed.weight_transfer): {e}") from e
    return _CLASSES[name]
