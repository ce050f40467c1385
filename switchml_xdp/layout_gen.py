"""Generate switchml_xdp/_layout.py: the byte layouts of the C headers (xdp/
swml_wire.h, swml_maps.h, lab/swml_loss.h, and the user-space data plane's
tables), as the C compiler lays them out, and the numbers the worker engine
shares with Python (worker/engine_policy.h).

The C compiler is the only faithful reader of C, so nothing here evaluates C:
this module writes a small C program that includes the sources, and the
compiler's answers (sizeof, offsetof, element sizes, signedness, the values of
the SWML_* defines) become a Python literal. The only things read from the
text are names: which SWML_* defines and which structs a source declares, and
the field names of a struct body (the compiler rejects a wrong one), plus
whether a field's declared type is a __be* one (C cannot tell a typedef apart)
or a pointer (the user-space data plane's state holds the addresses of its
numpy tables).

Struct swml_slot depends on SWML_K. The program is compiled for k = 1 and 2,
every offset and size is stored as (base, per_k), and a third compile at
SWML_MAX_K checks that they really are linear in k.

Run by setup.py's build step, and lazily by switchml_xdp.layout when the
generated file is missing or its sources changed (an editable checkout).
Standard library only: setup.py imports this file by path.

    python -m switchml_xdp.layout_gen [OUT]     # default: next to this file
"""
from __future__ import annotations

import hashlib
import os
import pprint
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# (source relative to the checkout, structs to generate or None for all, export defines?)
SOURCES = (("xdp/swml_wire.h", None, True),
           ("xdp/swml_maps.h", None, True),
           ("xdp/lab/swml_loss.h", None, True),  # the lab's loss injector
           ("worker/engine_policy.h", None, True),  # retransmission timeouts and rules, spin
           ("worker/quant.h", None, True),  # the number formats' exponent range and headroom
           # The user-space data plane's tables (numpy arrays the C loop reads).
           ("switchml_xdp/switch/userspace_dp.c", ("us_job", "us_member", "us_state"), False))
GENERATOR = "switchml_xdp/layout_gen.py"
K_POINTS = (1, 2)  # two compiles give (base, per_k); a third checks linearity

_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(SWML_\w+)[ \t]+\S", re.M)
_STRUCT = re.compile(r"\bstruct[ \t]+(\w+)[ \t\n]*\{(.*?)\}[^;]*;", re.S)
_DECL = re.compile(r"^(?P<type>.*?)\b(?P<name>\w+)\s*(?P<dims>(?:\[[^\]]*\]\s*)*)$", re.S)


class LayoutError(RuntimeError):
    """The layout could not be generated (no compiler, a header it cannot read)."""


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)


def _fields(body: str) -> list[tuple[str, str, int]]:
    """(name, declared type, number of array dimensions) of each field."""
    out = []
    for decl in _strip_comments(body).split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        if "," in decl or ":" in decl:  # offsetof cannot measure a bitfield; one name a line
            raise LayoutError(f"write one plain field a declaration, not {decl!r}")
        m = _DECL.match(decl)
        if not m or "(" in decl or decl.count("*") > 1:
            raise LayoutError(f"cannot name the field in {decl!r}")
        out.append((m["name"], m["type"].strip(), m["dims"].count("[")))
    return out


def scan(paths: dict[str, Path]) -> tuple[dict[str, list[str]], dict[str, list]]:
    """Names only: the SWML_* defines of each exporting source, and the fields of
    each wanted struct."""
    defines, structs = {}, {}
    for rel, wanted, export in SOURCES:
        text = paths[rel].read_text()
        if export:
            defines[Path(rel).name] = list(dict.fromkeys(_DEFINE.findall(text)))
        for name, body in _STRUCT.findall(_strip_comments(text)):
            if wanted is None or name in wanted:
                structs[name] = _fields(body)
    return defines, structs


def _c_program(paths: dict[str, Path], defines: dict[str, list[str]], structs: dict[str, list]) -> str:
    # _GNU_SOURCE first: userspace_dp.c needs it before any system header.
    lines = ["#define _GNU_SOURCE", "#include <stddef.h>", "#include <stdio.h>", "#include <linux/types.h>",
             "#include <linux/bpf.h>"]
    lines += [f'#include "{paths[rel]}"' for rel, _, _ in SOURCES]
    lines += ["#define SIGNED(x) (((__typeof__(x))-1) < 0)", "int main(void) {"]
    for header, names in defines.items():
        for n in names:
            lines.append(f'printf("D {header} {n} %lld\\n", (long long)({n}));')
    for s, fields in structs.items():
        lines.append(f'printf("S {s} %zu\\n", sizeof(struct {s}));')
        for name, ctype, ndims in fields:
            ref = f"((struct {s} *)0)->{name}"
            sizes = " ".join(["%zu"] * (ndims + 1))
            args = ", ".join(f"sizeof({ref}{'[0]' * i})" for i in range(ndims + 1))
            elem = f"{ref}{'[0]' * ndims}"
            opaque = ctype.startswith("struct ") or ctype.endswith("*")
            signed = "0" if opaque else f"(SIGNED({elem}) ? 1 : 0)"
            lines.append(f'printf("F {s} {name} %zu %d {sizes}\\n", offsetof(struct {s}, {name}), '
                         f"{signed}, {args});")
    lines += ["return 0;", "}"]
    return "\n".join(lines) + "\n"


def _ask_compiler(program: str, k: int, include: Path) -> str:
    cc = os.environ.get("CC", "cc")
    with tempfile.TemporaryDirectory(prefix="swml-layout-") as tmp:
        src, exe = Path(tmp, "layout.c"), Path(tmp, "layout")
        src.write_text(program)
        argv = [cc, "-std=gnu11", "-w", f"-DSWML_K={k}", f"-I{include}", "-o", str(exe), str(src)]
        try:
            r = subprocess.run(argv, capture_output=True, text=True)
        except FileNotFoundError:
            raise LayoutError(f"no C compiler ({cc}) to read the headers (Debian package gcc)") from None
        if r.returncode != 0:
            raise LayoutError(f"the headers do not compile: {r.stderr.strip()[-1500:]}")
        return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


def _parse(out: str):
    defines, sizes, fields = {}, {}, {}
    for line in out.splitlines():
        tag, *rest = line.split()
        if tag == "D":
            defines.setdefault(rest[0], {})[rest[1]] = int(rest[2])
        elif tag == "S":
            sizes[rest[0]] = int(rest[1])
        else:  # F struct field offset signed size [sizes of sub-arrays ...]
            s, name, off, signed, *nested = rest
            fields.setdefault(s, []).append((name, int(off), int(signed), [int(n) for n in nested]))
    return defines, sizes, fields


def _linear(a: int, b: int) -> tuple[int, int]:
    """(base, per_k) of a quantity that is `a` at k = 1 and `b` at k = 2."""
    return (2 * a - b, b - a)


def _at(lin: tuple[int, int], k: int) -> int:
    return lin[0] + lin[1] * k


def compiler_view(top: Path, k: int):
    """What the compiler says at SWML_K = k: (defines by header, sizeof by struct,
    [(field, offset, signed, [sizeof f, sizeof f[0], ...])] by struct)."""
    paths = {rel: top / rel for rel, _, _ in SOURCES}
    return _parse(_ask_compiler(_c_program(paths, *scan(paths)), k, top / "xdp"))


def generate(top: Path) -> str:
    """The text of _layout.py for the checkout (or sdist) rooted at `top`."""
    paths = {rel: top / rel for rel, _, _ in SOURCES}
    _, structs = scan(paths)
    runs = [compiler_view(top, k) for k in K_POINTS]
    values, sizes1, fields1 = runs[0]
    _, sizes2, fields2 = runs[1]
    layout = {}
    for s, decls in structs.items():
        types = {name: ctype for name, ctype, _ in decls}
        out_fields = []
        for (name, off1, signed, n1), (_, off2, _, n2) in zip(fields1[s], fields2[s]):
            elem = n1[-1]
            # Dimensions: sizeof(f[0]..)/sizeof(f[0][0]..), linear in k like the rest.
            dims1 = [n1[i] // n1[i + 1] for i in range(len(n1) - 1)]
            dims2 = [n2[i] // n2[i + 1] for i in range(len(n2) - 1)]
            kind = ("pointer" if types[name].endswith("*")
                    else "bytes" if types[name].startswith("struct ")
                    else "be" if re.search(r"\b__be(16|32|64)\b", types[name]) else "native")
            out_fields.append({"name": name, "offset": _linear(off1, off2), "elem": elem,
                               "signed": bool(signed), "order": kind,
                               "dims": [_linear(a, b) for a, b in zip(dims1, dims2)]})
        layout[s] = {"size": _linear(sizes1[s], sizes2[s]), "fields": out_fields}
    max_k = values["swml_wire.h"]["SWML_MAX_K"]
    _check_linear(layout, compiler_view(top, max_k), max_k)
    # The generator is a source too: a change to it (a header added) regenerates.
    paths[GENERATOR] = top / GENERATOR
    digests = {rel: hashlib.sha256(p.read_bytes()).hexdigest() for rel, p in paths.items()}
    return ('"""Generated by switchml_xdp/layout_gen.py from the C compiler\'s reading of\n'
            + ", ".join(rel for rel, _, _ in SOURCES) + '. Do not edit."""\n'
            + f"SOURCES = {pprint.pformat(digests, width=100)}\n"
            + f"DEFINES = {pprint.pformat(values, width=100)}\n"
            + f"STRUCTS = {pprint.pformat(layout, width=100, sort_dicts=False)}\n")


def _check_linear(layout: dict, run, k: int) -> None:
    _, sizes, fields = run
    for s, lay in layout.items():
        if _at(lay["size"], k) != sizes[s]:
            raise LayoutError(f"sizeof(struct {s}) is not linear in SWML_K")
        for f, (_, off, _, _) in zip(lay["fields"], fields[s]):
            if _at(f["offset"], k) != off:
                raise LayoutError(f"offsetof(struct {s}, {f['name']}) is not linear in SWML_K")


def write(top: Path, out: Path) -> None:
    """Generate `out` from the checkout (or sdist) rooted at `top`."""
    save(generate(top), out)


def save(text: str, out: Path) -> None:
    """Replace `out` atomically (concurrent importers agree)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="._layout", suffix=".py", dir=out.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide an installed layout from other users
    os.replace(tmp, out)


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    write(here.parent, Path(sys.argv[1]) if len(sys.argv) > 1 else here / "_layout.py")
