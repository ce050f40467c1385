"""The daemon's life cycle: clean detach on SIGTERM, `down` from another shell,
clear one-line refusals of bad arguments."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from switchml_xdp.switch.daemon import read_state, state_path
from switchml_xdp.switch.maps import pin_dir

SWITCH_CLI = [sys.executable, "-m", "switchml_xdp.cli.switch"]


@pytest.fixture
def lab1(fresh_lab):
    return fresh_lab


def xdp_attached(lab, iface) -> bool:
    out = lab.run(lab.switch, ["ip", "-o", "link", "show", iface], capture_output=True, text=True).stdout
    return " xdp" in out


def test_sigterm_detaches_and_removes_pins(lab1):
    from switchml_xdp.lab.cluster import SwitchProcess

    sw = SwitchProcess(lab1)
    iface = sw.iface
    assert xdp_attached(lab1, iface) and os.path.isdir(pin_dir(iface))
    assert read_state(iface)["pid"] == sw.proc.pid
    sw.proc.send_signal(signal.SIGTERM)
    assert sw.proc.wait(15) == 0
    assert not xdp_attached(lab1, iface)
    assert not os.path.exists(pin_dir(iface)) and not os.path.exists(state_path(iface))


def test_down_from_another_shell_and_after_a_crash(lab1):
    from switchml_xdp.lab.cluster import SwitchProcess

    sw = SwitchProcess(lab1)
    iface = sw.iface
    # From the root namespace (another shell): stops the daemon, which cleans up.
    r = subprocess.run(SWITCH_CLI + ["down", iface], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "stopped daemon" in r.stdout, r.stdout + r.stderr
    assert sw.proc.wait(5) == 0 and not xdp_attached(lab1, iface)
    # A crashed daemon leaves program and pins; `down` in its namespace removes them.
    sw = SwitchProcess(lab1)
    sw.proc.kill()
    sw.proc.wait()
    assert xdp_attached(lab1, iface) and os.path.isdir(pin_dir(iface))
    r = lab1.run(lab1.switch, SWITCH_CLI + ["down", iface], check=False, capture_output=True, text=True)
    assert r.returncode == 0 and "detached XDP" in r.stdout, r.stdout + r.stderr
    assert not xdp_attached(lab1, iface) and not os.path.exists(pin_dir(iface))
    r = lab1.run(lab1.switch, SWITCH_CLI + ["down", iface], check=False, capture_output=True, text=True)
    assert r.returncode == 1 and "not up" in r.stderr


@pytest.mark.parametrize("args, reason", [
    (["--elements", "0"], "--elements"),
    (["--elements", "365"], "--elements"),
    (["--slots", "0"], "--slots"),
    (["--mode", "offload"], "--mode"),
])
def test_bad_arguments_get_one_line_reasons(args, reason):
    r = subprocess.run(SWITCH_CLI + ["up", "lo"] + args, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and reason in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("Error:")


def test_unknown_interface_is_refused(lab1):
    r = lab1.run(lab1.switch, SWITCH_CLI + ["up", "nosuch0"], check=False, capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip() == "Error: no interface named 'nosuch0' in this network namespace"
