"""deltacast.vllm: the module imports without vLLM (register() says
False, the backend classes raise ImportError naming vLLM's API); with
vLLM importable, register() puts the "deltacast" backend in
WeightTransferEngineFactory and its class derives from vLLM's
WeightTransferEngine with the init and update info it parses.  Exits 77
when vLLM does not import (the mapping it runs is tested by
test_engine_mapping.py)."""
import sys

import deltacast.vllm as dv


def main():
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        assert dv.register() is False
        try:
            dv.DeltacastWeightTransferEngine
            raise AssertionError("the backend class built without vLLM")
        except ImportError as err:
            assert "vllm.distributed.weight_transfer" in str(err), err
        print(f"skip: vLLM does not import for {sys.executable} ({e})")
        return 77
    from vllm.distributed.weight_transfer.base import WeightTransferEngine
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    assert dv.register() and dv.register()  # twice is fine
    cls = WeightTransferEngineFactory._registry[dv.BACKEND]()
    assert cls is dv.DeltacastWeightTransferEngine and issubclass(cls, WeightTransferEngine)
    info = cls.init_info_cls(broker="tcp://127.0.0.1:1", model="policy", dir="/tmp/x")
    assert info.stacked is None and info.timeout_ms > 0
    assert cls.update_info_cls(version=3).version == 3
    print("test_engine_vllm: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
