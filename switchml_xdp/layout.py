"""The byte layouts of the C headers, as the C compiler lays them out.

switchml_xdp/_layout.py is generated (layout_gen.py: setup.py's build step, or
here on import when it is missing or older than its sources, as in an editable
checkout after a header changed). This module turns it into what Python code
uses: the SWML_* defines, numpy dtypes, ctypes structures and struct formats.
Nothing in Python writes a byte layout by hand.

A struct whose size depends on SWML_K (swml_slot) is generated as offsets
linear in k: pass `k` to get it for a given k.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import types
from functools import cache
from pathlib import Path

import numpy as np

from . import layout_gen

_HERE = Path(__file__).resolve().parent


def xdp_dir() -> Path:
    """Where the BPF sources are: the checkout's xdp/ (editable install, tests)
    or the copy that setup.py puts in the installed package."""
    for cand in (_HERE.parent / "xdp", _HERE / "_xdp"):
        if (cand / "swml_wire.h").exists():
            return cand
    raise FileNotFoundError("xdp/swml_wire.h not found next to the switchml_xdp package")


def _is_stale(gen) -> bool:
    """Whether a checkout's sources differ from what `gen` was made from (an
    installed package without its sources is taken as it is)."""
    if layout_gen.GENERATOR not in gen.SOURCES:
        return True  # made by a generator that did not record itself
    for rel, digest in gen.SOURCES.items():
        path = _HERE.parent / rel
        if path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            return True
    return False


def _load():
    # By path, not by name: the file next to this module, never another copy
    # of the package that an import finder (an editable install's) maps the name to.
    path = _HERE / "_layout.py"
    spec = importlib.util.spec_from_file_location("switchml_xdp._layout", path)
    gen = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(gen)
        if not _is_stale(gen):
            return gen
    except FileNotFoundError:
        pass
    # A checkout whose layout is missing or stale: regenerate, and keep the file
    # for the next import where the checkout is writable (not for every user).
    text = layout_gen.generate(_HERE.parent)
    with contextlib.suppress(OSError):
        layout_gen.save(text, _HERE / "_layout.py")
    gen = types.ModuleType("switchml_xdp._layout")
    exec(compile(text, str(_HERE / "_layout.py"), "exec"), gen.__dict__)
    return gen


_GEN = _load()
#: SWML_* defines by header name: DEFINES["swml_wire.h"]["SWML_VERSION"].
DEFINES: dict[str, dict[str, int]] = _GEN.DEFINES


def _at(lin: tuple[int, int], k: int | None, struct: str) -> int:
    base, per_k = lin
    if per_k and k is None:
        raise ValueError(f"struct {struct} depends on SWML_K: pass k")
    return base + per_k * (k or 0)


def _fields(struct: str, k: int | None):
    """(name, offset, elem size, signed, order, dims) of each field, for this k."""
    lay = _GEN.STRUCTS[struct]
    for f in lay["fields"]:
        yield (f["name"], _at(f["offset"], k, struct), f["elem"], f["signed"], f["order"],
               tuple(_at(d, k, struct) for d in f["dims"]))


def sizeof(struct: str, k: int | None = None) -> int:
    return _at(_GEN.STRUCTS[struct]["size"], k, struct)


@cache
def dtype(struct: str, k: int | None = None) -> np.dtype:
    """numpy dtype of `struct`: __be* fields big-endian, the rest native, padding
    where the compiler put it, opaque structs (bpf_spin_lock) as raw bytes."""
    names, formats, offsets = [], [], []
    for name, off, elem, signed, order, dims in _fields(struct, k):
        if order == "bytes":
            fmt = np.dtype(f"V{elem}")
        elif order == "pointer":
            fmt = np.dtype(f"=u{elem}")
        else:
            fmt = np.dtype(f"{'>' if order == 'be' else '='}{'i' if signed else 'u'}{elem}")
        names.append(name)
        formats.append((fmt, dims) if dims else fmt)
        offsets.append(off)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": sizeof(struct, k)})


_CTYPES = {(1, False): ctypes.c_uint8, (1, True): ctypes.c_int8, (2, False): ctypes.c_uint16,
           (2, True): ctypes.c_int16, (4, False): ctypes.c_uint32, (4, True): ctypes.c_int32,
           (8, False): ctypes.c_uint64, (8, True): ctypes.c_int64}


@cache
def ctype(struct: str, k: int | None = None) -> type[ctypes.Structure]:
    """ctypes structure of `struct` (BPF map values). Byte order is not
    converted: a __be* field reads as the raw integer (wire.ip_to_be32 writes
    one); opaque structs (bpf_spin_lock) are bytes, pointers c_void_p."""
    fields, end = [], 0
    for name, off, elem, signed, order, dims in _fields(struct, k):
        if off > end:
            fields.append((f"_pad{end}", ctypes.c_uint8 * (off - end)))
        t = (ctypes.c_uint8 * elem if order == "bytes" else ctypes.c_void_p if order == "pointer"
             else _CTYPES[elem, signed])
        for d in reversed(dims):
            t = t * d
        fields.append((name, t))
        end = off + ctypes.sizeof(t)
    size = sizeof(struct, k)
    if size > end:
        fields.append((f"_pad{end}", ctypes.c_uint8 * (size - end)))
    cls = type(struct, (ctypes.Structure,), {"_pack_": 1, "_fields_": fields})
    assert ctypes.sizeof(cls) == size, struct
    return cls


def struct_format(struct: str) -> str:
    """A `struct` module format for a struct whose multi-byte fields are all
    __be* and that has no arrays (the wire header): "!BBHHHIbBH"."""
    out, end = "!", 0
    for name, off, elem, signed, order, dims in _fields(struct, None):
        if dims or order == "bytes" or (elem > 1 and order != "be"):
            raise ValueError(f"struct {struct}: field {name} has no network-order format")
        code = {1: "b", 2: "h", 4: "i", 8: "q"}[elem]
        out += "x" * (off - end) + (code if signed else code.upper())
        end = off + elem
    return out + "x" * (sizeof(struct) - end)
