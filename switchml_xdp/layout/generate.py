"""Generate the Python layout of the project's C headers with the C compiler.

    python -m switchml_xdp.layout.generate [--out FILE]

The compiler is the only reader of the numbers: a small C program includes the
headers (HEADERS) and prints every SWML_* define's value, every struct's size
and alignment, and each field's offset, size, element type and array bounds.
Python reads only names: the define names from `cc -dM -E`, the struct and
field names from the preprocessed headers (comments gone, macros expanded), so
a name it misreads fails to compile instead of giving a wrong layout.

Element types come from C11 _Generic. The kernel's __be16/__be32 are plain
integer typedefs to a compiler, so the program declares them as one-member
structs (same size and alignment as the integer): then _Generic tells them
apart and the layout records which fields are big-endian on the wire.

struct swml_slot holds SWML_K elements a packet, a load-time define. The
program is compiled for K = 1, 2 and 3 and every size and offset is written as
`base + per_k * K`; the generator fails if the third point is off that line.

Only the standard library: setup.py runs this file before the package exists.
"""
from __future__ import annotations

import argparse
import os
import pprint
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent
#: The headers read: (folder, path in it); "xdp" is xdp_dir(), "pkg" the package.
HEADERS = (("xdp", "swml_wire.h"), ("xdp", "swml_maps.h"), ("xdp", "lab/swml_loss.h"),
           ("pkg", "switch/userspace_dp.h"))
K_POINTS = (1, 2, 3)
GENERATED = PACKAGE / "layout" / "_generated.py"

# The kernel's fixed-width types; big-endian ones as distinct one-member structs.
PROLOGUE = r"""
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
typedef uint8_t __u8; typedef int8_t __s8; typedef uint16_t __u16; typedef int16_t __s16;
typedef uint32_t __u32; typedef int32_t __s32; typedef uint64_t __u64; typedef int64_t __s64;
typedef struct { uint16_t v; } __be16;
typedef struct { uint32_t v; } __be32;
typedef struct { uint64_t v; } __be64;
struct bpf_spin_lock { uint32_t val; };
#define KIND(x) _Generic((x), uint8_t: "u1", int8_t: "i1", uint16_t: "u2", int16_t: "i2", \
    uint32_t: "u4", int32_t: "i4", uint64_t: "u8", int64_t: "i8", \
    __be16: ">u2", __be32: ">u4", __be64: ">u8", default: "V")
#define VALUE(x) ((x) < 0 ? printf("%lld", (long long)(x)) : printf("%llu", (unsigned long long)(x)))
"""


class LayoutError(RuntimeError):
    """The headers could not be compiled or read (one line)."""


def xdp_dir() -> Path:
    """Where the BPF sources are: the checkout's xdp/ (editable install, tests)
    or the copy that setup.py puts in the installed package."""
    for cand in (PACKAGE.parent / "xdp", PACKAGE / "_xdp"):
        if (cand / "swml_wire.h").exists():
            return cand
    raise FileNotFoundError("xdp/swml_wire.h not found next to the switchml_xdp package")


def header_paths(xdp: Path | None = None, package: Path = PACKAGE) -> list[Path]:
    xdp = xdp or xdp_dir()
    return [(xdp if where == "xdp" else package) / rel for where, rel in HEADERS]


def _cc() -> str:
    return os.environ.get("CC", "cc")


def _run(argv: list[str], what: str) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True)
    except FileNotFoundError:
        raise LayoutError(f"no C compiler ({argv[0]}) to read the headers (Debian package gcc)") from None
    if r.returncode != 0:
        raise LayoutError(f"{what}: {r.stderr.strip()[-2000:]}")
    return r.stdout


def _includes(headers: list[Path]) -> str:
    return "".join(f'#include "{h}"\n' for h in headers)


def _preprocess(headers: list[Path], k: int, macros: bool) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "layout.c"
        src.write_text(PROLOGUE + _includes(headers))
        flags = ["-dM"] if macros else ["-P"]
        return _run([_cc(), "-E", *flags, f"-DSWML_K={k}", str(src)], "cannot preprocess the headers")


def define_names(header: Path) -> list[str]:
    """The SWML_* object-like macros with a value that `header` defines (not
    its include guard, not SWML_K)."""
    names = []
    for line in _preprocess([header], 1, macros=True).splitlines():
        m = re.match(r"#define (SWML_\w+) (.+)$", line)
        if m and m.group(1) != "SWML_K":
            names.append(m.group(1))
    return sorted(names)


def struct_fields(headers: list[Path]) -> dict[str, list[tuple[str, int]]]:
    """struct name -> [(field, array rank)] of the structs the headers declare."""
    own = "".join(h.read_text() for h in headers)
    text = _preprocess(headers, 1, macros=False)
    out = {}
    for m in re.finditer(r"\bstruct\s+(\w+)\s*\{([^{}]*)\}", text):
        if not re.search(rf"\bstruct\s+{m.group(1)}\s*\{{", own):
            continue  # the prologue's or a system header's
        fields = []
        for decl in m.group(2).split(";"):
            decl = re.sub(r"__attribute__\s*\(\(.*?\)\)", "", decl).strip()
            if not decl:
                continue
            if ":" in decl or "," in decl:
                raise LayoutError(f"struct {m.group(1)}: write one plain field a line, not {decl!r}")
            name = re.findall(r"(\w+)\s*(?:\[|$)", decl)[0]
            fields.append((name, decl.count("[")))
        out[m.group(1)] = fields
    return out


def _program(defines: list[str], structs: dict[str, list[tuple[str, int]]], headers: list[Path]) -> str:
    lines = [PROLOGUE, _includes(headers), "int main(void) {"]
    for name in defines:
        lines.append(f'printf("D\\t{name}\\t"); VALUE({name}); printf("\\n");')
    for s, fields in structs.items():
        lines.append(f'printf("S\\t{s}\\t%zu\\t%zu\\n", sizeof(struct {s}), _Alignof(struct {s}));')
        for f, rank in fields:
            elem = f"x.{f}" + "[0]" * rank
            dims = "".join(f'printf("\\t%zu", sizeof(x.{f}{"[0]" * i}) / sizeof(x.{f}{"[0]" * (i + 1)}));'
                           for i in range(rank))
            lines.append(f'{{ struct {s} x; printf("F\\t{s}\\t{f}\\t%zu\\t%s\\t%zu", '
                         f'offsetof(struct {s}, {f}), KIND({elem}), sizeof({elem})); {dims} printf("\\n"); }}')
    lines.append("return 0; }")
    return "\n".join(lines)


def _measure(program: str, k: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "layout.c", Path(tmp) / "layout"
        src.write_text(program)
        _run([_cc(), "-std=gnu11", "-Wall", "-Werror", f"-DSWML_K={k}", "-o", str(exe), str(src)],
             "cannot compile the layout program")
        out = _run([str(exe)], "the layout program failed")
    defines, structs = {}, {}
    for line in out.splitlines():
        tag, *rest = line.split("\t")
        if tag == "D":
            defines[rest[0]] = int(rest[1])
        elif tag == "S":
            structs[rest[0]] = {"size": int(rest[1]), "align": int(rest[2]), "fields": []}
        else:
            s, name, offset, kind, elem_size, *dims = rest
            structs[s]["fields"].append({"name": name, "offset": int(offset), "kind": kind,
                                         "elem_size": int(elem_size), "dims": [int(d) for d in dims]})
    return {"defines": defines, "structs": structs}


def _linear(values: list[int], what: str) -> list[int]:
    """[base, per_k] of a quantity measured at K_POINTS."""
    per_k = values[1] - values[0]
    base = values[0] - per_k * K_POINTS[0]
    if any(base + per_k * k != v for k, v in zip(K_POINTS, values)):
        raise LayoutError(f"{what} is not linear in SWML_K ({values} at K={K_POINTS})")
    return [base, per_k]


def measure(xdp: Path | None = None, package: Path = PACKAGE) -> dict:
    """The layout of the headers, as the generated module holds it."""
    headers = header_paths(xdp, package)
    names = {rel: define_names(h) for (_, rel), h in zip(HEADERS, headers)}
    program = _program(sorted({n for ns in names.values() for n in ns}), struct_fields(headers), headers)
    points = [_measure(program, k) for k in K_POINTS]
    first = points[0]
    structs = {}
    for s, info in first["structs"].items():
        at = [p["structs"][s] for p in points]
        fields = []
        for i, f in enumerate(info["fields"]):
            fs = [a["fields"][i] for a in at]
            fields.append({"name": f["name"], "kind": f["kind"], "elem_size": f["elem_size"],
                           "offset": _linear([x["offset"] for x in fs], f"{s}.{f['name']} offset"),
                           "dims": [_linear([x["dims"][d] for x in fs], f"{s}.{f['name']} bound")
                                    for d in range(len(f["dims"]))]})
        structs[s] = {"size": _linear([a["size"] for a in at], f"sizeof {s}"),
                      "align": info["align"], "fields": fields}
    defines = {rel: {n: first["defines"][n] for n in ns} for rel, ns in names.items()}
    return {"headers": [rel for _, rel in HEADERS], "defines": defines, "structs": structs}


def render(layout: dict) -> str:
    body = pprint.pformat(layout, width=110, sort_dicts=False)
    return ('"""The layout of the C headers, generated by `python -m switchml_xdp.layout.generate`\n'
            'from what the C compiler says. Do not edit; sizes and offsets are [base, per SWML_K]."""\n'
            f"LAYOUT = {body}\n")


def write(out: Path = GENERATED, xdp: Path | None = None, package: Path = PACKAGE) -> Path:
    """Generate and write atomically (concurrent generators agree on the result)."""
    text = render(measure(xdp, package))
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".py.tmp", dir=out.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=GENERATED, help="module to write")
    ap.add_argument("--xdp", type=Path, default=None, help="the xdp/ folder (default: found)")
    args = ap.parse_args(argv)
    try:
        print(write(args.out, args.xdp))
    except LayoutError as e:
        print(f"switchml-xdp layout: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
