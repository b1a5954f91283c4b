"""The wire dtypes (include/deltacast/schema.h, dcast_dtype) and which numpy
and torch dtypes hold each: shared by register (producer) and bind
(consumer), so both refuse the same mismatches."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

# dcast_dtype values, in enum order
WIRE = ["BF16", "F16", "F32", "F8_E4M3", "F8_E5M2", "I8", "U8", "I16", "U16", "I32", "U32",
        "BOOL", "I64", "U64", "F64"]
CODE = {name: i for i, name in enumerate(WIRE)}

# numpy dtype names that hold each wire dtype's elements.  bf16 and fp8 have
# no numpy dtype: their bit patterns travel in uint16 / uint8 arrays (or in
# ml_dtypes' bfloat16 / float8 types where installed).
NUMPY_OF = {"BF16": ("uint16", "bfloat16"), "F16": ("float16",), "F32": ("float32",),
            "F8_E4M3": ("uint8", "float8_e4m3fn"), "F8_E5M2": ("uint8", "float8_e5m2"),
            "I8": ("int8",), "U8": ("uint8",), "I16": ("int16",), "U16": ("uint16",),
            "I32": ("int32",), "U32": ("uint32",), "BOOL": ("bool",), "I64": ("int64",),
            "U64": ("uint64",), "F64": ("float64",)}
# numpy dtype -> wire dtype when the caller does not say (uint16 means U16:
# pass dtype="bf16" for bf16 bit patterns)
WIRE_OF_NUMPY = {"float32": "F32", "float16": "F16", "int8": "I8", "uint8": "U8",
                 "int16": "I16", "uint16": "U16", "int32": "I32", "uint32": "U32",
                 "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
                 "bool": "BOOL", "int64": "I64", "uint64": "U64", "float64": "F64"}
WIRE_OF_TORCH = {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16",
                 "torch.int8": "I8", "torch.uint8": "U8", "torch.int16": "I16",
                 "torch.int32": "I32", "torch.float8_e4m3fn": "F8_E4M3",
                 "torch.float8_e5m2": "F8_E5M2", "torch.bool": "BOOL", "torch.int64": "I64",
                 "torch.uint64": "U64", "torch.float64": "F64"}


def is_torch(t: Any) -> bool:
    return hasattr(t, "data_ptr") and hasattr(t, "is_cuda")


def wire_of(t: Any) -> Optional[str]:
    """The wire dtype a torch tensor or numpy array holds by its own dtype,
    or None when no wire dtype matches."""
    if is_torch(t):
        return WIRE_OF_TORCH.get(str(t.dtype))
    return WIRE_OF_NUMPY.get(getattr(getattr(t, "dtype", None), "name", ""))


def holds(t: Any, wire: str) -> bool:
    """Whether array or tensor `t` holds elements of wire dtype `wire`."""
    if is_torch(t):
        return WIRE_OF_TORCH.get(str(t.dtype)) == wire
    return t.dtype.name in NUMPY_OF[wire]


def dtype_str(t: Any) -> str:
    return str(t.dtype) if is_torch(t) else t.dtype.name


def shape_of(t: Any) -> Tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


def numpy_view_dtype(wire: str) -> str:
    """The numpy dtype tensor() views a wire dtype's elements as."""
    return NUMPY_OF[wire][0]


def describe(t: Any) -> Dict[str, Any]:
    """dtype and shape of an array or tensor, for error messages."""
    return {"dtype": dtype_str(t), "shape": shape_of(t)}


def holders(wire: str) -> str:
    """What may hold a wire dtype, for error messages."""
    torch_name = {v: k for k, v in WIRE_OF_TORCH.items()}.get(wire, "no torch dtype")
    return f"{torch_name} tensor or a numpy {'/'.join(NUMPY_OF[wire])} array"


# Wire dtypes numpy has no type for: tensor() hands them out as torch
# tensors of the real dtype where torch imports.
TORCH_ONLY = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
_torch: List[Any] = []  # [torch module or None], filled on first use


def torch_module() -> Any:
    """The torch module, or None where it does not import (tried once)."""
    if not _torch:
        try:
            import torch
        except ImportError:
            torch = None
        _torch.append(torch)
    return _torch[0]


def torch_view(a: Any, wire: str) -> Any:
    """A torch tensor of wire dtype `wire` sharing the memory of numpy
    array `a` (its bit patterns: uint16 for BF16, uint8 for FP8), or None
    when torch does not import, lacks the dtype, or the wire dtype has a
    numpy type of its own."""
    torch = torch_module() if wire in TORCH_ONLY else None
    dtype = getattr(torch, TORCH_ONLY[wire], None) if torch is not None else None
    if dtype is None:
        return None
    signed = a.view({2: "int16", 1: "int8"}[a.dtype.itemsize])  # types every torch takes
    return torch.from_numpy(signed).view(dtype)
