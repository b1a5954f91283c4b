"""Producer: publish versions of a model's tensors to a deltacast broker.

    with Producer("tcp://127.0.0.1:5555", "policy") as p:
        p.register_module(model)          # every parameter and buffer, or:
        p.register("w", weights)          # numpy array or torch tensor
        p.publish(1); p.wait(1)

A tensor-parallel rank registers its local shard as a tile of the global
tensor with register_slice: a column-parallel weight split over 4 ranks,
rank r holding `local` of shape (rows, cols // 4):

        p = Producer(broker, "policy", part=r, parts=4)
        p.register_slice("mlp.up.weight", local, shape=(rows, cols),
                         offset=(0, r * (cols // 4)))

Consumers see the tensor in its natural layout whatever the producers'
split, and may bind any box of it (Consumer.bind_slice).

numpy arrays must be C-contiguous; float32 -> F32, float16 -> F16, and
uint16 holding bf16 bit patterns -> BF16 when dtype="bf16" is given.  torch
tensors (CPU or CUDA, bfloat16 included) are passed by data_ptr().  The
library reads the memory during publish(): keep the tensors alive and
unchanged until publish() returns.  An anchor of host tensors returns once
they are copied into the producer's baseline, and goes to the broker from
there meanwhile: flush() waits for its ACK (and raises what failed).

Register the torch Parameter itself (register_module does), not
`param.data`: publish() then sees a parameter whose storage was replaced
(`param.data = ...`, `model.to(...)`, loading a state dict with assign)
and follows it to the new memory, logging a warning (on_moved="follow",
the default), or raises DeltacastError DCAST_ESTATE (on_moved="raise").
A plain tensor registered from `param.data` keeps pointing at the old
memory, and the workers would keep the old weights."""
from __future__ import annotations

import ctypes
import logging
from typing import Any, Callable, Dict, Iterable, Optional, Sequence, Tuple, Union

from . import _dtypes
from ._lib import (Closable, StatsView, check, curve_keys, fail, lib, need_dims, need_endpoint,
                   need_int, need_str, version_or_none)

MEM_HOST, MEM_CUDA = 0, 1
log = logging.getLogger("deltacast")


class _Opts(ctypes.Structure):
    _fields_ = [("range_elems", ctypes.c_uint64), ("max_inflight_bytes", ctypes.c_uint64),
                ("undo_bytes", ctypes.c_uint64), ("connect_timeout_ms", ctypes.c_uint32),
                ("ack_timeout_ms", ctypes.c_uint32), ("max_reconnects", ctypes.c_uint32),
                ("reconnect_backoff_ms", ctypes.c_uint32), ("baseline_on_device", ctypes.c_int),
                ("client", ctypes.c_char_p), ("curve_server_key", ctypes.c_char_p),
                ("curve_public_key", ctypes.c_char_p), ("curve_secret_key", ctypes.c_char_p),
                ("encode_threads", ctypes.c_uint32), ("close_timeout_ms", ctypes.c_uint32)]


class _Stats(ctypes.Structure):
    """The C layout of dcast_producer_stats."""
    _fields_ = [("version", ctypes.c_uint64), ("anchor", ctypes.c_int),
                ("chunks_total", ctypes.c_uint64), ("chunks_sent", ctypes.c_uint64),
                ("changed_elems", ctypes.c_uint64), ("elems", ctypes.c_uint64),
                ("payload_bytes", ctypes.c_uint64), ("model_bytes", ctypes.c_uint64),
                ("acked_version", ctypes.c_uint64), ("total_reconnects", ctypes.c_uint64),
                ("total_payload_bytes", ctypes.c_uint64), ("total_resends", ctypes.c_uint64),
                ("baseline_version", ctypes.c_uint64), ("broker_version", ctypes.c_uint64),
                ("failed_version", ctypes.c_uint64), ("failed_err", ctypes.c_int)]


class Progress(ctypes.Structure):
    """Where the version being published stands (dcast_producer_progress):
    read from any thread while publish() or wait() runs on another.  active
    from publish() to the broker's ACK; bytes_sent: handed to the
    connection, bytes_taken: stored by the broker; bytes_total: the part's
    tensor bytes for an anchor, 0 for a delta (ranges_done of ranges_total
    then tells how far the diff is); err: the version failed (active 0),
    its dcast_err code, else 0.  After publish() of an anchor returned,
    active stays 1 while the producer's sender thread sends it."""
    _fields_ = [("version", ctypes.c_uint64), ("active", ctypes.c_int), ("anchor", ctypes.c_int),
                ("ranges_done", ctypes.c_uint64), ("ranges_total", ctypes.c_uint64),
                ("bytes_sent", ctypes.c_uint64), ("bytes_taken", ctypes.c_uint64),
                ("bytes_total", ctypes.c_uint64),
                ("elapsed_ms", ctypes.c_uint64), ("err", ctypes.c_int)]


class Stats(StatsView):
    """Counters of the latest publish (dcast_producer_stats, field for
    field); version, acked_version and failed_version are None before the
    first publish, the first ACK and the first failure."""
    _versions = ("version", "acked_version", "failed_version")


def _declare(l: ctypes.CDLL) -> ctypes.CDLL:
    vp, u32, u64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64
    l.dcast_producer_opts_init.argtypes = [ctypes.POINTER(_Opts)]
    l.dcast_producer_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, u32, u32,
                                      ctypes.POINTER(_Opts), ctypes.POINTER(vp)]
    l.dcast_producer_register.argtypes = [vp, ctypes.c_char_p, ctypes.c_int, u32,
                                          ctypes.POINTER(u64), vp, ctypes.c_int, u64, u64]
    l.dcast_producer_register_slice.argtypes = [vp, ctypes.c_char_p, ctypes.c_int, u32,
                                                ctypes.POINTER(u64), ctypes.POINTER(u64),
                                                ctypes.POINTER(u64), vp, ctypes.c_int]
    l.dcast_producer_publish.argtypes = [vp, u64]
    l.dcast_producer_wait.argtypes = [vp, u64, ctypes.c_int]
    l.dcast_producer_flush.argtypes = [vp, ctypes.c_int]
    l.dcast_producer_prepare.argtypes = [vp]
    l.dcast_producer_stats_get.argtypes = [vp, ctypes.POINTER(_Stats)]
    l.dcast_producer_broker_version.argtypes = [vp]
    l.dcast_producer_broker_version.restype = u64
    l.dcast_producer_progress_get.argtypes = [vp, ctypes.POINTER(Progress)]
    l.dcast_producer_fetch_baseline.argtypes = [vp, ctypes.c_char_p, ctypes.c_char_p,
                                                ctypes.c_int]
    l.dcast_producer_close.argtypes = [ctypes.POINTER(vp)]
    return l


def _describe_numpy(name: str, a: Any, dtype: Optional[str],
                    call: str = "register") -> Tuple[str, int, int]:
    if not a.flags["C_CONTIGUOUS"]:
        raise fail("DCAST_EINVAL", f"{call} {name}: numpy array is not C-contiguous "
                                   "(use numpy.ascontiguousarray)")
    if dtype is not None:
        want = dtype.upper()
        if want not in _dtypes.CODE:
            raise fail("DCAST_EDTYPE", f"{call} {name}: unknown dtype {dtype!r} "
                                       f"(one of {', '.join(_dtypes.WIRE)})")
        if not _dtypes.holds(a, want):
            raise fail("DCAST_EDTYPE", f"{call} {name}: dtype={dtype!r} needs a numpy "
                                       f"{' or '.join(_dtypes.NUMPY_OF[want])} array, got "
                                       f"{a.dtype.name}")
        return want, a.ctypes.data, MEM_HOST
    kind = _dtypes.wire_of(a)
    if kind is None:
        raise fail("DCAST_EDTYPE", f"{call} {name}: numpy dtype {a.dtype.name} is not one the "
                                   "codec takes (floats, bf16 as uint16, ints, bool)")
    return kind, a.ctypes.data, MEM_HOST


def _describe_torch(name: str, t: Any, dtype: Optional[str],
                    call: str = "register") -> Tuple[str, int, int]:
    kind = _dtypes.wire_of(t)
    if dtype is not None and kind != dtype.upper():
        raise fail("DCAST_EDTYPE", f"{call} {name}: dtype={dtype!r} does not match {t.dtype}")
    if kind is None:
        raise fail("DCAST_EDTYPE", f"{call} {name}: torch dtype {t.dtype} is not one the codec "
                                   "takes (floats, bfloat16, float8, ints, bool)")
    if not t.is_contiguous():
        raise fail("DCAST_EINVAL", f"{call} {name}: torch tensor is not contiguous")
    return kind, t.data_ptr(), MEM_CUDA if t.is_cuda else MEM_HOST


def _describe(call: str, name: str, tensor: Any, dtype: Optional[str]) -> Tuple[str, int, int]:
    """(wire dtype, address, memory kind) of a numpy array or torch tensor."""
    if _dtypes.is_torch(tensor):
        return _describe_torch(name, tensor, dtype, call)
    if hasattr(tensor, "flags") and hasattr(tensor, "dtype"):
        return _describe_numpy(name, tensor, dtype, call)
    raise fail("DCAST_EINVAL", f"{call} {name}: need a numpy array or a torch tensor, "
                               f"got {type(tensor).__name__}")


class _Entry:
    """One registered tensor: what the C side was told, to notice moves.
    box: the slice's offset for register_slice (shape is then its extent),
    None for register."""
    __slots__ = ("tensor", "kind", "shape", "gshape", "offset", "ptr", "mem", "box")

    def __init__(self, tensor: Any, kind: str, shape: Tuple[int, ...], gshape: Tuple[int, ...],
                 offset: int, ptr: int, mem: int,
                 box: Optional[Tuple[int, ...]] = None) -> None:
        self.tensor, self.kind, self.shape, self.gshape = tensor, kind, shape, gshape
        self.offset, self.ptr, self.mem, self.box = offset, ptr, mem, box


class Producer(Closable):
    """One part (`part` of `parts`) of a model's producer, connected to the
    broker's producer endpoint (see the module doc).  curve_*: Z85 keys (the
    broker's public key and this producer's pair) to speak CURVE.
    on_moved: "follow" or "raise" when a registered torch tensor's storage
    was replaced (see the module doc).
    close_timeout_ms: how long close() waits for the last version's ACK
    (default 5000; 0 abandons it at once).
    baseline_from: True, or the same broker's consumer endpoint: before the
    first publish, take the broker's newest version of the model (if it
    holds one) as the baseline, so that a restarted trainer's first version
    goes to the workers as a delta (dcast_producer_fetch_baseline: fetched
    from there, True: from the consumer endpoint the broker names, its
    wildcard host replaced by `broker`'s, and checked by digests, into baseline_dir, or a temporary
    directory when None; the broker's tensors must be the registered ones,
    else publish raises DCAST_ESHAPE).  baseline_timeout_ms bounds the fetch.
    progress(): how far the version being published is, from any thread."""

    def __init__(self, broker: str, model: str, part: int = 0, parts: int = 1, *,
                 range_elems: Optional[int] = None, connect_timeout_ms: Optional[int] = None,
                 ack_timeout_ms: Optional[int] = None, max_reconnects: Optional[int] = None,
                 max_inflight_bytes: Optional[int] = None, undo_bytes: Optional[int] = None,
                 client: str = "python", encode_threads: Optional[int] = None,
                 close_timeout_ms: Optional[int] = None,
                 baseline_on_device: bool = False, on_moved: str = "follow",
                 curve_server_key: Union[str, bytes, None] = None,
                 curve_public_key: Union[str, bytes, None] = None,
                 curve_secret_key: Union[str, bytes, None] = None,
                 baseline_from: Union[str, bool, None] = None,
                 baseline_dir: Optional[str] = None,
                 baseline_timeout_ms: int = 600000) -> None:
        self._p: Optional[ctypes.c_void_p] = None
        self._fetch: Optional[Tuple[Optional[bytes], Optional[bytes], int]] = None
        if baseline_from is not None and baseline_from is not False:
            self._fetch = (None if baseline_from is True else
                           need_endpoint("Producer: baseline_from", baseline_from),
                           need_str("Producer: baseline_dir", str(baseline_dir), 4095)
                           if baseline_dir is not None else None,
                           need_int("Producer: baseline_timeout_ms", baseline_timeout_ms, -1,
                                    (1 << 31) - 1))
        self._entries: Dict[str, _Entry] = {}
        ep = need_endpoint("Producer: broker", broker)
        mb = need_str("Producer: model", model, 255)
        need_int("Producer: parts", parts, 1, 4096)
        need_int("Producer: part", part, 0, parts - 1)
        if on_moved not in ("follow", "raise"):
            raise fail("DCAST_EINVAL", f"Producer: on_moved must be \"follow\" or \"raise\", "
                                       f"got {on_moved!r}")
        self.on_moved = on_moved
        self._l = _declare(lib())
        opts = _Opts()
        self._l.dcast_producer_opts_init(ctypes.byref(opts))
        u32, u64 = (1 << 32) - 1, (1 << 64) - 1
        for field, value, lo, hi in (("range_elems", range_elems, 1, 1 << 26),
                                     ("connect_timeout_ms", connect_timeout_ms, 1, u32),
                                     ("ack_timeout_ms", ack_timeout_ms, 1, u32),
                                     ("max_reconnects", max_reconnects, 0, u32),
                                     ("max_inflight_bytes", max_inflight_bytes, 1, u64),
                                     ("undo_bytes", undo_bytes, 0, u64),
                                     ("encode_threads", encode_threads, 0, 64),
                                     ("close_timeout_ms", close_timeout_ms, 0, u32)):
            if value is not None:
                setattr(opts, field, need_int(f"Producer: {field}", value, lo, hi))
        opts.baseline_on_device = int(bool(baseline_on_device))
        self._strings = [need_str("Producer: client", client, 64)] + \
            curve_keys(curve_server_key, curve_public_key, curve_secret_key)
        opts.client, opts.curve_server_key, opts.curve_public_key, opts.curve_secret_key = \
            self._strings
        p = ctypes.c_void_p()
        check(self._l.dcast_producer_open(ep, mb, part, parts, ctypes.byref(opts), ctypes.byref(p)))
        self._p = p

    def _live(self, what: str) -> ctypes.c_void_p:
        if self._p is None or not self._p.value:
            raise fail("DCAST_ESTATE", f"{what}: producer is closed")
        return self._p

    def register(self, name: str, tensor: Any, dtype: Optional[str] = None,
                 shape: Optional[Sequence[int]] = None, shard_offset: int = 0) -> None:
        """Register a numpy array or torch tensor under `name`.  For a shard of
        a larger tensor pass its global `shape` and element `shard_offset`
        (the shard is one contiguous range of the flattened tensor)."""
        p = self._live("register")
        nb = need_str("register: name", name, 255)
        need_int(f"register {name}: shard_offset", shard_offset, 0)
        kind, ptr, mem = _describe("register", name, tensor, dtype)
        local = _dtypes.shape_of(tensor)
        gshape = tuple(need_int(f"register {name}: shape", d, 0) for d in shape) \
            if shape is not None else local
        entry = _Entry(tensor, kind, local, gshape, shard_offset, ptr, mem)
        self._register(p, nb, entry)
        self._entries[name] = entry  # the C side reads this memory at each publish

    def register_slice(self, name: str, tensor: Any, shape: Sequence[int],
                       offset: Sequence[int], dtype: Optional[str] = None, *,
                       extent: Optional[Sequence[int]] = None) -> None:
        """Register this part's tile of a tensor that the producer parts
        hold as tensor-parallel slices.  `tensor`: the rank's local shard
        (numpy array or torch tensor, contiguous, CPU or CUDA, as for
        register()), the box of the global tensor starting at element
        `offset` (one index per dimension) with the shard's shape as its
        extent; `shape`: the global shape.  The box must be one tile of an
        even grid: each extent divides its dimension and each offset is a
        multiple of its extent (a column-parallel weight of shape (R, C)
        over T ranks: rank r registers its (R, C // T) shard at offset
        (0, r * (C // T))).  Every part registers every tiled tensor with
        the same grid; a part that holds none of a tensor declares the grid
        with tensor=None, dtype= and extent= (the tiles' shape).  Consumers
        see the tensor in its natural layout.  A tensor replicated on every
        rank is not sliced: part 0 registers it with register(), the others
        register(name, empty, shape=...) with an empty shard.  Errors:
        DeltacastArgumentError (DCAST_ESHAPE) for a box outside the tensor,
        of other dims, or not a tile of an even grid; otherwise as
        register().  Moved torch storage is followed at publish as for
        register()."""
        p = self._live("register_slice")
        nb = need_str("register_slice: name", name, 255)
        gshape = need_dims(f"register_slice {name}: shape", shape)
        off = need_dims(f"register_slice {name}: offset", offset)
        if tensor is None:
            if dtype is None or extent is None:
                raise fail("DCAST_EINVAL", f"register_slice {name}: a part that holds no tile "
                                           "(tensor=None) declares the grid with dtype= and "
                                           "extent=")
            want = dtype.upper() if isinstance(dtype, str) else ""
            if want not in _dtypes.CODE:
                raise fail("DCAST_EDTYPE", f"register_slice {name}: unknown dtype {dtype!r} "
                                           f"(one of {', '.join(_dtypes.WIRE)})")
            kind, ptr, mem = want, 0, MEM_HOST
            local = need_dims(f"register_slice {name}: extent", extent)
        else:
            kind, ptr, mem = _describe("register_slice", name, tensor, dtype)
            local = _dtypes.shape_of(tensor)
            if extent is not None and need_dims(f"register_slice {name}: extent", extent) != local:
                raise fail("DCAST_ESHAPE", f"register_slice {name}: extent {tuple(extent)} is "
                                           f"not the local shard's shape {local}")
        if not gshape:
            raise fail("DCAST_ESHAPE", f"register_slice {name}: a scalar has no slices "
                                       "(register it with register())")
        if len(off) != len(gshape) or len(local) != len(gshape):
            raise fail("DCAST_ESHAPE", f"register_slice {name}: the global shape {gshape}, the "
                                       f"offset {off} and the local shard's shape {local} must "
                                       "have as many dims")
        entry = _Entry(tensor, kind, local, gshape, 0, ptr, mem, box=off)
        self._register(p, nb, entry)
        self._entries[name] = entry  # the C side reads this memory at each publish

    def _register(self, p: ctypes.c_void_p, nb: bytes, e: _Entry) -> None:
        if e.box is not None:
            nd = len(e.gshape)
            arr = ctypes.c_uint64 * max(1, nd)
            check(self._l.dcast_producer_register_slice(
                p, nb, _dtypes.CODE[e.kind], nd, arr(*e.gshape), arr(*e.box), arr(*e.shape),
                e.ptr or None, e.mem))
            return
        count = 1
        for d in e.shape:
            count *= d
        dims = (ctypes.c_uint64 * max(1, len(e.gshape)))(*e.gshape)
        check(self._l.dcast_producer_register(p, nb, _dtypes.CODE[e.kind], len(e.gshape), dims,
                                              e.ptr, e.mem, e.offset, count))

    def register_module(self, module: Any, *, buffers: bool = True,
                        name_map: Optional[Callable[[str], Optional[str]]] = None,
                        filter: Optional[Callable[[str, Any], bool]] = None) -> Dict[str, str]:
        """Register every parameter (and, with buffers=True, every buffer) of
        a torch module under its named_parameters() name.  name_map(name)
        gives the published name (None skips the tensor); filter(name,
        tensor) False skips it.  The Parameters themselves are registered, so
        replaced storage is noticed at publish.  Returns {module name:
        published name}.  Every float, int and bool dtype torch has is
        carried (int64 and float64 as two 4-byte wire elements per value);
        one deltacast does not carry (complex, quantized) raises
        DeltacastArgumentError naming the tensor: skip it with filter or
        publish a converted copy."""
        items: Iterable[Tuple[str, Any]] = list(module.named_parameters())
        if buffers:
            items = list(items) + list(module.named_buffers())
        plan: Dict[str, Tuple[str, Any]] = {}
        for name, t in items:
            if filter is not None and not filter(name, t):
                continue
            published = name_map(name) if name_map is not None else name
            if published is None:
                continue
            if _dtypes.wire_of(t) is None:  # refuse before registering any
                raise fail("DCAST_EDTYPE", f"register_module: {name} is {t.dtype}, which the codec "
                                           "does not take (skip it with filter=, or publish a copy)")
            plan[name] = (published, t)
        for name, (published, t) in plan.items():
            self.register(published, t)
        return {name: published for name, (published, _) in plan.items()}

    def _follow_moves(self, p: ctypes.c_void_p) -> None:
        for name, e in self._entries.items():
            t = e.tensor
            if not _dtypes.is_torch(t) or t.data_ptr() == e.ptr:
                continue
            what = (f"register {name}: the tensor's storage moved since register() "
                    f"({e.ptr:#x} -> {t.data_ptr():#x}: param.data replaced, .to(), or "
                    "load_state_dict(assign=True)?)")
            if self.on_moved == "raise":
                raise fail("DCAST_ESTATE", what + "; register it again (on_moved=\"raise\")")
            kind, ptr, mem = _describe_torch(name, t, None)
            if kind != e.kind or _dtypes.shape_of(t) != e.shape or mem != e.mem:
                raise fail("DCAST_ESHAPE", f"{what}; its dtype, shape or device changed too "
                                           f"({e.kind} {e.shape} -> {kind} {_dtypes.shape_of(t)})")
            log.warning("%s; following it to the new memory", what)
            e.ptr = ptr
            self._register(p, name.encode(), e)

    def publish(self, version: int) -> None:
        """Send the registered tensors as `version` (anchor or delta)."""
        p = self._live("publish")
        need_int("publish: version", version, 0, (1 << 64) - 2)
        self._follow_moves(p)
        if self._fetch is not None:
            fetch, self._fetch = self._fetch, None
            check(self._l.dcast_producer_fetch_baseline(p, *fetch))
        check(self._l.dcast_producer_publish(p, version))

    def wait(self, version: int, timeout_ms: int = 30000) -> None:
        """Block until the broker acknowledged `version`; raises on failure
        (DeltacastTimeout, a TimeoutError, when timeout_ms passes first)."""
        check(self._l.dcast_producer_wait(self._live("wait"), need_int("wait: version", version, 0),
                                          need_int("wait: timeout_ms", timeout_ms, -1)))

    def prepare(self) -> None:
        """Set up the producer's memory now (dcast_producer_prepare): the
        tensor table is fixed and the host baseline mapped, faulted in and
        pinned, so that the first anchor's publish() is one copy into memory
        already there.  Call once after registering, at start-up."""
        check(self._l.dcast_producer_prepare(self._live("prepare")))

    def flush(self, timeout_ms: int = 30000) -> None:
        """Block until the broker acknowledged the last version publish()
        accepted (dcast_producer_flush: an anchor still being sent after
        publish() returned is waited for first, as long as its sending goes
        on); raises its failure, or DeltacastTimeout (a TimeoutError) when
        no ACK came within timeout_ms after that (0: at once, a poll)."""
        check(self._l.dcast_producer_flush(self._live("flush"),
                                           need_int("flush: timeout_ms", timeout_ms, -1)))

    def stats(self) -> Stats:
        """Counters of the latest publish (a Stats snapshot; version and
        acked_version None until there is one)."""
        s = _Stats()
        self._l.dcast_producer_stats_get(self._live("stats"), ctypes.byref(s))
        return Stats(s)

    @property
    def broker_version(self) -> Optional[int]:
        """The newest version of the model the broker has committed (its
        WELCOME at open or re-join, and its ACKs since), None for a model
        it has none of.  A restarted trainer resumes above it:
        p.publish((p.broker_version or 0) + 1)."""
        return version_or_none(self._l.dcast_producer_broker_version(self._live("broker_version")))

    def progress(self) -> Progress:
        """The version being published (or the last one): ranges and bytes
        sent and taken by the broker so far, elapsed_ms (a Progress).  Safe
        from another thread while publish() or wait() runs (they release
        the GIL)."""
        s = Progress()
        self._l.dcast_producer_progress_get(self._live("progress"), ctypes.byref(s))
        return s

    def close(self) -> None:
        """Wait (bounded: close_timeout_ms, default 5000) for the last
        version's ACK, then close the connection and free the baseline;
        idempotent."""
        if self._p is not None and self._p.value:
            self._l.dcast_producer_close(ctypes.byref(self._p))
        self._entries = {}
