"""Consumer: receive versions of a model from a deltacast broker and apply
each whole, checked version to live tensors in one short step.

    with Consumer("tcp://127.0.0.1:5556", "policy", "/var/lib/worker") as c:
        c.bind("w", weights)               # numpy array (or torch CPU tensor)
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
only inside apply() (or on the consumer's thread with auto_apply=True)."""
import collections
import ctypes

from ._lib import Closable, check, fail, lib

VERSION_NONE = (1 << 64) - 1
MEM_HOST, MEM_CUDA = 0, 1
_DTYPE_NAMES = ["BF16", "F16", "F32", "F8_E4M3", "F8_E5M2", "I8", "U8", "I16", "U16", "I32", "U32"]
# numpy dtype holding each wire dtype's elements (bf16 and fp8 as bit patterns)
_NUMPY_OF = {"BF16": "uint16", "F16": "float16", "F32": "float32", "F8_E4M3": "uint8",
             "F8_E5M2": "uint8", "I8": "int8", "U8": "uint8", "I16": "int16", "U16": "uint16",
             "I32": "int32", "U32": "uint32"}
_EVENTS = {0: None, 1: "ready", 2: "anchor", 3: "gap", 4: "error"}

Event = collections.namedtuple("Event", "type version have_version code text bytes")


class _Opts(ctypes.Structure):
    _fields_ = [("verify_digests", ctypes.c_int), ("heartbeat_ms", ctypes.c_uint32),
                ("fold_every", ctypes.c_uint32), ("max_staged", ctypes.c_uint32),
                ("client", ctypes.c_char_p), ("curve_server_key", ctypes.c_char_p),
                ("curve_public_key", ctypes.c_char_p), ("curve_secret_key", ctypes.c_char_p),
                ("fold_fraction", ctypes.c_double), ("auto_apply", ctypes.c_int)]


class _Event(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("version", ctypes.c_uint64),
                ("have_version", ctypes.c_uint64), ("code", ctypes.c_int),
                ("bytes", ctypes.c_uint64), ("text", ctypes.c_char * 256)]


class _Desc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 256), ("dtype", ctypes.c_uint32),
                ("ndim", ctypes.c_uint32), ("shape", ctypes.c_uint64 * 8)]


class Stats(ctypes.Structure):
    """Numbers of the version last applied (dcast_consumer_stats)."""
    _fields_ = [("version", ctypes.c_uint64), ("anchor", ctypes.c_int),
                ("chunks", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("stage_ns", ctypes.c_uint64), ("apply_ns", ctypes.c_uint64),
                ("spilled_chunks", ctypes.c_uint64), ("total_bytes_received", ctypes.c_uint64),
                ("peak_pool_bytes", ctypes.c_uint64), ("pool_bytes", ctypes.c_uint64),
                ("log_write_bytes", ctypes.c_uint64), ("log_write_ns", ctypes.c_uint64),
                ("verify_bytes", ctypes.c_uint64), ("rejoins", ctypes.c_uint64)]


def _declare(l):
    vp, u32, u64, i = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int
    l.dcast_consumer_opts_init.argtypes = [ctypes.POINTER(_Opts)]
    l.dcast_consumer_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, u64,
                                      ctypes.POINTER(_Opts), ctypes.POINTER(vp)]
    l.dcast_consumer_close.argtypes = [ctypes.POINTER(vp)]
    l.dcast_consumer_bind.argtypes = [vp, ctypes.c_char_p, vp, i, u64]
    l.dcast_consumer_tensor.argtypes = [vp, ctypes.c_char_p, ctypes.POINTER(vp),
                                        ctypes.POINTER(_Desc), ctypes.POINTER(i)]
    l.dcast_consumer_tensor_count.argtypes = [vp]
    l.dcast_consumer_tensor_count.restype = u32
    l.dcast_consumer_tensor_at.argtypes = [vp, u32, ctypes.POINTER(_Desc)]
    l.dcast_consumer_poll.argtypes = [vp, i, ctypes.POINTER(_Event)]
    l.dcast_consumer_apply.argtypes = [vp, u64]
    l.dcast_consumer_version.argtypes = [vp]
    l.dcast_consumer_version.restype = u64
    l.dcast_consumer_ready_version.argtypes = [vp]
    l.dcast_consumer_ready_version.restype = u64
    l.dcast_consumer_wait_version.argtypes = [vp, u64, i]
    l.dcast_consumer_checkpoint.argtypes = [vp]
    l.dcast_consumer_stats_get.argtypes = [vp, ctypes.POINTER(Stats)]
    return l


def _ver(v):
    return None if v == VERSION_NONE else v


class Consumer(Closable):
    """A consumer of one model (see the module doc).  verify: True checks the
    COMMIT digests from the elements each version changes, "all" computes
    every digest range whole after every version, False checks none."""

    def __init__(self, broker, model, dir, budget_bytes=256 << 20, verify=True, fold_every=None,
                 client="python", auto_apply=False, fold_fraction=None):
        self._l = _declare(lib())
        self._c = ctypes.c_void_p()
        self._bound = {}
        opts = _Opts()
        self._l.dcast_consumer_opts_init(ctypes.byref(opts))
        opts.verify_digests = 2 if verify == "all" else 1 if verify else 0
        if fold_every is not None:
            opts.fold_every = fold_every
        if fold_fraction is not None:
            opts.fold_fraction = fold_fraction
        opts.auto_apply = 1 if auto_apply else 0
        self._client = client.encode()
        opts.client = self._client
        check(self._l.dcast_consumer_open(broker.encode(), model.encode(), str(dir).encode(),
                                          budget_bytes, ctypes.byref(opts), ctypes.byref(self._c)))

    def _live(self):
        if self._c is None or not self._c.value:
            raise fail("DCAST_ESTATE", "consumer is closed")
        return self._c

    def names(self):
        """Names of the model's tensors, in manifest order ([] before the manifest)."""
        c, d = self._live(), _Desc()
        out = []
        for i in range(self._l.dcast_consumer_tensor_count(c)):
            check(self._l.dcast_consumer_tensor_at(c, i, ctypes.byref(d)))
            out.append(d.name.decode())
        return out

    def _desc(self, name):
        ptr, d, mem = ctypes.c_void_p(), _Desc(), ctypes.c_int()
        check(self._l.dcast_consumer_tensor(self._live(), name.encode(), ctypes.byref(ptr),
                                            ctypes.byref(d), ctypes.byref(mem)))
        dtype = _DTYPE_NAMES[d.dtype]
        return ptr.value, dtype, tuple(d.shape[i] for i in range(d.ndim)), mem.value

    def tensor(self, name):
        """A numpy view of the live host tensor `name` (bf16/fp8 as uint bit
        patterns).  Valid until close() or bind(); changes only in apply()."""
        import numpy as np
        ptr, dtype, shape, mem = self._desc(name)
        if mem != MEM_HOST:
            raise fail("DCAST_EINVAL", f"tensor {name} lives on a CUDA device")
        n = 1
        for s in shape:
            n *= s
        dt = np.dtype(_NUMPY_OF[dtype])
        buf = (ctypes.c_char * (n * dt.itemsize)).from_address(ptr) if n else bytearray()
        return np.frombuffer(buf, dtype=dt, count=n).reshape(shape)

    def bind(self, name, array):
        """Make `array` (C-contiguous numpy array or torch tensor of the
        manifest's size) the live tensor `name`; the current version is
        copied into it."""
        if hasattr(array, "data_ptr"):
            ptr, nbytes = array.data_ptr(), array.numel() * array.element_size()
            mem = MEM_CUDA if array.is_cuda else MEM_HOST
            if not array.is_contiguous():
                raise fail("DCAST_EINVAL", f"bind {name}: torch tensor is not contiguous")
        else:
            if not array.flags["C_CONTIGUOUS"] or not array.flags["WRITEABLE"]:
                raise fail("DCAST_EINVAL", f"bind {name}: numpy array must be C-contiguous and writeable")
            ptr, nbytes, mem = array.ctypes.data, array.nbytes, MEM_HOST
        check(self._l.dcast_consumer_bind(self._live(), name.encode(), ptr, mem, nbytes))
        self._bound[name] = array

    def poll(self, timeout_ms=100):
        """Drive the consumer up to timeout_ms; returns an Event (type "ready",
        "anchor", "gap" or "error") or None when nothing happened."""
        ev = _Event()
        check(self._l.dcast_consumer_poll(self._live(), timeout_ms, ctypes.byref(ev)))
        kind = _EVENTS.get(ev.type)
        if kind is None:
            return None
        return Event(kind, _ver(ev.version), _ver(ev.have_version), ev.code,
                     ev.text.decode(errors="replace"), ev.bytes)

    def apply(self, version):
        """Apply READY `version` (transactional: on error the tensors keep the
        previous version and DeltacastError is raised)."""
        check(self._l.dcast_consumer_apply(self._live(), version))

    @property
    def version(self):
        """Version the live tensors hold, None before the first apply."""
        return _ver(self._l.dcast_consumer_version(self._live()))

    @property
    def ready_version(self):
        """Newest version apply() can take now, or None."""
        return _ver(self._l.dcast_consumer_ready_version(self._live()))

    def wait_version(self, min_version, timeout_ms=-1):
        """Block until version >= min_version (raises DCAST_ETIMEDOUT)."""
        check(self._l.dcast_consumer_wait_version(self._live(), min_version, timeout_ms))

    def checkpoint(self):
        """Write DIR/model.safetensors as the applied version now."""
        check(self._l.dcast_consumer_checkpoint(self._live()))

    def stats(self):
        """Numbers of the version last applied (a Stats structure)."""
        s = Stats()
        self._l.dcast_consumer_stats_get(self._live(), ctypes.byref(s))
        return s

    def close(self):
        """Disconnect and free; bound arrays keep their contents.  Idempotent."""
        if self._c is not None and self._c.value:
            self._l.dcast_consumer_close(ctypes.byref(self._c))
        self._bound = {}
