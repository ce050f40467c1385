"""packaging/: what a real install needs, complete and as systemd takes it.
Every unit's ExecStart runs an absolute path that the install instructions in
the unit put there from this tree; `systemd-analyze verify` accepts the units
(where it is installed). The vagrant lab installs the same files:
tests/unit/test_vagrant_plan.py."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import tomllib

import pytest

from repo import REPO

PACKAGING = REPO / "packaging"
UNITS = sorted(PACKAGING.glob("*.service"))

#: Where the units' install instructions put a program -> what is put there.
INSTALLED = {
    "/usr/local/bin/swml-switch": "the swml-switch console script",
    "/usr/local/sbin/swml-tune-nic": "packaging/tune-nic.sh",
}


def _exec_start(unit) -> list[str]:
    [line] = re.findall(r"^ExecStart=(.*)$", unit.read_text(), re.M)
    return shlex.split(line.lstrip("-@:+!"))


def test_the_units_are_there():
    assert {u.name for u in UNITS} == {"swml-switch.service", "swml-nic.service"}
    assert (PACKAGING / "tune-nic.sh").is_file()


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_exec_start_is_absolute_and_installed_from_this_tree(unit):
    program = _exec_start(unit)[0]
    assert program.startswith("/"), f"{unit.name}: ExecStart runs {program!r}, not an absolute path"
    assert program in INSTALLED, f"{unit.name}: nothing here installs {program}"
    source = INSTALLED[program]
    text = unit.read_text()
    if source.startswith("packaging/"):
        assert (REPO / source).is_file()
        assert f"{source} {program}" in " ".join(text.split()), "the unit says how to install it"
    else:
        scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
        assert program.rsplit("/", 1)[1] in scripts
        assert f"/.venv/bin/{program.rsplit('/', 1)[1]} {program.rsplit('/', 1)[0]}/" in text
    # Every file of this tree the unit's comments name exists.
    for named in re.findall(r"packaging/[\w.-]+", text):
        assert (REPO / named).is_file(), named


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_the_units(tmp_path):
    """The units as systemd reads them, with their programs pointed at this
    tree's copies (the installed paths do not exist on a test machine)."""
    here = {"/usr/local/bin/swml-switch": shutil.which("swml-switch") or str(REPO / ".venv/bin/swml-switch"),
            "/usr/local/sbin/swml-tune-nic": str(PACKAGING / "tune-nic.sh")}
    for unit in UNITS:
        text = unit.read_text()
        for installed, local in here.items():
            text = text.replace(f"ExecStart={installed} ", f"ExecStart={local} ")
            text = re.sub(rf"^ExecStart={re.escape(installed)}$", f"ExecStart={local}", text, flags=re.M)
        (tmp_path / unit.name).write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", *(str(tmp_path / u.name) for u in UNITS)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_k_limit_is_wire_max_k_everywhere():
    """k's bound is the MTU arithmetic of docs/operations.md, the CLI's and the
    docs' alike: one page's frame for native XDP (4096 - 256 headroom - 320
    skb_shared_info - virtio_net's 12-byte header) at most, and what a
    1500-byte MTU carries beside it."""
    from switchml_xdp import wire
    from switchml_xdp.cli import switch as switch_cli

    assert (1500 - 20 - 8 - wire.HDR_LEN) // 4 == wire.MTU1500_K == 360
    assert wire.MAX_MTU == 4096 - 256 - 320 - 12 - wire.ETH_LEN == 3494
    assert (wire.MAX_MTU - 20 - 8 - wire.HDR_LEN) // 4 == wire.MAX_K == 858
    assert wire.ETH_LEN + wire.IP_OVERHEAD + 4 * wire.MAX_K <= wire.PAGE_FRAME_LEN
    [elements] = [p for p in switch_cli.up.params if p.name == "elements"]
    assert elements.type.max == wire.MAX_K
    ops = (REPO / "docs/operations.md").read_text()
    assert f"32 (the swml header of\n  wire v2) = 1440 bytes = {wire.MTU1500_K} int32" in ops
    assert f"= {wire.MAX_K} int32" in ops
    assert wire.HDR_LEN == 32
    for doc in ("README.md", "docs/operations.md", "docs/design.md", "docs/quantization.md"):
        text = (REPO / doc).read_text()
        limits = re.findall(r"(?:k=|1\.\.|at most |range 1<=x<=)([38][0-9]{2})\b", text)
        assert set(limits) <= {str(wire.MAX_K), str(wire.MTU1500_K)}, (doc, limits)
