"""deltacast.sglang: the module imports without SGLang; its environment
configuration names what is missing or malformed; with SGLang
importable, SGLang's own dynamic_import resolves the loader named on
--custom-weight-loader, and an update without the version tensor is
refused naming it.  Exits 77 when SGLang does not import (the mapping it
runs is tested by test_engine_mapping.py)."""
import sys

import deltacast.sglang as ds


def check_env():
    try:
        ds.config_from_env({"DELTACAST_BROKER": "tcp://127.0.0.1:1"})
        raise AssertionError("no error for a missing DELTACAST_MODEL")
    except ValueError as e:
        assert "DELTACAST_MODEL, DELTACAST_DIR" in str(e), e
    env = {"DELTACAST_BROKER": "tcp://b:1", "DELTACAST_MODEL": "m", "DELTACAST_DIR": "/d",
           "DELTACAST_IGNORE": "rotary,lm_head", "DELTACAST_TIMEOUT_MS": "5000"}
    got = ds.config_from_env(env)
    assert got == {"broker": "tcp://b:1", "model": "m", "dir": "/d", "timeout_ms": 5000,
                   "ignore": ["rotary", "lm_head"]}, got
    try:
        ds.config_from_env(dict(env, DELTACAST_BUDGET_BYTES="lots"))
        raise AssertionError("no error for a malformed DELTACAST_BUDGET_BYTES")
    except ValueError as e:
        assert "DELTACAST_BUDGET_BYTES='lots'" in str(e), e


def main():
    check_env()
    try:
        import sglang  # noqa: F401
        from sglang.srt.utils import dynamic_import
    except ImportError as e:
        print(f"skip: SGLang does not import for {sys.executable} ({e})")
        return 77
    import torch
    assert dynamic_import("deltacast.sglang.load") is ds.load
    assert ds.version_of([(ds.VERSION_TENSOR, torch.tensor([7]))]) == 7
    try:
        ds.load(torch.nn.Linear(2, 2), [("w", torch.zeros(2))])
        raise AssertionError("an update without the version tensor was taken")
    except ValueError as e:
        assert ds.VERSION_TENSOR in str(e), e
    print("test_engine_sglang: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
