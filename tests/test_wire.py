"""The generated layout (switchml_xdp.layout) against the C compiler, and the
wire module built from it.

The compiler check here is written apart from the generator: it includes the
headers with the kernel's own <linux/types.h> and <linux/bpf.h> (not the
generator's stand-in types) and compares every define, size and offset.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from switchml_xdp import layout, wire
from switchml_xdp.layout import generate

TOP = Path(__file__).resolve().parent.parent
K_VALUES = (1, 7, 256, wire.MAX_K)


def _cc() -> str:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    return cc


def compiler_says(tmp_path: Path, k: int) -> dict[str, int]:
    """'NAME' -> value of every define, 'sizeof S' and 'S.f' -> offset, with the real kernel types."""
    lay = layout.load()
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <linux/types.h>",
             "#include <linux/bpf.h>"]
    lines += [f'#include "{h}"' for h in generate.header_paths()]
    lines.append("int main(void) {")
    for header in lay["defines"].values():
        for name in header:
            lines.append(f'printf("{name} %lld\\n", (long long)({name}));')
    for s, info in lay["structs"].items():
        lines.append(f'printf("sizeof {s} %zu\\n", sizeof(struct {s}));')
        for f in info["fields"]:
            lines.append(f'printf("{s}.{f["name"]} %zu\\n", offsetof(struct {s}, {f["name"]}));')
    lines.append("return 0; }")
    src, exe = tmp_path / f"check{k}.c", tmp_path / f"check{k}"
    src.write_text("\n".join(lines))
    subprocess.run([_cc(), "-Wall", "-Werror", f"-DSWML_K={k}", "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {key: int(value) for key, value in (line.rsplit(" ", 1) for line in out.splitlines())}


@pytest.mark.parametrize("k", K_VALUES)
def test_sizes_and_offsets_are_the_compilers(tmp_path, k):
    said = compiler_says(tmp_path, k)
    for s in layout.load()["structs"]:
        assert layout.size(s, k) == said[f"sizeof {s}"], s
        for f in layout.fields(s, k):
            assert f.offset == said[f"{s}.{f.name}"], f"{s}.{f.name}"
    slot = {f.name: f for f in layout.fields("swml_slot", k)}
    assert slot["vals"].shape == (2, k)


def test_defines_are_the_compilers(tmp_path):
    said = compiler_says(tmp_path, 1)
    lay = layout.load()
    assert lay["defines"]["swml_wire.h"] and lay["defines"]["lab/swml_loss.h"]
    for defines in lay["defines"].values():
        for name, value in defines.items():
            assert value & 0xFFFFFFFFFFFFFFFF == said[name] & 0xFFFFFFFFFFFFFFFF, name
    assert wire.DEFAULT_PORT == 48864 and wire.HDR_LEN == 16 and wire.MAX_K == 364
    assert layout.defines("lab/swml_loss.h")["SWML_LOSS_ALWAYS"] == 0xFFFFFFFF


def test_counter_names_follow_the_rows():
    assert len(wire.COUNTER_NAMES) == wire.CNT_NUM
    for i, name in enumerate(wire.COUNTER_NAMES):
        assert getattr(wire, f"CNT_{name.upper()}") == i
    assert wire.DROP_REASONS[0] == "truncated" and wire.DROP_REASONS[-1] == "bad_count"


def test_big_endian_fields_are_marked():
    kinds = {f.name: f.kind for f in layout.fields("swml_hdr")}
    assert kinds == {"ver_type": "u1", "flags": "u1", "job": ">u2", "rank": ">u2", "slot": ">u2",
                     "seq": ">u4", "exp": "i1", "reserved": "u1", "count": ">u2"}
    assert {f.name: f.kind for f in layout.fields("swml_member")}["ip"] == ">u4"


@pytest.mark.parametrize("name,k", [("swml_hdr", None), ("swml_job", None), ("swml_member", None),
                                    ("swml_slot", 1), ("swml_slot", 256), ("swml_loss_counters", None),
                                    ("us_job", None), ("us_member", None)])
def test_numpy_and_ctypes_builds_agree_with_the_layout(name, k):
    dt, raw, cls = layout.numpy_dtype(name, k), layout.numpy_dtype(name, k, raw_be=True), \
        layout.ctypes_struct(name, k)
    assert dt.itemsize == raw.itemsize == ctypes.sizeof(cls) == layout.size(name, k)
    for f in layout.fields(name, k):
        assert dt.fields[f.name][1] == raw.fields[f.name][1] == getattr(cls, f.name).offset == f.offset


def test_a_struct_that_depends_on_k_needs_k():
    with pytest.raises(layout.LayoutError, match="SWML_K"):
        layout.size("swml_slot")


def test_header_round_trip_in_network_order():
    values = np.arange(wire.DEFAULT_K, dtype=np.int32)
    d = wire.datagram(wire.TYPE_DATA, 0x0102, 3, 0x0405, 0x06070809, values, flags=wire.FLAG_RETRANS, exp=-2)
    assert d[:wire.HDR_LEN] == struct.pack(wire.HDR_FORMAT, wire.ver_type(wire.TYPE_DATA), wire.FLAG_RETRANS,
                                           0x0102, 3, 0x0405, 0x06070809, -2, 0, wire.DEFAULT_K)
    assert d[2:4] == b"\x01\x02"  # job, big-endian
    h = wire.unpack_header(d)
    assert (int(h["job"]), int(h["seq"]), int(h["exp"]), int(h["count"])) == (0x0102, 0x06070809, -2, 256)
    assert np.array_equal(np.frombuffer(d, "<i4", offset=wire.HDR_LEN), values)


def test_no_hand_written_header_format_is_left():
    hits = [str(p) for d in ("switchml_xdp", "tests") for p in (TOP / d).rglob("*.py")
            if "BBHHHI" in p.read_text() and p.name != "test_wire.py"]
    assert not hits


def test_the_generator_refuses_what_it_cannot_measure(tmp_path):
    h = tmp_path / "bits.h"
    h.write_text("struct swml_bits { __u32 a:3; __u32 b:29; };\n")
    with pytest.raises(generate.LayoutError, match="one plain field"):
        generate.struct_fields([h])


# --------------------------------------------------- generated where it is needed

def _copy_tree(dest: Path) -> Path:
    """The package and the files a build needs, without any generated layout."""
    ignore = shutil.ignore_patterns("__pycache__", "_generated.py", "*.so", "*.egg-info")
    for d in ("switchml_xdp", "xdp", "worker"):
        shutil.copytree(TOP / d, dest / d, ignore=ignore)
    for f in ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md"):
        shutil.copy2(TOP / f, dest / f)
    return dest


def _import_slots(tree: Path) -> subprocess.Popen:
    code = "from switchml_xdp import wire; print(wire.DEFAULT_SLOTS)"
    return subprocess.Popen([sys.executable, "-c", code], cwd=tree, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(tree)})


def test_a_checkout_generates_at_import_and_again_when_a_header_is_newer(tmp_path):
    tree = _copy_tree(tmp_path)
    generated = tree / "switchml_xdp" / "layout" / "_generated.py"
    procs = [_import_slots(tree) for _ in range(4)]  # concurrent first imports agree
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    assert {out.strip() for out, _ in outs} == {str(wire.DEFAULT_SLOTS)}
    assert generated.exists() and not list(generated.parent.glob("*.tmp"))

    header = tree / "xdp" / "swml_wire.h"
    header.write_text(header.read_text().replace(f"SWML_DEFAULT_SLOTS {wire.DEFAULT_SLOTS}",
                                                 "SWML_DEFAULT_SLOTS 77"))
    later = time.time() + 5
    os.utime(header, (later, later))
    out, err = _import_slots(tree).communicate(timeout=120)
    assert out.strip() == "77", err


def test_a_built_wheel_ships_the_generated_layout(tmp_path):
    tree = _copy_tree(tmp_path / "src")
    env = {**os.environ, "SWML_SKIP_ENGINE": "1"}
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(tree), "-w", str(tmp_path / "dist"),
                        "--no-deps", "--no-build-isolation", "-q", "--disable-pip-version-check"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        text = z.read("switchml_xdp/layout/_generated.py").decode()
    assert {"switchml_xdp/_xdp/swml_wire.h", "switchml_xdp/_xdp/lab/swml_loss.h",
            "switchml_xdp/switch/userspace_dp.h"} <= names
    shipped = __import__("ast").literal_eval(text.split("LAYOUT = ", 1)[1])
    assert shipped == layout.load()
