"""deltacast: stream model weights from trainers to rollout workers.

Python binding over libdeltacast.so (ctypes, no compile step)."""
from ._lib import DeltacastError
from .producer import Producer
from .consumer import Consumer

__all__ = ["Consumer", "DeltacastError", "Producer"]
