"""Read facts out of the project's C headers, so Python never keeps a second copy.

The headers in xdp/ are written in a restricted style: every constant a
`#define NAME VALUE` line, every struct field on a line of its own. This module
parses exactly that style into a dict of defines and ctypes structures.
"""
from __future__ import annotations

import ctypes
import re
from functools import lru_cache
from pathlib import Path

_DEFINE = re.compile(r"^#define\s+(SWML_\w+)\s+(.+?)\s*(?:/\*.*)?$")
_STRUCT = re.compile(r"struct\s+(\w+)\s*\{(.*?)\}\s*(__attribute__\(\(packed\)\))?\s*;", re.S)
_FIELD = re.compile(r"^\s*(struct\s+\w+|\w+)\s+(\w+)((?:\[\w+\])*)\s*;")

_CTYPES = {
    "__u8": ctypes.c_uint8, "__s8": ctypes.c_int8,
    "__u16": ctypes.c_uint16, "__be16": ctypes.c_uint16, "__s16": ctypes.c_int16,
    "__u32": ctypes.c_uint32, "__be32": ctypes.c_uint32, "__s32": ctypes.c_int32,
    "__u64": ctypes.c_uint64, "__s64": ctypes.c_int64,
    "struct bpf_spin_lock": ctypes.c_uint32,
}


def xdp_dir() -> Path:
    """Where the BPF sources are: the checkout's xdp/ (editable install, tests)
    or the copy that setup.py puts in the installed package."""
    here = Path(__file__).resolve().parent
    for cand in (here.parent / "xdp", here / "_xdp"):
        if (cand / "swml_wire.h").exists():
            return cand
    raise FileNotFoundError("xdp/swml_wire.h not found next to the switchml_xdp package")


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)


@lru_cache(maxsize=None)
def defines(header: str = "swml_wire.h") -> dict[str, int]:
    """Integer #defines named SWML_* of an xdp/ header (expressions of earlier ones allowed)."""
    out: dict[str, int] = {}
    for line in (xdp_dir() / header).read_text().splitlines():
        m = _DEFINE.match(line.strip())
        if not m:
            continue
        expr = _strip_comments(m.group(2)).strip()
        if not re.fullmatch(r"[\w\s()+\-*/<>|&x]+", expr):
            continue  # not an integer expression (a string, a macro with args)
        try:
            out[m.group(1)] = int(eval(expr, {"__builtins__": {}}, dict(out)))  # noqa: S307 - our own header
        except (NameError, SyntaxError):
            continue
    return out


def structs(header: str, extra: dict[str, int] | None = None) -> dict[str, type[ctypes.Structure]]:
    """ctypes classes for the structs of an xdp/ header. `extra` supplies load-time
    defines (SWML_K) that array bounds refer to; a struct whose bound is unknown
    is left out. Byte order is not converted: __be fields read as raw integers."""
    text = (xdp_dir() / header).read_text()
    consts = {**defines("swml_wire.h"), **defines(header), **(extra or {})}
    # Honour #ifdef SWML_K blocks: drop them when SWML_K is not given.
    if "SWML_K" not in consts:
        text = re.sub(r"#ifdef SWML_K.*?#endif", "", text, flags=re.S)
    text = _strip_comments(text)
    out: dict[str, type[ctypes.Structure]] = {}
    for m in _STRUCT.finditer(text):
        name, body, packed = m.group(1), m.group(2), m.group(3)
        fields = []
        for line in body.splitlines():
            f = _FIELD.match(line)
            if not f:
                continue
            ctype = _CTYPES[re.sub(r"\s+", " ", f.group(1))]
            for dim in reversed(re.findall(r"\[(\w+)\]", f.group(3))):
                ctype = ctype * (int(dim) if dim.isdigit() else consts[dim])
            fields.append((f.group(2), ctype))
        attrs = {"_fields_": fields}
        if packed:
            attrs["_pack_"] = 1
        out[name] = type(name, (ctypes.Structure,), attrs)
    return out
