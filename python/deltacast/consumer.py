"""Consumer: receive versions of a model from a deltacast broker and apply
each whole, checked version to live tensors in one short step.

    with Consumer("tcp://127.0.0.1:5556", "policy", "/var/lib/worker") as c:
        c.bind("w", weights)               # numpy array or torch tensor (CPU or CUDA)
        while True:
            batch = generate(...)          # seconds or minutes: the consumer
            batch.version = c.version      # stays joined on its own thread
            if c.ready_version is not None:  # the engine's pause point
                c.apply(c.ready_version)

The consumer runs its own thread: it keeps the broker session, stages and
checks versions whether or not the caller calls in; poll() only hands out
events (optional).  It keeps a local checkpoint in `dir`
(DIR/model.safetensors plus a log of staged versions) and resumes from it
when opened again.  Tensors become known after the manifest arrives (or
from the checkpoint): bind() needs them, so wait until c.names() is not
empty.  A bound array must stay alive until close(); its contents change
only inside apply() (or on the consumer's thread with auto_apply=True).

bind() checks the array against the manifest: its dtype must hold the
published dtype (bf16 as torch.bfloat16 or uint16 bit patterns, fp8 as
uint8) and its shape must equal the published shape; anything else raises
DeltacastArgumentError naming the tensor, so weights are never filled with
reinterpreted bytes.

Tensors that the producers publish as tensor-parallel slices
(Producer.register_slice) are "tiled": the consumer sees them in their
natural layout whatever the producers' split.  bind() binds one whole;
bind_slice() binds any box of it (the block a worker rank of another TP
degree holds), kept up to date by every apply(); read_slice() copies a box
out; grid() tells the producers' split.

The staging budget (pinned pool plus broker credit) defaults to four times
the model's bytes, clamped to [16 MiB, 256 MiB], when the size is known
(model_bytes=, or DIR/model.safetensors from an earlier run), else 64 MiB.
One chunk payload must fit in a quarter of it (a dense chunk of the
producer's default 2^20 fp32 elements is 4 MiB)."""
from __future__ import annotations

import ctypes
import os
import struct
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _dtypes
from ._lib import (VERSION_NONE, Closable, StatsView, check, curve_keys, fail, lib, need_dims,
                   need_endpoint, need_int, need_str, version_or_none)

MEM_HOST, MEM_CUDA = 0, 1
MiB = 1 << 20
BUDGET_UNKNOWN_MODEL = 64 * MiB
BUDGET_MIN, BUDGET_MAX = 16 * MiB, 256 * MiB
_EVENTS = {0: None, 1: "ready", 2: "anchor", 3: "gap", 4: "error"}


class Event(NamedTuple):
    """What the consumer's thread reported (dcast_event): type is "ready",
    "anchor", "gap" or "error"."""
    type: str
    version: Optional[int]
    have_version: Optional[int]
    code: int
    text: str
    bytes: int


class _Opts(ctypes.Structure):
    _fields_ = [("verify_digests", ctypes.c_int), ("heartbeat_ms", ctypes.c_uint32),
                ("fold_every", ctypes.c_uint32), ("max_staged", ctypes.c_uint32),
                ("client", ctypes.c_char_p), ("curve_server_key", ctypes.c_char_p),
                ("curve_public_key", ctypes.c_char_p), ("curve_secret_key", ctypes.c_char_p),
                ("fold_fraction", ctypes.c_double), ("auto_apply", ctypes.c_int),
                ("commit_timeout_ms", ctypes.c_uint32), ("bulk", ctypes.c_int)]


class _Event(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("version", ctypes.c_uint64),
                ("have_version", ctypes.c_uint64), ("code", ctypes.c_int),
                ("bytes", ctypes.c_uint64), ("text", ctypes.c_char * 256)]


class _Desc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 256), ("dtype", ctypes.c_uint32),
                ("ndim", ctypes.c_uint32), ("shape", ctypes.c_uint64 * 8),
                ("grid", ctypes.c_uint32 * 8)]


class _Stats(ctypes.Structure):
    """The C layout of dcast_consumer_stats."""
    _fields_ = [("version", ctypes.c_uint64), ("anchor", ctypes.c_int),
                ("chunks", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("stage_ns", ctypes.c_uint64), ("apply_ns", ctypes.c_uint64),
                ("spilled_chunks", ctypes.c_uint64), ("total_bytes_received", ctypes.c_uint64),
                ("peak_pool_bytes", ctypes.c_uint64), ("pool_bytes", ctypes.c_uint64),
                ("log_write_bytes", ctypes.c_uint64), ("log_write_ns", ctypes.c_uint64),
                ("verify_bytes", ctypes.c_uint64), ("rejoins", ctypes.c_uint64),
                ("folds", ctypes.c_uint64), ("folding", ctypes.c_int),
                ("folds_from_tensors", ctypes.c_uint64), ("ready_backlog", ctypes.c_uint64),
                ("versions_aborted", ctypes.c_uint64), ("commit_timeouts", ctypes.c_uint64),
                ("bulk_versions", ctypes.c_uint64), ("bulk_failures", ctypes.c_uint64),
                ("bulk_in_place_bytes", ctypes.c_uint64),
                ("direct_write_bytes", ctypes.c_uint64)]


class Stats(StatsView):
    """Numbers of the version last applied (dcast_consumer_stats, field
    for field; version None before the first apply), and ready_backlog:
    the READY versions not yet applied that apply(ready_version) takes."""
    _versions = ("version",)


def _declare(l):
    vp, u32, u64, i = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int
    l.dcast_consumer_opts_init.argtypes = [ctypes.POINTER(_Opts)]
    l.dcast_consumer_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, u64,
                                      ctypes.POINTER(_Opts), ctypes.POINTER(vp)]
    l.dcast_consumer_close.argtypes = [ctypes.POINTER(vp)]
    l.dcast_consumer_bind.argtypes = [vp, ctypes.c_char_p, vp, i, u64]
    l.dcast_consumer_bind_slice.argtypes = [vp, ctypes.c_char_p, vp, i, u32, ctypes.POINTER(u64),
                                            ctypes.POINTER(u64), u64]
    l.dcast_consumer_unbind.argtypes = [vp, ctypes.c_char_p]
    l.dcast_consumer_read_slice.argtypes = [vp, ctypes.c_char_p, u32, ctypes.POINTER(u64),
                                            ctypes.POINTER(u64), vp, u64]
    l.dcast_consumer_tensor.argtypes = [vp, ctypes.c_char_p, ctypes.POINTER(vp),
                                        ctypes.POINTER(_Desc), ctypes.POINTER(i)]
    l.dcast_consumer_tensor_count.argtypes = [vp]
    l.dcast_consumer_tensor_count.restype = u32
    l.dcast_consumer_tensor_at.argtypes = [vp, u32, ctypes.POINTER(_Desc)]
    l.dcast_consumer_poll.argtypes = [vp, i, ctypes.POINTER(_Event)]
    l.dcast_consumer_apply.argtypes = [vp, u64]
    l.dcast_consumer_apply_async.argtypes = [vp, u64, vp, vp]
    l.dcast_consumer_version.argtypes = [vp]
    l.dcast_consumer_version.restype = u64
    l.dcast_consumer_ready_version.argtypes = [vp]
    l.dcast_consumer_ready_version.restype = u64
    l.dcast_consumer_wait_version.argtypes = [vp, u64, i]
    l.dcast_consumer_checkpoint.argtypes = [vp]
    l.dcast_consumer_stats_get.argtypes = [vp, ctypes.POINTER(_Stats)]
    l.dcast_consumer_run.argtypes = [vp]
    l.dcast_consumer_ready_versions.argtypes = [vp, ctypes.POINTER(u64), u32]
    l.dcast_consumer_ready_versions.restype = u32
    l.dcast_consumer_run.restype = u64
    return l


_ver = version_or_none


def _checkpoint_bytes(dir: str) -> Optional[int]:
    """Data bytes of DIR/model.safetensors (the model's size), or None."""
    path = os.path.join(dir, "model.safetensors")
    try:
        with open(path, "rb") as f:
            (hdr,) = struct.unpack("<Q", f.read(8))
        return max(0, os.path.getsize(path) - 8 - hdr)
    except (OSError, struct.error):
        return None


def default_budget(model_bytes: Optional[int]) -> int:
    """The staging budget Consumer picks: 4x the model (a whole anchor stays
    in the pinned pool), rounded up to a MiB and clamped to [16 MiB, 256 MiB];
    64 MiB when the model's size is unknown."""
    if model_bytes is None:
        return BUDGET_UNKNOWN_MODEL
    want = (4 * model_bytes + MiB - 1) // MiB * MiB
    return min(BUDGET_MAX, max(BUDGET_MIN, want))


def _pointer(name: str, array: Any, call: str = "bind") -> Tuple[int, int, int]:
    """(address, bytes, memory kind) of a bindable array or tensor."""
    if _dtypes.is_torch(array):
        if not array.is_contiguous():
            raise fail("DCAST_EINVAL", f"{call} {name}: torch tensor is not contiguous")
        mem = MEM_CUDA if array.is_cuda else MEM_HOST
        return array.data_ptr(), array.numel() * array.element_size(), mem
    flags = getattr(array, "flags", None)
    if flags is None or not hasattr(array, "dtype"):
        raise fail("DCAST_EINVAL", f"{call} {name}: need a numpy array or a torch tensor, "
                                   f"got {type(array).__name__}")
    if not flags["C_CONTIGUOUS"] or not flags["WRITEABLE"]:
        raise fail("DCAST_EINVAL", f"{call} {name}: numpy array must be C-contiguous and "
                                   "writeable")
    return array.ctypes.data, array.nbytes, MEM_HOST


def _check_box(call: str, name: str, shape: Tuple[int, ...], offset: Tuple[int, ...],
               extent: Tuple[int, ...]) -> None:
    """DeltacastArgumentError (DCAST_ESHAPE) unless the box lies in the tensor."""
    if len(offset) != len(shape) or len(extent) != len(shape):
        raise fail("DCAST_ESHAPE", f"{call} {name}: the tensor has shape {shape}, the box "
                                   f"offset {offset} extent {extent} (as many dims needed)")
    for d, (o, e, s) in enumerate(zip(offset, extent, shape)):
        if o + e > s:
            raise fail("DCAST_ESHAPE", f"{call} {name}: the box offset {offset} extent {extent} "
                                       f"is outside the tensor's shape {shape} (dim {d}: "
                                       f"[{o}, {o + e}) of {s})")


class Consumer(Closable):
    """A consumer of one model (see the module doc).

    broker: the broker's consumer endpoint; model: the model's name; dir:
    the local checkpoint directory (created if missing; required; one
    consumer per directory: while one holds it, in any process, another
    raises DeltacastError DCAST_EBUSY naming its pid).  budget_bytes: staging budget (None: sized from model_bytes or the
    checkpoint in dir, see default_budget).  verify: True checks the COMMIT
    digests from the elements each version changes (O(changed)), "all"
    computes every digest range whole after every version, False checks
    none.  auto_apply: the consumer's
    thread applies each READY version at once.  curve_*: Z85 keys (the
    broker's public key and this consumer's pair) to speak CURVE.
    commit_timeout_ms: a staged version whose COMMIT has not come this long
    after its last chunk is dropped and fetched again (None:
    DELTACAST_COMMIT_TIMEOUT_MS, else 60000).  bulk: an anchor may come
    over a bulk TCP connection to the broker's host (tcp:// without CURVE;
    off for good once a bulk transfer failed; DELTACAST_BULK=0 in the
    environment turns it off); False: ZeroMQ only."""

    def __init__(self, broker: str, model: str, dir: Union[str, "os.PathLike[str]"],
                 budget_bytes: Optional[int] = None, *, verify: Union[bool, str] = True,
                 fold_every: Optional[int] = None, fold_fraction: Optional[float] = None,
                 auto_apply: bool = False, client: str = "python",
                 max_staged: Optional[int] = None, heartbeat_ms: Optional[int] = None,
                 model_bytes: Optional[int] = None, curve_server_key: Union[str, bytes, None] = None,
                 curve_public_key: Union[str, bytes, None] = None,
                 curve_secret_key: Union[str, bytes, None] = None,
                 commit_timeout_ms: Optional[int] = None, bulk: bool = True) -> None:
        self._c: Optional[ctypes.c_void_p] = None
        self._confirmed = False
        self._bound: dict = {}
        self._bound_slices: List[Tuple[str, Any]] = []
        ep = need_endpoint("Consumer: broker", broker)
        mb = need_str("Consumer: model", model, 255)
        if not isinstance(dir, (str, os.PathLike)) or not os.fspath(dir):
            raise fail("DCAST_EINVAL", "Consumer: dir (the local checkpoint directory) must be "
                                       f"a non-empty path, got {dir!r}")
        dir = os.fspath(dir)
        if verify not in (True, False, "all"):
            raise fail("DCAST_EINVAL", f"Consumer: verify must be True, False or \"all\", got {verify!r}")
        if model_bytes is not None:
            need_int("Consumer: model_bytes", model_bytes, 0)
        if budget_bytes is None:
            budget_bytes = default_budget(model_bytes if model_bytes is not None
                                          else _checkpoint_bytes(dir))
        need_int("Consumer: budget_bytes", budget_bytes, MiB, (1 << 64) - 1)
        self._l = _declare(lib())
        opts = _Opts()
        self._l.dcast_consumer_opts_init(ctypes.byref(opts))
        opts.verify_digests = 2 if verify == "all" else 1 if verify else 0
        if fold_every is not None:
            opts.fold_every = need_int("Consumer: fold_every", fold_every, 0, (1 << 32) - 1)
        if fold_fraction is not None:
            if isinstance(fold_fraction, bool) or not isinstance(fold_fraction, (int, float)) \
                    or not fold_fraction >= 0:
                raise fail("DCAST_EINVAL", f"Consumer: fold_fraction must be a number >= 0, "
                                           f"got {fold_fraction!r}")
            opts.fold_fraction = float(fold_fraction)
        if max_staged is not None:
            opts.max_staged = need_int("Consumer: max_staged", max_staged, 1, (1 << 32) - 1)
        if heartbeat_ms is not None:
            opts.heartbeat_ms = need_int("Consumer: heartbeat_ms", heartbeat_ms, 0, (1 << 32) - 1)
        opts.auto_apply = 1 if auto_apply else 0
        if commit_timeout_ms is not None:
            opts.commit_timeout_ms = need_int("Consumer: commit_timeout_ms", commit_timeout_ms, 1,
                                              (1 << 32) - 1)
        if not isinstance(bulk, bool):
            raise fail("DCAST_EINVAL", f"Consumer: bulk must be True or False, got {bulk!r}")
        opts.bulk = 1 if bulk else 0
        # the C side keeps these pointers (re-joins): they live as long as self
        self._strings = [need_str("Consumer: client", client, 64)] + \
            curve_keys(curve_server_key, curve_public_key, curve_secret_key)
        opts.client, opts.curve_server_key, opts.curve_public_key, opts.curve_secret_key = \
            self._strings
        self.budget_bytes = budget_bytes
        self.broker, self.dir = broker, dir
        c = ctypes.c_void_p()
        check(self._l.dcast_consumer_open(ep, mb, dir.encode(), budget_bytes,
                                          ctypes.byref(opts), ctypes.byref(c)))
        self._c = c

    def _live(self) -> ctypes.c_void_p:
        if self._c is None or not self._c.value:
            raise fail("DCAST_ESTATE", "consumer is closed")
        return self._c

    def names(self) -> List[str]:
        """Names of the model's tensors, in manifest order ([] before the manifest)."""
        c, d = self._live(), _Desc()
        out = []
        for i in range(self._l.dcast_consumer_tensor_count(c)):
            check(self._l.dcast_consumer_tensor_at(c, i, ctypes.byref(d)))
            out.append(d.name.decode())
        return out

    def _desc_grid(self, name: str) -> Tuple[int, str, Tuple[int, ...], int,
                                             Optional[Tuple[int, ...]]]:
        """(address, wire dtype, shape, memory kind, grid or None when untiled)."""
        ptr, d, mem = ctypes.c_void_p(), _Desc(), ctypes.c_int()
        check(self._l.dcast_consumer_tensor(self._live(), need_str("tensor name", name),
                                            ctypes.byref(ptr), ctypes.byref(d), ctypes.byref(mem)))
        dtype = _dtypes.WIRE[d.dtype]
        grid = tuple(max(1, int(d.grid[i])) for i in range(d.ndim))
        return (ptr.value or 0, dtype, tuple(int(d.shape[i]) for i in range(d.ndim)), mem.value,
                grid if any(g > 1 for g in grid) else None)

    def _desc(self, name: str) -> Tuple[int, str, Tuple[int, ...], int]:
        return self._desc_grid(name)[:4]

    def describe(self, name: str) -> Tuple[str, Tuple[int, ...]]:
        """(wire dtype, shape) of tensor `name` in the manifest, e.g. ("BF16", (64, 32))."""
        _, dtype, shape, _ = self._desc(name)
        return dtype, shape

    def grid(self, name: str) -> Optional[Tuple[int, ...]]:
        """Tiles per dimension of tensor `name` when the producers publish
        it as tensor-parallel slices (e.g. (1, 4): four column blocks), or
        None for an untiled tensor."""
        return self._desc_grid(name)[4]

    def tensor(self, name: str, *, as_numpy: bool = False) -> Any:
        """The live host tensor `name`, in its natural row-major layout: a
        numpy array, or, for the dtypes numpy has no type for (BF16 and
        FP8) where torch imports, a torch tensor of that dtype
        (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2) on the
        same memory.  as_numpy=True (or no torch): those as numpy uint16 /
        uint8 bit patterns.

        Untiled tensors: a view of the consumer's memory, valid until close()
        or bind(); it changes only in apply().  Tiled tensors (grid() not
        None: published as tensor-parallel slices) are held in the
        producers' tile order, so this returns a COPY in natural layout
        (read_slice(name); read-only as numpy): it does not follow later
        versions; call tensor() again after apply(), or bind()/bind_slice()
        an array to have one kept up to date."""
        import numpy as np
        ptr, dtype, shape, mem, grid = self._desc_grid(name)
        if grid is not None:
            out = self.read_slice(name)
        elif mem != MEM_HOST:
            raise fail("DCAST_EINVAL", f"tensor {name} lives on a CUDA device")
        else:
            n = 1
            for s in shape:
                n *= s
            dt = np.dtype(_dtypes.numpy_view_dtype(dtype))
            buf = (ctypes.c_char * (n * dt.itemsize)).from_address(ptr) if n else bytearray()
            out = np.frombuffer(buf, dtype=dt, count=n).reshape(shape)
        as_torch = None if as_numpy else _dtypes.torch_view(out, dtype)
        if as_torch is not None:
            return as_torch
        if grid is not None:
            out.flags.writeable = False
        return out

    def bind(self, name: str, array: Any) -> None:
        """Make `array` (a C-contiguous, writeable numpy array or a contiguous
        torch tensor, CPU or CUDA) the live tensor `name`; the current
        version is copied into it.  Its dtype must hold the manifest's dtype
        and its shape must equal the manifest's shape (DeltacastArgumentError
        naming both otherwise).  A tiled tensor (grid() not None) is bound
        as a view in natural layout that every apply() updates (the
        consumer keeps its own host copy too), like bind_slice() of the
        whole box.  Keep it alive until close() or unbind()."""
        _, dtype, shape, _, grid = self._desc_grid(name)
        if not _dtypes.holds(array, dtype):
            raise fail("DCAST_EDTYPE", f"bind {name}: the model publishes {dtype}, the array is "
                                       f"{_dtypes.dtype_str(array)} (bind a {_dtypes.holders(dtype)})")
        if _dtypes.shape_of(array) != shape:
            raise fail("DCAST_ESHAPE", f"bind {name}: the model publishes shape {shape}, the "
                                       f"array has shape {_dtypes.shape_of(array)}")
        ptr, nbytes, mem = _pointer(name, array)
        check(self._l.dcast_consumer_bind(self._live(), name.encode(), ptr, mem, nbytes))
        if grid is not None:  # a view: the C side takes any number of them
            self._bound_slices.append((name, array))
        else:
            self._bound[name] = array

    def bind_slice(self, name: str, array: Any, offset: Sequence[int]) -> None:
        """Bind `array` (as for bind(): a C-contiguous, writeable numpy array
        or a contiguous torch tensor, CPU or CUDA) as a box of tensor
        `name`: the elements from index `offset` (one per dimension) on,
        with the array's shape as the box's extent, row-major in the box.
        E.g. a TP rank r of T holding a column block of a (R, C) weight:
        bind_slice(name, local, (0, r * (C // T))) with local of shape
        (R, C // T).  Any box works, whatever the producers' split (tiled
        or not); several boxes of one tensor may be bound, overlapping or
        not.  The current version is copied into it and every apply()
        updates it.  The consumer keeps the whole tensor in host memory as
        well.  Errors: DeltacastArgumentError for a dtype that does not hold
        the manifest's (DCAST_EDTYPE) or a box outside the tensor or of
        other dims (DCAST_ESHAPE); DeltacastError DCAST_ESTATE when the
        tensor is bound whole with bind() (an untiled one; a tiled one may
        be bound both ways).  Keep the array alive until close() or
        unbind()."""
        _, dtype, shape, _ = self._desc(name)
        off = need_dims(f"bind_slice {name}: offset", offset)
        ptr, nbytes, mem = _pointer(name, array, "bind_slice")
        if not _dtypes.holds(array, dtype):
            raise fail("DCAST_EDTYPE", f"bind_slice {name}: the model publishes {dtype}, the array "
                                       f"is {_dtypes.dtype_str(array)} (bind a "
                                       f"{_dtypes.holders(dtype)})")
        extent = _dtypes.shape_of(array)
        if not shape:
            raise fail("DCAST_ESHAPE", f"bind_slice {name}: a scalar has no slices (use bind)")
        _check_box("bind_slice", name, shape, off, extent)
        if not nbytes:
            raise fail("DCAST_ESHAPE", f"bind_slice {name}: the box offset {off} extent {extent} "
                                       "holds no elements")
        arr = ctypes.c_uint64 * len(shape)
        check(self._l.dcast_consumer_bind_slice(self._live(), name.encode(), ptr, mem, len(shape),
                                                arr(*off), arr(*extent), nbytes))
        self._bound_slices.append((name, array))

    def unbind(self, name: Optional[str] = None) -> None:
        """Drop the binding of tensor `name` (None: of every tensor bound,
        whole or in slices), e.g. before an engine that reloaded its model
        binds the new storage with bind()/bind_slice() (a first bind: the
        current version is copied in).  A tensor bound whole goes back into
        the consumer's host copy, its bytes read from the bound array,
        which must still hold them (unbind before freeing or reusing it);
        a sliced tensor keeps its host copy.  Versions staged or READY stay
        and apply as usual; the consumer no longer touches the old arrays,
        nor keeps them alive.  Errors: DeltacastError DCAST_ENOTFOUND (name
        not in the manifest), DCAST_ESTATE (name not bound)."""
        check(self._l.dcast_consumer_unbind(self._live(), None if name is None else name.encode()))
        if name is None:
            self._bound, self._bound_slices = {}, []
            return
        self._bound.pop(name, None)
        self._bound_slices = [(n, a) for n, a in self._bound_slices if n != name]

    def read_slice(self, name: str, offset: Optional[Sequence[int]] = None,
                   shape: Optional[Sequence[int]] = None) -> Any:
        """A numpy copy, in natural row-major layout, of the box of the live
        tensor `name` starting at `offset` (default: all zeros) with shape
        `shape` (default: the rest of the tensor from offset); both
        defaults: the whole tensor.  bf16/fp8 come as uint bit patterns
        (as tensor()).  Works for tiled and untiled tensors; an untiled
        tensor bound whole to CUDA memory is not readable here (DCAST_ECUDA:
        read the bound tensor).  Errors: DeltacastArgumentError
        (DCAST_ESHAPE) for a box outside the tensor or of other dims."""
        import numpy as np
        _, dtype, tshape, _ = self._desc(name)
        off = need_dims(f"read_slice {name}: offset", offset) if offset is not None \
            else (0,) * len(tshape)
        ext = need_dims(f"read_slice {name}: shape", shape) if shape is not None \
            else tuple(s - o for s, o in zip(tshape, off)) if len(off) == len(tshape) else ()
        _check_box("read_slice", name, tshape, off, ext)
        out = np.empty(ext, dtype=np.dtype(_dtypes.numpy_view_dtype(dtype)))
        arr = ctypes.c_uint64 * max(1, len(tshape))
        if tshape:
            check(self._l.dcast_consumer_read_slice(self._live(), name.encode(), len(tshape),
                                                    arr(*off), arr(*ext),
                                                    out.ctypes.data if out.nbytes else None,
                                                    out.nbytes))
        else:  # a scalar: the whole tensor
            check(self._l.dcast_consumer_read_slice(self._live(), name.encode(), 0, None, None,
                                                    out.ctypes.data, out.nbytes))
        return out

    def bind_module(self, module: Any, *, buffers: bool = True,
                    name_map: Optional[Callable[[str], Optional[str]]] = None,
                    filter: Optional[Callable[[str, Any], bool]] = None) -> Dict[str, str]:
        """Bind every parameter (and, with buffers=True, every buffer) of a
        torch module to the published tensor of the same name (name_map(name)
        gives another; None skips it; filter(name, tensor) False skips it).
        Each must be in the manifest with the same dtype and shape, else
        DeltacastArgumentError names it; nothing is bound in that case.
        Returns {module name: published name}."""
        items = list(module.named_parameters())
        if buffers:
            items += list(module.named_buffers())
        plan: Dict[str, Tuple[str, Any]] = {}
        known = set(self.names())
        for name, t in items:
            if filter is not None and not filter(name, t):
                continue
            published = name_map(name) if name_map is not None else name
            if published is None:
                continue
            if published not in known:
                raise fail("DCAST_ENOTFOUND", f"bind_module: {name} (published as {published}) is "
                                              "not in the model's manifest (name_map or filter it)")
            dtype, shape = self.describe(published)
            if not _dtypes.holds(t, dtype) or _dtypes.shape_of(t) != shape:
                raise fail("DCAST_EDTYPE" if not _dtypes.holds(t, dtype) else "DCAST_ESHAPE",
                           f"bind_module: {name} is {_dtypes.dtype_str(t)} {_dtypes.shape_of(t)}, "
                           f"the model publishes {published} as {dtype} {shape}")
            plan[name] = (published, t)
        for name, (published, t) in plan.items():
            self.bind(published, t)
        return {name: published for name, (published, _) in plan.items()}

    def poll(self, timeout_ms: int = 100) -> Optional[Event]:
        """Wait up to timeout_ms for the consumer thread's next event; returns
        an Event (type "ready", "anchor", "gap" or "error") or None."""
        ev = _Event()
        check(self._l.dcast_consumer_poll(self._live(), need_int("poll: timeout_ms", timeout_ms, -1),
                                          ctypes.byref(ev)))
        kind = _EVENTS.get(ev.type)
        if kind is None:
            return None
        return Event(kind, _ver(ev.version), _ver(ev.have_version), ev.code,
                     ev.text.decode(errors="replace"), ev.bytes)

    def apply(self, version: int, stream: Optional[int] = None, event: Optional[int] = None) -> None:
        """Apply READY `version` (transactional: on error the tensors keep the
        previous version and DeltacastError is raised).  With stream or
        event (raw cudaStream_t / cudaEvent_t handles as ints, e.g. torch's
        Stream.cuda_stream and Event.cuda_event; 0 the legacy default stream,
        no event): dcast_consumer_apply_async, the device changes scattered
        on that stream and the event recorded after them, without waiting
        for the device; without a device it is the plain apply."""
        v = need_int("apply: version", version, 0)
        if stream is None and event is None:
            check(self._l.dcast_consumer_apply(self._live(), v))
            return
        s = need_int("apply: stream", 0 if stream is None else stream, 0)
        e = need_int("apply: event", 0 if event is None else event, 0)
        check(self._l.dcast_consumer_apply_async(self._live(), v, s or None, e or None))

    @property
    def version(self) -> Optional[int]:
        """Version the live tensors hold, None before the first apply, and
        None for a version loaded from the checkpoint in dir until the
        broker's WELCOME confirms its run (it may be an earlier training
        run's: see run and wait_confirmed())."""
        v = _ver(self._l.dcast_consumer_version(self._live()))
        return v if v is None or self.confirmed else None

    @property
    def run(self) -> int:
        """The run identity of the broker's stream that the state held
        belongs to, once a WELCOME confirmed it; 0 before
        (dcast_consumer_run)."""
        return self._l.dcast_consumer_run(self._live())

    @property
    def confirmed(self) -> bool:
        """Whether version is the broker's: a WELCOME confirmed the run
        of the state held, or a version of its stream was applied here
        (what a relay that names no run yet allows)."""
        if not self._confirmed:
            raw = _Stats()
            self._l.dcast_consumer_stats_get(self._live(), ctypes.byref(raw))
            self._confirmed = self.run != 0 or raw.version != VERSION_NONE
        return self._confirmed

    def wait_confirmed(self, timeout_ms: int = 10000) -> Optional[int]:
        """Wait up to timeout_ms (-1: forever) until confirmed; returns
        version.  DeltacastError DCAST_ECLOSED naming the broker when no
        WELCOME came in time: the broker is down or unreachable, and the
        version loaded from dir (if any) is not served as current."""
        import time
        need_int("wait_confirmed: timeout_ms", timeout_ms, -1)
        end = time.monotonic() + timeout_ms / 1000.0
        pause = 0.001
        while not self.confirmed:
            if timeout_ms >= 0 and time.monotonic() >= end:
                loaded = _ver(self._l.dcast_consumer_version(self._live()))
                held = f"version {loaded}, loaded from {self.dir}, is not" if loaded is not None \
                    else "no version is"
                raise fail("DCAST_ECLOSED", f"no WELCOME from the broker at {self.broker} in "
                                            f"{timeout_ms} ms: it is down or unreachable; {held} "
                                            "reported until it confirms the run")
            time.sleep(pause)  # the consumer's thread sets the run: no event to wait on
            pause = min(pause * 2, 0.05)
        return self.version

    @property
    def backlog(self) -> int:
        """READY versions not yet applied that apply(ready_version) takes
        in one call (Stats.ready_backlog)."""
        return self.stats().ready_backlog

    @property
    def ready_version(self) -> Optional[int]:
        """Newest version apply() can take now, or None."""
        return _ver(self._l.dcast_consumer_ready_version(self._live()))

    def ready_versions(self) -> List[int]:
        """The READY versions apply() can take now, oldest first (the
        chain that ends at ready_version; [] when none)."""
        cap = 64
        while True:  # max_staged bounds the chain; a bigger one asks again
            out = (ctypes.c_uint64 * cap)()
            n = self._l.dcast_consumer_ready_versions(self._live(), out, cap)
            if n <= cap:
                return list(out[:n])
            cap = n

    def wait_version(self, min_version: int, timeout_ms: int = -1) -> None:
        """Block until version >= min_version (DeltacastTimeout, a
        TimeoutError, when timeout_ms passes first; -1 waits forever; its
        message says when min_version is READY but not applied: only
        apply(), or auto_apply, moves the tensors).  A version loaded from
        dir counts once the broker confirms its run (version): until then
        this waits for that too, and raises DCAST_ECLOSED naming the broker
        when it does not come in time."""
        import time
        need_int("wait_version: min_version", min_version, 0)
        need_int("wait_version: timeout_ms", timeout_ms, -1)
        end = time.monotonic() + timeout_ms / 1000.0

        def left() -> int:
            return -1 if timeout_ms < 0 else max(0, int((end - time.monotonic()) * 1000))
        check(self._l.dcast_consumer_wait_version(self._live(), min_version, timeout_ms))
        if self.confirmed:
            return
        self.wait_confirmed(left())
        # a WELCOME naming another run drops the loaded state: wait again
        check(self._l.dcast_consumer_wait_version(self._live(), min_version, left()))

    def checkpoint(self) -> None:
        """Write DIR/model.safetensors as the applied version now."""
        check(self._l.dcast_consumer_checkpoint(self._live()))

    def stats(self) -> Stats:
        """Numbers of the version last applied, and the READY backlog (a
        Stats snapshot)."""
        s = _Stats()
        self._l.dcast_consumer_stats_get(self._live(), ctypes.byref(s))
        return Stats(s)

    def bytes_received(self) -> int:
        """Payload bytes received since open (stats().total_bytes_received):
        it moves while a version stages, so another thread can show progress."""
        return int(self.stats().total_bytes_received)

    def close(self) -> None:
        """Disconnect and free; bound arrays keep their contents.  Idempotent."""
        if self._c is not None and self._c.value:
            self._l.dcast_consumer_close(ctypes.byref(self._c))
        self._bound = {}
        self._bound_slices = []
