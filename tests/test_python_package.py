"""The Python package around the C library, without torch: __version__ and
py.typed; ctypes structures laid out exactly as the C headers' (sizes and
offsets reported by tests/tools/struct_layout); errors carrying the C
name, text and detail, argument errors also TypeError/ValueError, timeouts
also TimeoutError; Consumer(dir=None) refused without creating ./None; the
staging budget sized from the model; the C log (the consumer's own thread
included) routed to logging.getLogger("deltacast"); CURVE keys given to a
Producer and a Consumer carry a version through a CURVE broker."""
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_producer_python import BUILD, procs, start_broker  # noqa: E402  (sanitizer re-exec)

import numpy as np  # noqa: E402

import deltacast  # noqa: E402
from deltacast import (Consumer, DeltacastArgumentError, DeltacastError, DeltacastTimeout,  # noqa: E402
                       Producer, default_budget)
from deltacast import consumer as dc_consumer, producer as dc_producer  # noqa: E402

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))


def raises(cls, fn, name=None, has=None):
    try:
        fn()
    except cls as e:
        if name is not None:
            assert e.name == name, f"got {e.name} ({e}), want {name}"
        if has is not None:
            assert has in str(e), f"{has!r} not in {e}"
        return e
    raise AssertionError(f"no {cls.__name__} raised")


def check_version():
    assert isinstance(deltacast.__version__, str) and deltacast.__version__.count(".") == 2
    pkg = os.path.dirname(deltacast.__file__)
    assert os.path.exists(os.path.join(pkg, "py.typed"))
    with open(os.path.join(HERE, "..", "scripts", "deltacast.pc.in")) as f:
        assert "@VERSION@" in f.read()  # the pc file takes the package's version


def check_layout():
    out = subprocess.run([os.path.join(BUILD, "tools", "struct_layout")], capture_output=True,
                         text=True, check=True).stdout
    c = json.loads(out)
    mirror = {"consumer_opts": dc_consumer._Opts, "event": dc_consumer._Event,
              "tensor_desc": dc_consumer._Desc, "consumer_stats": dc_consumer._Stats,
              "producer_opts": dc_producer._Opts, "producer_stats": dc_producer._Stats,
              "producer_progress": dc_producer.Progress}
    for name, cls in mirror.items():
        import ctypes
        assert ctypes.sizeof(cls) == c[name]["size"], \
            f"{name}: ctypes size {ctypes.sizeof(cls)}, C size {c[name]['size']}"
        fields = {f[0]: getattr(cls, f[0]).offset for f in cls._fields_}
        assert fields == c[name]["fields"], f"{name}: ctypes {fields} != C {c[name]['fields']}"


def check_errors(tmp):
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        e = raises(DeltacastArgumentError, lambda: Consumer("tcp://127.0.0.1:1", "m", None),
                   "DCAST_EINVAL", "dir")
        assert isinstance(e, TypeError) and isinstance(e, ValueError) and e.code > 0
        assert e.text and e.detail and "None" in e.detail
        assert not os.path.exists(os.path.join(tmp, "None")), "Consumer(dir=None) made ./None"
        raises(DeltacastArgumentError, lambda: Consumer("127.0.0.1:1", "m", "d"), "DCAST_EINVAL",
               "endpoint")
        raises(DeltacastArgumentError, lambda: Consumer("tcp://127.0.0.1:1", "", "d"),
               "DCAST_EINVAL", "model")
        raises(DeltacastArgumentError, lambda: Consumer("tcp://127.0.0.1:1", "m", "d",
                                                        budget_bytes=1000), None, "budget_bytes")
        raises(ValueError, lambda: Consumer("tcp://127.0.0.1:1", "m", "d", verify="some"))
        raises(ValueError, lambda: Consumer("tcp://127.0.0.1:1", "m", "d",
                                            curve_server_key="x" * 40), None, "all three")
        raises(ValueError, lambda: Producer("tcp://127.0.0.1:1", "m", part=2, parts=2), None, "part")
        raises(ValueError, lambda: Producer("tcp://127.0.0.1:1", "m", range_elems=0))
        assert not os.listdir(tmp), os.listdir(tmp)  # nothing was created by refused calls
        # A C-side failure keeps its name, fixed text and detail.
        e = raises(DeltacastError, lambda: Producer("tcp://127.0.0.1:1", "m",
                                                    connect_timeout_ms=200), "DCAST_ECLOSED")
        assert "tcp://127.0.0.1:1" in e.detail and e.text
        with Consumer("tcp://127.0.0.1:1", "m", os.path.join(tmp, "c")) as c:
            e = raises(DeltacastTimeout, lambda: c.wait_version(1, 50), "DCAST_ETIMEDOUT")
            assert isinstance(e, TimeoutError)
            assert c.budget_bytes == 64 * MiB  # model size unknown
        raises(DeltacastError, lambda: c.version, "DCAST_ESTATE", "closed")
    finally:
        os.chdir(cwd)


def check_budget(tmp):
    assert default_budget(None) == 64 * MiB
    assert default_budget(3_700_000) == 16 * MiB  # a 3.7 MB model: 16 MiB, not 192 MiB
    assert default_budget(10 * MiB) == 40 * MiB
    assert default_budget(1 << 40) == 256 * MiB
    d = os.path.join(tmp, "ckpt")
    os.makedirs(d)
    hdr = b'{"w":{"dtype":"F32","shape":[1000000],"data_offsets":[0,4000000]}}'
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(len(hdr).to_bytes(8, "little") + hdr + b"\0" * 4000000)
    assert dc_consumer._checkpoint_bytes(d) == 4000000
    assert dc_consumer._checkpoint_bytes(os.path.join(tmp, "none")) is None


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def start_curve_broker(tmp):
    cli = os.path.join(BUILD, "deltacast")
    for who in ("srv", "prod", "cons"):
        subprocess.run([cli, "keygen", "-o", os.path.join(tmp, who)], check=True,
                       capture_output=True)
    with open(os.path.join(tmp, "producers"), "w") as f:
        f.write(open(os.path.join(tmp, "prod.public")).read())
    return start_broker(tmp, "--curve-secret", os.path.join(tmp, "srv.secret"),
                        "--producer-keys", os.path.join(tmp, "producers"))


def check_curve_and_log(tmp):
    records = Records()
    logger = logging.getLogger("deltacast")
    logger.addHandler(records)
    logger.setLevel(logging.DEBUG)
    deltacast.set_log_level("DEBUG")
    try:
        prod_ep, cons_ep = start_curve_broker(tmp)
        key = deltacast.read_curve_key
        srv = key(os.path.join(tmp, "srv.public"))
        w = np.arange(4096, dtype=np.float32)
        with Producer(prod_ep, "curvy", curve_server_key=srv,
                      curve_public_key=key(os.path.join(tmp, "prod.public")),
                      curve_secret_key=key(os.path.join(tmp, "prod.secret"))) as p:
            p.register("w", w)
            p.publish(1)
            p.wait(1)
        with Consumer(cons_ep, "curvy", os.path.join(tmp, "cw"), curve_server_key=srv,
                      curve_public_key=key(os.path.join(tmp, "cons.public")),
                      curve_secret_key=key(os.path.join(tmp, "cons.secret")),
                      auto_apply=True) as c:
            c.wait_version(1, 20000)
            assert np.array_equal(c.tensor("w"), w)
        main = threading.get_ident()
        from_thread = [r for r in records.records
                       if r.thread != main and "consumer curvy" in r.getMessage()]
        assert from_thread, "no log record from the consumer's thread reached logging"
        assert all(r.name == "deltacast" for r in records.records)
        assert any(r.levelno == logging.DEBUG for r in from_thread)
    finally:
        deltacast.set_log_level("INFO")
        logger.removeHandler(records)
    raises(ValueError, lambda: deltacast.set_log_level("LOUD"))


def main():
    tmp = tempfile.mkdtemp(prefix="dcast-pypkg-")
    try:
        check_version()
        check_layout()
        empty = os.path.join(tmp, "cwd")
        os.makedirs(empty)
        check_errors(empty)
        check_budget(tmp)
        check_curve_and_log(tmp)
        print("test_python_package: ok")
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
