"""ctypes loader of libdeltacast, the error types of the binding, and the
route of the C library's log lines into logging.getLogger("deltacast").

The library is found, in order: $DELTACAST_LIB (an override); the path
`make install` recorded in _install.py next to this file; the source
tree's build/libdeltacast.so (for the tests); the system loader's
"libdeltacast.so.0".  Every failing C call becomes a DeltacastError
carrying the code, its symbolic name ("DCAST_ESHAPE"), the code's fixed
text and the C detail message."""
from __future__ import annotations

import atexit
import ctypes
import logging
import os
import threading
from typing import Any, List, Optional, Tuple, Union

log = logging.getLogger("deltacast")

_lib: Optional[ctypes.CDLL] = None
_load_lock = threading.Lock()
_LIB_NAME = "libdeltacast.so.0"


class DeltacastError(Exception):
    """A deltacast call failed.  .code: the dcast_err number; .name: its
    symbolic name ("DCAST_EVERSION"); .text: the code's fixed text; .detail:
    what the C library (or the binding's own check) said was wrong."""

    def __init__(self, code: int, name: str, detail: str, text: str = "") -> None:
        super().__init__(f"{name}: {detail}" if detail else name)
        self.code = code
        self.name = name
        self.detail = detail
        self.text = text


class DeltacastArgumentError(DeltacastError, TypeError, ValueError):
    """A bad argument (DCAST_EINVAL, DCAST_EDTYPE, DCAST_ESHAPE): also a
    TypeError and a ValueError, so ordinary argument handling catches it."""


class DeltacastTimeout(DeltacastError, TimeoutError):
    """DCAST_ETIMEDOUT: also a TimeoutError."""


_ARGUMENT_ERRORS = ("DCAST_EINVAL", "DCAST_EDTYPE", "DCAST_ESHAPE")


def _error(code: int, name: str, detail: str, text: str) -> DeltacastError:
    if name in _ARGUMENT_ERRORS:
        return DeltacastArgumentError(code, name, detail, text)
    if name == "DCAST_ETIMEDOUT":
        return DeltacastTimeout(code, name, detail, text)
    return DeltacastError(code, name, detail, text)


def _candidates() -> List[str]:
    env = os.environ.get("DELTACAST_LIB")
    if env:
        return [env]
    out = []
    try:
        from . import _install  # written by `make install` into the installed copy only
        out.append(os.path.join(_install.LIBDIR, _LIB_NAME))
    except ImportError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    out.append(os.path.normpath(os.path.join(here, "..", "..", "build", "libdeltacast.so")))
    return out


def library_path() -> str:
    """The path the library is (or would be) loaded from."""
    for path in _candidates():
        if os.path.exists(path):
            return path
    return _LIB_NAME  # the system loader's search path (ldconfig)


def lib() -> ctypes.CDLL:
    """The loaded library (loaded once, on first use; thread-safe)."""
    global _lib
    with _load_lock:
        if _lib is None:
            _lib = _load()
    return _lib


def _load() -> ctypes.CDLL:
    path = library_path()
    try:
        l = ctypes.CDLL(path)
    except OSError as e:
        tried = ", ".join(_candidates())
        raise DeltacastError(-1, "DCAST_ENOTFOUND",
                             f"cannot load libdeltacast ({e}); tried {tried} and the system "
                             "loader (run `make install`, or set DELTACAST_LIB)") from None
    l.dcast_last_error.restype = ctypes.c_char_p
    l.dcast_errname.restype = ctypes.c_char_p
    l.dcast_errname.argtypes = [ctypes.c_int]
    l.dcast_strerror.restype = ctypes.c_char_p
    l.dcast_strerror.argtypes = [ctypes.c_int]
    l.dcast_err_from_name.argtypes = [ctypes.c_char_p]
    l.dcast_log_set_handler.argtypes = [_LOG_FN, ctypes.c_void_p]
    l.dcast_log_set_level.argtypes = [ctypes.c_int]
    l.dcast_log_get_level.restype = ctypes.c_int
    l.dcast_log_set_handler(_log_trampoline, None)
    atexit.register(_unroute_log, l)
    return l


# ---- errors ----

def error_code(name: str) -> int:
    """The code of a symbolic error name ("DCAST_EDTYPE")."""
    return lib().dcast_err_from_name(name.encode())


def fail(name: str, detail: str) -> DeltacastError:
    """A DeltacastError for a binding-side check, with the C code of `name`."""
    code = error_code(name)
    return _error(code, name, detail, lib().dcast_strerror(code).decode())


def check(rc: int) -> int:
    """Raise DeltacastError for a non-zero dcast_err return code."""
    if rc != 0:
        l = lib()
        name = l.dcast_errname(rc).decode()
        detail = l.dcast_last_error().decode(errors="replace")
        raise _error(rc, name, detail, l.dcast_strerror(rc).decode())
    return rc


# ---- logging ----

_LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_C_TO_PY = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}


def _on_log(level: int, msg: bytes, _arg: Any) -> None:
    try:
        log.log(_C_TO_PY.get(level, logging.INFO), "%s", msg.decode(errors="replace"))
    except Exception:  # never let an exception cross into C
        pass


_log_trampoline = _LOG_FN(_on_log)  # kept alive for the life of the process


def _unroute_log(l: ctypes.CDLL) -> None:
    # Back to stderr before the interpreter goes: the consumer's thread may
    # still log while Python finalises.
    l.dcast_log_set_handler(_LOG_FN(), None)


def set_log_level(level: Union[int, str]) -> None:
    """Set the C library's threshold (a logging level such as logging.DEBUG
    or "DEBUG"); lines above it are dropped in C before they are formatted.
    The default is DELTACAST_LOG from the environment, else INFO.  Records
    reach logging.getLogger("deltacast") and its handlers, whose own levels
    apply as usual."""
    if isinstance(level, str):
        named = logging.getLevelName(level.upper())
        if not isinstance(named, int):
            raise fail("DCAST_EINVAL", f"set_log_level: unknown level {level!r}")
        level = named
    if not isinstance(level, int):
        raise fail("DCAST_EINVAL", f"set_log_level: level must be an int or a name, got {level!r}")
    c = 3 if level <= logging.DEBUG else 2 if level <= logging.INFO else \
        1 if level <= logging.WARNING else 0
    lib().dcast_log_set_level(c)


# ---- shared object behaviour and argument checks ----

VERSION_NONE = (1 << 64) - 1  # DCAST_VERSION_NONE: "no version" in the C API


def version_or_none(v: int) -> Optional[int]:
    """A C version number as Python: None for DCAST_VERSION_NONE."""
    return None if v == VERSION_NONE else v


class StatsView:
    """A snapshot of a C stats structure (a ctypes mirror): every field an
    attribute of the same name, version fields None where C says
    DCAST_VERSION_NONE (no version yet), never 2^64-1."""
    _versions: Tuple[str, ...] = ()

    def __init__(self, raw: ctypes.Structure) -> None:
        for name, _ in raw._fields_:
            value = getattr(raw, name)
            setattr(self, name, version_or_none(value) if name in self._versions else value)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"

class Closable:
    """Context-manager and finaliser behaviour shared by Producer and
    Consumer: both call their own idempotent close()."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.close()
        return False

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def need_str(what: str, value: Any, max_bytes: Optional[int] = None) -> bytes:
    """`value` as UTF-8 bytes, or DeltacastArgumentError naming `what`."""
    if not isinstance(value, str) or not value:
        raise fail("DCAST_EINVAL", f"{what} must be a non-empty str, got {value!r}")
    b = value.encode()
    if max_bytes is not None and len(b) > max_bytes:
        raise fail("DCAST_EINVAL", f"{what} is {len(b)} bytes, more than {max_bytes}")
    return b


def need_endpoint(what: str, value: Any) -> bytes:
    """A ZeroMQ endpoint ("tcp://host:port", "ipc://path", "inproc://name")."""
    b = need_str(what, value)
    if "://" not in value:
        raise fail("DCAST_EINVAL", f"{what} {value!r} is not a ZeroMQ endpoint "
                                   "(e.g. tcp://127.0.0.1:5556)")
    return b


def need_int(what: str, value: Any, lo: int, hi: Optional[int] = None) -> int:
    """An int (not bool) in [lo, hi], or DeltacastArgumentError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail("DCAST_EINVAL", f"{what} must be an int, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f"at least {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise fail("DCAST_EINVAL", f"{what} must be {bound}, got {value}")
    return value


def need_dims(what: str, dims: Any) -> Tuple[int, ...]:
    """A sequence of ints >= 0 (a shape, an offset) as a tuple, or
    DeltacastArgumentError naming `what`."""
    if isinstance(dims, (str, bytes)) or not hasattr(dims, "__iter__"):
        raise fail("DCAST_EINVAL", f"{what} must be a sequence of ints, got {dims!r}")
    out = []
    for d in dims:  # numpy and torch integer scalars count as ints
        if hasattr(d, "__index__") and not isinstance(d, (bool, int)):
            d = d.__index__()
        out.append(need_int(what, d, 0))
    return tuple(out)


def curve_keys(server: Any, public: Any, secret: Any) -> List[Optional[bytes]]:
    """CURVE keys as Z85 bytes (40 characters each): all three or none."""
    given = [k is not None for k in (server, public, secret)]
    if any(given) and not all(given):
        raise fail("DCAST_EINVAL", "CURVE needs curve_server_key (the broker's public key) and "
                                   "this peer's curve_public_key and curve_secret_key, all three")
    out: List[Optional[bytes]] = []
    for what, k in (("curve_server_key", server), ("curve_public_key", public),
                    ("curve_secret_key", secret)):
        if k is None:
            out.append(None)
            continue
        b = k.encode() if isinstance(k, str) else k
        if not isinstance(b, bytes):
            raise fail("DCAST_EINVAL", f"{what} must be a str or bytes (Z85), got {type(k).__name__}")
        b = b.strip()
        if len(b) != 40:
            raise fail("DCAST_EINVAL", f"{what} must be 40 Z85 characters (deltacast keygen "
                                       f"writes them), got {len(b)}")
        out.append(b)
    return out



def read_curve_key(path: Union[str, "os.PathLike[str]"]) -> str:
    """The Z85 key in a file `deltacast keygen` wrote (PREFIX.public or
    PREFIX.secret): the first line that is not empty or a # comment."""
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                if len(line) != 40:
                    raise fail("DCAST_EINVAL", f"{path}: a Z85 key has 40 characters, "
                                               f"found {len(line)}")
                return line
    raise fail("DCAST_EINVAL", f"{path}: no key in the file")
