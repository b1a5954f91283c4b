"""ctypes loader of libdeltacast.so and the error type of the binding.

The library is found through $DELTACAST_LIB, else ../../build/libdeltacast.so
relative to this package.  Every failing C call becomes a DeltacastError
carrying the code, its symbolic name and the C detail message."""
import ctypes
import os

_lib = None


class DeltacastError(Exception):
    """A deltacast call failed: .code (int), .name ("DCAST_EVERSION"), .detail."""

    def __init__(self, code, name, detail):
        super().__init__(f"{name}: {detail}" if detail else name)
        self.code = code
        self.name = name
        self.detail = detail


def _path():
    env = os.environ.get("DELTACAST_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "build", "libdeltacast.so"))


def lib():
    """The loaded library (loaded once, on first use)."""
    global _lib
    if _lib is None:
        path = _path()
        if not os.path.exists(path):
            raise DeltacastError(-1, "DCAST_ENOTFOUND",
                                 f"libdeltacast.so not found at {path} (set DELTACAST_LIB or run make)")
        l = ctypes.CDLL(path)
        l.dcast_last_error.restype = ctypes.c_char_p
        l.dcast_errname.restype = ctypes.c_char_p
        l.dcast_errname.argtypes = [ctypes.c_int]
        l.dcast_err_from_name.argtypes = [ctypes.c_char_p]
        _lib = l
    return _lib


def error_code(name):
    """The code of a symbolic error name ("DCAST_EDTYPE")."""
    return lib().dcast_err_from_name(name.encode())


def fail(name, detail):
    """A DeltacastError raised from Python-side checks, with the C code of `name`."""
    return DeltacastError(error_code(name), name, detail)


def check(rc):
    """Raise DeltacastError for a non-zero dcast_err return code."""
    if rc != 0:
        l = lib()
        name = l.dcast_errname(rc).decode()
        detail = l.dcast_last_error().decode(errors="replace")
        raise DeltacastError(rc, name, detail)
    return rc


class Closable:
    """Context-manager and finaliser behaviour shared by Producer and
    Consumer: both call their own idempotent close()."""

    def close(self):
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
