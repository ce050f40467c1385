"""The byte layout of the project's C headers, for Python: defines, numpy dtypes
and ctypes structures, all from the module that generate.py writes with the C
compiler (the one reader of xdp/swml_wire.h, xdp/swml_maps.h and the others in
generate.HEADERS; nothing in Python writes a C layout down a second time).

`pip install` generates the module at build time (setup.py). In a checkout
(editable install, tests) it is generated here on first import, and again
whenever a header is newer than it; the write is an atomic rename, so
concurrent imports agree.
"""
from __future__ import annotations

import ast
import ctypes
import functools
from dataclasses import dataclass

import numpy as np

from .generate import GENERATED, PACKAGE, LayoutError, header_paths, write, xdp_dir

__all__ = ["LayoutError", "Field", "defines", "fields", "size", "numpy_dtype", "ctypes_struct",
           "xdp_dir", "load"]

_CTYPES = {"u1": ctypes.c_uint8, "i1": ctypes.c_int8, "u2": ctypes.c_uint16, "i2": ctypes.c_int16,
           "u4": ctypes.c_uint32, "i4": ctypes.c_int32, "u8": ctypes.c_uint64, "i8": ctypes.c_int64}


def _stale() -> bool:
    if not GENERATED.exists():
        return True
    if xdp_dir() == PACKAGE / "_xdp":
        return False  # an installed package: generated at build time, read-only from here
    built = GENERATED.stat().st_mtime
    return any(h.stat().st_mtime > built for h in header_paths())


@functools.cache
def load() -> dict:
    """The generated layout (regenerated first where it is missing or stale)."""
    if _stale():
        write()
    text = GENERATED.read_text()
    return ast.literal_eval(text.split("LAYOUT = ", 1)[1])


def defines(header: str) -> dict[str, int]:
    """The SWML_* defines of a header of generate.HEADERS ("swml_wire.h", "lab/swml_loss.h")."""
    return dict(load()["defines"][header])


@dataclass(frozen=True)
class Field:
    name: str
    offset: int
    kind: str            # numpy scalar format: "u4", "i1", ">u2" (a __be field), "V" (opaque)
    elem_size: int
    shape: tuple[int, ...]


def _at(linear: list[int], k: int | None, what: str) -> int:
    base, per_k = linear
    if per_k and k is None:
        raise LayoutError(f"{what} depends on SWML_K: give k")
    return base + per_k * (k or 0)


def _struct(name: str) -> dict:
    try:
        return load()["structs"][name]
    except KeyError:
        raise LayoutError(f"no struct {name} in the generated layout") from None


def size(name: str, k: int | None = None) -> int:
    """sizeof(struct name) (for SWML_K = k where it depends on it)."""
    return _at(_struct(name)["size"], k, f"sizeof(struct {name})")


def fields(name: str, k: int | None = None) -> list[Field]:
    return [Field(f["name"], _at(f["offset"], k, f"{name}.{f['name']}"), f["kind"], f["elem_size"],
                  tuple(_at(d, k, f"{name}.{f['name']}") for d in f["dims"]))
            for f in _struct(name)["fields"]]


@functools.cache
def numpy_dtype(name: str, k: int | None = None, *, raw_be: bool = False) -> np.dtype:
    """struct name as a numpy dtype with the compiler's offsets and size. Big-endian
    fields read as big-endian numbers, or with raw_be as the host-order integer of
    their bytes (what wire.ip_to_be32 gives: how the maps' control code holds them)."""
    def fmt(f: Field) -> str:
        if f.kind == "V":
            return f"V{f.elem_size}"
        return "=" + f.kind[1:] if raw_be and f.kind.startswith(">") else f.kind

    fs = fields(name, k)
    return np.dtype({"names": [f.name for f in fs], "formats": [(fmt(f), f.shape) for f in fs],
                     "offsets": [f.offset for f in fs], "itemsize": size(name, k)})


@functools.cache
def ctypes_struct(name: str, k: int | None = None) -> type[ctypes.Structure]:
    """struct name as a ctypes structure, byte for byte the compiler's (explicit
    padding, packed). Big-endian fields hold the host-order integer of their
    bytes (wire.ip_to_be32, port_to_be16); opaque fields (a bpf_spin_lock) are bytes."""
    out, pos = [], 0
    for f in fields(name, k):
        if f.offset > pos:
            out.append((f"_pad{len(out)}", ctypes.c_uint8 * (f.offset - pos)))
        ctype = ctypes.c_uint8 * f.elem_size if f.kind == "V" else _CTYPES[f.kind.lstrip(">")]
        for dim in reversed(f.shape):
            ctype = ctype * dim
        out.append((f.name, ctype))
        pos = f.offset + ctypes.sizeof(ctype)
    total = size(name, k)
    if total > pos:
        out.append((f"_pad{len(out)}", ctypes.c_uint8 * (total - pos)))
    cls = type(name, (ctypes.Structure,), {"_pack_": 1, "_layout_": "ms", "_fields_": out})
    assert ctypes.sizeof(cls) == total, f"ctypes and the compiler disagree on struct {name}"
    return cls
