"""The Python layout (switchml_xdp.layout, generated from the C headers) is what
the C compiler says, for several k; the wire helpers agree with it."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest

from switchml_xdp import layout, layout_gen, wire

TOP = Path(layout_gen.__file__).resolve().parent.parent


def test_generated_layout_is_fresh():
    assert not layout._is_stale(layout._GEN), "switchml_xdp/_layout.py is older than its headers"


@pytest.mark.parametrize("k", [1, 3, wire.DEFAULT_K, wire.MAX_K])
def test_layout_is_the_compilers(k):
    defines, sizes, fields = layout_gen.compiler_view(TOP, k)
    assert defines == layout.DEFINES
    assert set(sizes) == {"swml_hdr", "swml_job", "swml_member", "swml_job_stats", "swml_slot",
                          "swml_port_stats", "swml_uplink", "swml_parent_route", "swml_job_pace",
                          "swml_fanout_meta", "us_job", "us_member", "us_state",
                          "swml_loss_cfg", "swml_loss_counters", "swml_loss_state"}
    for struct, size in sizes.items():
        dt, ct = layout.dtype(struct, k), layout.ctype(struct, k)
        assert dt.itemsize == ctypes.sizeof(ct) == size, struct
        for name, offset, _signed, nested in fields[struct]:
            assert dt.fields[name][1] == getattr(ct, name).offset == offset, (struct, name)
            assert dt.fields[name][0].itemsize == getattr(ct, name).size == nested[0], (struct, name)


def test_k_dependent_struct_needs_k():
    with pytest.raises(ValueError, match="SWML_K"):
        layout.dtype("swml_slot")


def test_header_dtype_and_struct_agree():
    packed = wire.pack_header(wire.TYPE_DATA, job=513, rank=7, slot=300, seq=2**32 - 2, count=256,
                              flags=wire.FLAG_RETRANS, exp=-3, key=0x0102030405060708,
                              tag=0xDEADBEEF, op=wire.OP_MAX, fmt=wire.FMT_INT32)
    assert len(packed) == wire.HDR_LEN == wire.HDR_STRUCT.size == 32
    assert wire.HDR_STRUCT.unpack(packed) == (wire.ver_type(wire.TYPE_DATA), wire.FLAG_RETRANS,
                                              wire.OP_MAX, wire.FMT_INT32, 513, 7, 300, 256,
                                              2**32 - 2, 0xDEADBEEF, -3, 0, 0, 0x0102030405060708)
    h = wire.unpack_header(packed)
    assert (h["job"], h["seq"], h["exp"], h["tag"]) == (513, 2**32 - 2, -3, 0xDEADBEEF)
    assert packed[4:6] == (513).to_bytes(2, "big")  # network byte order on the wire
    assert packed[24:] == bytes(range(1, 9))       # the key: 8 bytes as given
    assert wire.key_to_be64(0x0102030405060708).to_bytes(8, "little") == bytes(range(1, 9))


def test_counter_names_follow_the_header():
    assert wire.COUNTER_NAMES[wire.CNT_RX] == "rx"
    assert len(wire.COUNTER_NAMES) == wire.CNT_NUM
    assert wire.DROP_REASONS[0] == "truncated" and wire.DROP_REASONS[-2:] == ["stale", "busy"]
    assert {"bad_key", "bad_op", "stale"} <= set(wire.DROP_REASONS)
    assert not {"other_host", "disagreed", "passed"} & set(wire.DROP_REASONS)


def test_datagram_payload_is_little_endian_int32():
    d = wire.datagram(wire.TYPE_DATA, 1, 0, 0, 0, np.array([1, -1], np.int32))
    assert d[wire.HDR_LEN:] == b"\x01\x00\x00\x00\xff\xff\xff\xff"


def test_a_changed_header_makes_the_layout_stale():
    class Old:
        SOURCES = {**layout._GEN.SOURCES, "xdp/swml_wire.h": "0" * 64}
    assert layout._is_stale(Old)


# ---------------------------------------------- generated where it is needed

def _copy_tree(dest: Path) -> Path:
    """The files a build needs, without a generated layout or build outputs."""
    ignore = shutil.ignore_patterns("__pycache__", "_layout.py", "*.so", "*.egg-info")
    for d in ("switchml_xdp", "xdp", "worker"):
        shutil.copytree(TOP / d, dest / d, ignore=ignore)
    for f in ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md"):
        shutil.copy2(TOP / f, dest / f)
    return dest


def _import_default_slots(tree: Path) -> subprocess.Popen:
    code = "from switchml_xdp import wire; print(wire.DEFAULT_SLOTS)"
    return subprocess.Popen([sys.executable, "-c", code],
                            cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_checkout_generates_on_import_and_again_after_a_header_changed(tmp_path):
    tree = _copy_tree(tmp_path)
    procs = [_import_default_slots(tree) for _ in range(4)]  # concurrent first imports agree
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    assert {out.strip() for out, _ in outs} == {str(wire.DEFAULT_SLOTS)}
    assert (tree / "switchml_xdp" / "_layout.py").is_file()
    assert not [p.name for p in (tree / "switchml_xdp").glob("._layout*")]  # no temp file left

    header = tree / "xdp" / "swml_wire.h"
    text = header.read_text()
    header.write_text(text.replace(f"SWML_DEFAULT_SLOTS {wire.DEFAULT_SLOTS}", "SWML_DEFAULT_SLOTS 77"))
    out, err = _import_default_slots(tree).communicate(timeout=120)
    assert out.strip() == "77", err[-2000:]


def test_a_built_wheel_ships_the_generated_layout(tmp_path):
    tree = _copy_tree(tmp_path / "src")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(tree), "-w", str(tmp_path / "dist"),
                        "--no-deps", "--no-build-isolation", "-q", "--disable-pip-version-check"],
                       env={**os.environ, "SWML_SKIP_ENGINE": "1"}, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        shipped = z.read("switchml_xdp/_layout.py").decode()
    assert {"switchml_xdp/layout.py", "switchml_xdp/layout_gen.py", "switchml_xdp/_xdp/swml_wire.h",
            "switchml_xdp/_xdp/lab/swml_loss.h", "switchml_xdp/switch/userspace_dp.c"} <= names
    generated = types.ModuleType("shipped_layout")
    exec(compile(shipped, "_layout.py", "exec"), generated.__dict__)
    assert generated.DEFINES == layout.DEFINES and generated.STRUCTS == layout._GEN.STRUCTS
    assert not layout._is_stale(generated)  # made from these very sources


@pytest.mark.parametrize("body", ["__u32 a, b;", "__u32 a : 3; __u32 b : 29;"])
def test_the_generator_refuses_fields_it_cannot_measure_one_by_one(body):
    with pytest.raises(layout_gen.LayoutError, match="one plain field"):
        layout_gen._fields(body)
