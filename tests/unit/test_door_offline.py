"""The one door to the kernel (switchml_xdp/bpf/) where no kernel is needed:
importing it needs neither bcc nor pyroute2, flags and defines, pin paths,
one-line errors from clang and verifier logs, the per-slot step as plain C.
With the kernel: tests/bpf/test_door.py."""
from __future__ import annotations

import secrets
import subprocess
import sys

import pytest

from switchml_xdp import bpf, net
from switchml_xdp.bpf import compile as bpf_compile


def test_importing_the_door_needs_no_bcc_and_no_pyroute2():
    code = ("import sys, switchml_xdp.bpf, switchml_xdp.net; "
            "print('bcc' in sys.modules, 'pyroute2' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_pin_paths():
    assert bpf.pin_dir("eth1") == f"{bpf.PIN_ROOT}/eth1"
    assert bpf.PIN_ROOT.startswith("/sys/fs/bpf/")


@pytest.mark.parametrize("path", ["/tmp", "/sys/fs/bpf", bpf.PIN_ROOT, f"{bpf.PIN_ROOT}/../x"])
def test_remove_pins_refuses_anything_outside_the_pin_root(path):
    with pytest.raises(bpf.BpfError, match="outside"):
        bpf.remove_pins(path)


def test_remove_pins_of_nothing_is_false():
    assert bpf.remove_pins(f"{bpf.PIN_ROOT}/no-such-{secrets.token_hex(4)}") is False


def test_cflags_and_defines():
    flags = bpf_compile.cflags({"SWML_K": 64, "SWML_ON": True,
                                "SWML_PIN_DIR": bpf.c_string('/a "b"')})
    assert flags[0].startswith("-I") and flags[0].endswith("xdp")
    assert "-Wno-compare-distinct-pointer-types" in flags
    assert flags[-3:] == ["-DSWML_K=64", "-DSWML_ON=1", '-DSWML_PIN_DIR="/a \\"b\\""']
    assert bpf_compile.resolve("lab/swml_pass.c").is_file()


def test_useful_line_of_a_clang_log():
    log = ("/virtual/main.c:3:5: warning: unused\n"
           "/work/xdp/swml_switch.c:12:3: error: use of undeclared identifier 'x'\n"
           "1 error generated.\n")
    assert bpf_compile._useful_line(log) == "swml_switch.c:12:3: error: use of undeclared identifier 'x'"


def test_useful_line_of_a_verifier_log():
    log = ("bpf: Failed to load program: Permission denied\n0: (b7) r0 = 0\n"
           "invalid access to packet, off=0 size=4, R2(id=0,off=0,r=0)\n"
           "processed 3 insns (limit 1000000) max_states_per_insn 0\n")
    assert bpf_compile._useful_line(log).startswith("invalid access to packet")


def test_bad_xdp_mode_is_refused_before_touching_anything():
    with pytest.raises(bpf.XdpError, match="native' or 'generic"):
        bpf.attach("lo", 0, "offload")


def test_net_errors_are_one_line():
    with pytest.raises(net.NetError, match="no interface named 'nope0'"):
        net.link_index("nope0")
    with pytest.raises(net.NetError, match="no network namespace"):
        net.link_index("lo", netns=f"nope-{secrets.token_hex(4)}")
    assert net.link_index("lo") == 1


def test_the_per_slot_step_is_written_once_and_compiles_as_plain_c(tmp_path):
    """xdp/swml_slot.h is the step of both data planes; the XDP switch and the
    user-space baseline include it, and the baseline builds warning-free."""
    import shutil

    from switchml_xdp.layout import xdp_dir
    from switchml_xdp.switch import userspace

    for src in (xdp_dir() / "swml_switch.c", userspace.SOURCE):
        assert '#include "swml_slot.h"' in src.read_text()
    for src in (xdp_dir() / "swml_switch.c", xdp_dir() / "swml_redirect.c"):
        assert '#include "swml_parse.h"' in src.read_text()
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    subprocess.run([cc, "-O2", "-std=gnu11", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror",
                    f"-I{xdp_dir()}", "-o", str(tmp_path / "dp.so"), str(userspace.SOURCE)],
                   check=True)
