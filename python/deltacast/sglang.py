"""deltacast as an SGLang custom weight loader: every TP rank's model
runner calls load(model, named_tensors), which opens (once per model) an
engine.EngineWorker bound into the model's own parameters and applies the
version named by the update in place, on every TP rank or on none
(deltacast.worker.apply_all_ranks over the TP group's gloo group).

    DELTACAST_BROKER=tcp://broker:5556 DELTACAST_MODEL=policy DELTACAST_DIR=/local/dc \\
        python -m sglang.launch_server --model-path ... \\
        --custom-weight-loader deltacast.sglang.load

    # the driver, per version v (weight_version labels it; flush_cache
    # drops the prefix cache computed with the old weights)
    engine.update_weights_from_tensor(
        named_tensors=[(VERSION_TENSOR, torch.tensor([v]))],
        load_format="deltacast.sglang.load", weight_version=str(v), flush_cache=True)

The worker is configured from the environment of the SGLang processes
(config_from_env): DELTACAST_BROKER, DELTACAST_MODEL, DELTACAST_DIR (each
rank uses DIR/rankN), DELTACAST_TIMEOUT_MS, DELTACAST_BUDGET_BYTES, and
DELTACAST_IGNORE (comma-separated regexes).  The stacked and expert
tables come from the model (packed_modules_mapping, get_expert_mapping).

Written from SGLang's sources (python/sglang/srt/model_executor/
model_runner.py: update_weights_from_tensor calls
dynamic_import(load_format)(self.model, named_tensors) when load_format
is listed in --custom-weight-loader; sglang/srt/distributed for the TP
group, get_tp_group().cpu_group), not run here: SGLang is not installed
on the machines this package is tested on.  The engine-neutral part
(deltacast.engine) and the per-rank update (deltacast.vllm.RankUpdate,
shared with the vLLM backend) are tested against real brokers.  docs/engines.md has the whole flow."""
from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

VERSION_TENSOR = "deltacast.version"
_workers: Dict[int, Any] = {}  # id(model) -> deltacast.vllm.RankUpdate


def config_from_env(env: Mapping[str, str] = os.environ) -> Dict[str, Any]:
    """EngineWorker arguments from DELTACAST_* variables; ValueError naming
    a missing or malformed one."""
    missing = [k for k in ("DELTACAST_BROKER", "DELTACAST_MODEL", "DELTACAST_DIR") if not env.get(k)]
    if missing:
        raise ValueError(f"deltacast.sglang: set {', '.join(missing)} in the environment of "
                         "the SGLang server")
    out: Dict[str, Any] = {"broker": env["DELTACAST_BROKER"], "model": env["DELTACAST_MODEL"],
                           "dir": env["DELTACAST_DIR"],
                           "ignore": [p for p in env.get("DELTACAST_IGNORE", "").split(",") if p]}
    for key, arg in (("DELTACAST_TIMEOUT_MS", "timeout_ms"),
                     ("DELTACAST_BUDGET_BYTES", "budget_bytes")):
        if env.get(key):
            try:
                out[arg] = int(env[key])
            except ValueError:
                raise ValueError(f"deltacast.sglang: {key}={env[key]!r} is not an integer") \
                    from None
    return out


def version_of(named_tensors: Sequence[Tuple[str, Any]]) -> int:
    """The version an update names: the one-element integer tensor
    VERSION_TENSOR among named_tensors; ValueError otherwise."""
    found = [t for n, t in named_tensors if n == VERSION_TENSOR]
    if len(found) != 1 or found[0].numel() != 1 or found[0].is_floating_point():
        names = [n for n, _ in named_tensors]
        raise ValueError(f"deltacast.sglang: the update must carry one integer tensor "
                         f"{VERSION_TENSOR!r} holding the version, got {names}")
    return int(found[0].item())


def _ranks():
    from sglang.srt.distributed import (get_tensor_model_parallel_rank,
                                        get_tensor_model_parallel_world_size)
    from .engine import Ranks
    return Ranks(get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size())


def _open(model: Any, env: Optional[Mapping[str, str]] = None) -> Any:
    from .engine import open_module_worker
    cfg = config_from_env(os.environ if env is None else env)
    r = _ranks()
    return open_module_worker(model, cfg.pop("broker"), cfg.pop("model"),
                              os.path.join(cfg.pop("dir"), f"rank{r.tp_rank}"), r, **cfg)


def _agreement() -> Any:
    """Every TP rank of this SGLang engine, over its TP group's gloo group."""
    from sglang.srt.distributed import get_tp_group
    from .worker import TorchAgreement
    return TorchAgreement(get_tp_group().cpu_group)


def load(model: Any, named_tensors: Sequence[Tuple[str, Any]]) -> None:
    """SGLang's custom weight loader: bring `model` (this rank's) to the
    version named in named_tensors, in place, on every TP rank or on none
    (a collective: every rank's model runner calls it for the update).  The
    first call opens and binds the worker (waiting for the manifest).
    Errors: DeltacastError DCAST_ETIMEDOUT on every rank when some rank
    does not have the version READY in time (no rank moves to it)."""
    from .vllm import RankUpdate
    version = version_of(named_tensors)
    rank = _workers.get(id(model))
    if rank is None:
        worker = _open(model)
        try:
            rank = _workers[id(model)] = RankUpdate(worker, _agreement())
        except BaseException:
            worker.close()
            raise
    rank.receive(version)


def close() -> None:
    """Close every worker this process opened; parameters keep their values."""
    for w in _workers.values():
        w.close()
    _workers.clear()
