"""Producer: publish versions of a model's tensors to a deltacast broker.

    with Producer("tcp://127.0.0.1:5555", "policy") as p:
        p.register("w", weights)          # numpy array or torch tensor
        p.publish(1); p.wait(1)

numpy arrays must be C-contiguous; float32 -> F32, float16 -> F16, and
uint16 holding bf16 bit patterns -> BF16 when dtype="bf16" is given.  torch
tensors (CPU or CUDA, bfloat16 included) are passed by data_ptr().  The
library reads the memory during publish(): keep the tensors alive and
unchanged until publish() returns."""
import ctypes

from ._lib import Closable, check, fail, lib

_DTYPES = {"BF16": 0, "F16": 1, "F32": 2, "F8_E4M3": 3, "F8_E5M2": 4, "I8": 5, "U8": 6,
           "I16": 7, "U16": 8, "I32": 9, "U32": 10}
_NUMPY = {"float32": "F32", "float16": "F16", "int8": "I8", "uint8": "U8", "int16": "I16",
          "uint16": "U16", "int32": "I32", "uint32": "U32"}
_TORCH = {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16",
          "torch.int8": "I8", "torch.uint8": "U8", "torch.int16": "I16", "torch.int32": "I32",
          "torch.float8_e4m3fn": "F8_E4M3", "torch.float8_e5m2": "F8_E5M2"}
MEM_HOST, MEM_CUDA = 0, 1
VERSION_NONE = (1 << 64) - 1


class _Opts(ctypes.Structure):
    _fields_ = [("range_elems", ctypes.c_uint64), ("max_inflight_bytes", ctypes.c_uint64),
                ("undo_bytes", ctypes.c_uint64), ("connect_timeout_ms", ctypes.c_uint32),
                ("ack_timeout_ms", ctypes.c_uint32), ("max_reconnects", ctypes.c_uint32),
                ("reconnect_backoff_ms", ctypes.c_uint32), ("baseline_on_device", ctypes.c_int),
                ("client", ctypes.c_char_p), ("curve_server_key", ctypes.c_char_p),
                ("curve_public_key", ctypes.c_char_p), ("curve_secret_key", ctypes.c_char_p),
                ("encode_threads", ctypes.c_uint32)]


class Stats(ctypes.Structure):
    """Counters of the latest publish (dcast_producer_stats)."""
    _fields_ = [("version", ctypes.c_uint64), ("anchor", ctypes.c_int),
                ("chunks_total", ctypes.c_uint64), ("chunks_sent", ctypes.c_uint64),
                ("changed_elems", ctypes.c_uint64), ("elems", ctypes.c_uint64),
                ("payload_bytes", ctypes.c_uint64), ("model_bytes", ctypes.c_uint64),
                ("acked_version", ctypes.c_uint64), ("total_reconnects", ctypes.c_uint64),
                ("total_payload_bytes", ctypes.c_uint64), ("total_resends", ctypes.c_uint64)]


def _declare(l):
    vp, u32, u64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64
    l.dcast_producer_opts_init.argtypes = [ctypes.POINTER(_Opts)]
    l.dcast_producer_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, u32, u32,
                                      ctypes.POINTER(_Opts), ctypes.POINTER(vp)]
    l.dcast_producer_register.argtypes = [vp, ctypes.c_char_p, ctypes.c_int, u32,
                                          ctypes.POINTER(u64), vp, ctypes.c_int, u64, u64]
    l.dcast_producer_publish.argtypes = [vp, u64]
    l.dcast_producer_wait.argtypes = [vp, u64, ctypes.c_int]
    l.dcast_producer_stats_get.argtypes = [vp, ctypes.POINTER(Stats)]
    l.dcast_producer_close.argtypes = [ctypes.POINTER(vp)]
    return l


def _describe_numpy(name, a, dtype):
    if not a.flags["C_CONTIGUOUS"]:
        raise fail("DCAST_EINVAL", f"register {name}: numpy array is not C-contiguous "
                                   "(use numpy.ascontiguousarray)")
    if dtype is not None:
        want = dtype.upper()
        if want == "BF16" and a.dtype.name != "uint16":
            raise fail("DCAST_EDTYPE", f"register {name}: dtype='bf16' needs a uint16 array of "
                                       f"bf16 bit patterns, got {a.dtype.name}")
        if want != "BF16" and _NUMPY.get(a.dtype.name) != want:
            raise fail("DCAST_EDTYPE", f"register {name}: dtype={dtype!r} does not match the "
                                       f"array's {a.dtype.name}")
        return want, a.shape, a.ctypes.data, MEM_HOST
    if a.dtype.name not in _NUMPY:
        raise fail("DCAST_EDTYPE", f"register {name}: numpy dtype {a.dtype.name} is not one the "
                                   "codec takes (float32, float16, bf16 as uint16, 8/16/32-bit ints)")
    return _NUMPY[a.dtype.name], a.shape, a.ctypes.data, MEM_HOST


def _describe_torch(name, t, dtype):
    kind = _TORCH.get(str(t.dtype))
    if dtype is not None and kind != dtype.upper():
        raise fail("DCAST_EDTYPE", f"register {name}: dtype={dtype!r} does not match {t.dtype}")
    if kind is None:
        raise fail("DCAST_EDTYPE", f"register {name}: torch dtype {t.dtype} is not one the codec "
                                   "takes (float32, float16, bfloat16, float8, 8/16/32-bit ints)")
    if not t.is_contiguous():
        raise fail("DCAST_EINVAL", f"register {name}: torch tensor is not contiguous")
    mem = MEM_CUDA if t.is_cuda else MEM_HOST
    return kind, tuple(t.shape), t.data_ptr(), mem


class Producer(Closable):
    """One part of a model's producer, connected to a broker (see module doc)."""

    def __init__(self, broker, model, part=0, parts=1, range_elems=None,
                 connect_timeout_ms=None, max_reconnects=None, client="python",
                 encode_threads=None, baseline_on_device=False):
        self._l = _declare(lib())
        self._p = ctypes.c_void_p()
        self._keep = {}
        opts = _Opts()
        self._l.dcast_producer_opts_init(ctypes.byref(opts))
        if range_elems is not None:
            opts.range_elems = range_elems
        if connect_timeout_ms is not None:
            opts.connect_timeout_ms = connect_timeout_ms
        if max_reconnects is not None:
            opts.max_reconnects = max_reconnects
        if encode_threads is not None:
            opts.encode_threads = encode_threads
        opts.baseline_on_device = int(bool(baseline_on_device))
        self._client = client.encode()
        opts.client = self._client
        check(self._l.dcast_producer_open(broker.encode(), model.encode(), part, parts,
                                          ctypes.byref(opts), ctypes.byref(self._p)))

    def register(self, name, tensor, dtype=None, shape=None, shard_offset=0):
        """Register a numpy array or torch tensor under `name`.  For a shard of
        a larger tensor pass its global `shape` and element `shard_offset`."""
        if self._p is None or not self._p.value:
            raise fail("DCAST_ESTATE", "register: producer is closed")
        if hasattr(tensor, "data_ptr"):
            kind, local, ptr, mem = _describe_torch(name, tensor, dtype)
        else:
            kind, local, ptr, mem = _describe_numpy(name, tensor, dtype)
        count = 1
        for d in local:
            count *= int(d)
        gshape = tuple(int(d) for d in (shape if shape is not None else local))
        dims = (ctypes.c_uint64 * max(1, len(gshape)))(*gshape)
        check(self._l.dcast_producer_register(self._p, name.encode(), _DTYPES[kind], len(gshape),
                                              dims, ptr, mem, shard_offset, count))
        self._keep[name] = tensor  # the C side reads this memory at each publish

    def publish(self, version):
        """Send the registered tensors as `version` (anchor or delta)."""
        check(self._l.dcast_producer_publish(self._p, version))

    def wait(self, version, timeout_ms=30000):
        """Block until the broker acknowledged `version`; raises on failure."""
        check(self._l.dcast_producer_wait(self._p, version, timeout_ms))

    def stats(self):
        """Counters of the latest publish (a Stats structure)."""
        s = Stats()
        self._l.dcast_producer_stats_get(self._p, ctypes.byref(s))
        return s

    def close(self):
        """Close the connection and free the baseline; idempotent."""
        if self._p is not None and self._p.value:
            self._l.dcast_producer_close(ctypes.byref(self._p))
        self._keep = {}
