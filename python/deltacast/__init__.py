"""deltacast: stream model weights from trainers to rollout workers.

Python binding over libdeltacast (ctypes, no compile step).  Producer
publishes versions of a model's tensors (numpy or torch); Consumer receives
them and applies each whole, checked version to live tensors.  The C
library's log lines go to logging.getLogger("deltacast"); failing calls
raise DeltacastError (.name "DCAST_...", .text, .detail).

Serving engines: deltacast.engine maps the trainer's tensors onto an
engine's fused, sharded parameters and binds them in place;
deltacast.vllm and deltacast.sglang plug it into vLLM and SGLang
(docs/engines.md); deltacast.worker moves every rank of an engine to a
new version together or not at all.  Import them explicitly."""
from ._lib import (DeltacastArgumentError, DeltacastError, DeltacastTimeout, library_path,
                   read_curve_key, set_log_level)
from ._version import __version__
from .consumer import Consumer, Event, default_budget
from .producer import Producer

__all__ = ["Consumer", "DeltacastArgumentError", "DeltacastError", "DeltacastTimeout", "Event",
           "Producer", "__version__", "default_budget", "library_path", "read_curve_key",
           "set_log_level"]
