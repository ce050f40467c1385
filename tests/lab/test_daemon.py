"""The daemon's life cycle: clean detach on SIGTERM, `down` from another shell,
clear one-line refusals of bad arguments; both data planes behind one interface."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from clis import SWITCH_CLI
from switchml_xdp import wire
from switchml_xdp.switch.maps import SwitchMaps, pin_dir
from switchml_xdp.switch.state_files import read_state, state_path


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


def test_unknown_interface_is_refused(lab1):
    r = lab1.run(lab1.switch, SWITCH_CLI + ["up", "nosuch0"], check=False, capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip() == "Error: no interface named 'nosuch0' in this network namespace"


# --- one interface, two data planes ---------------------------------------------


def test_userspace_dataplane_life_cycle(lab1):
    """Same daemon, same state file and `down`; nothing pinned, nothing attached."""
    from switchml_xdp.lab.cluster import SwitchProcess

    sw = SwitchProcess(lab1, ["--dataplane", "userspace"])
    iface = sw.iface
    assert "(user-space process, k=256" in sw.ready_line
    st = read_state(iface)
    assert st["pid"] == sw.proc.pid and st["dataplane"] == "userspace" and st["mode"] == "user-space"
    assert not xdp_attached(lab1, iface) and not os.path.exists(pin_dir(iface))
    status = json.loads(subprocess.run(SWITCH_CLI + ["status", "--json"], capture_output=True,
                                       text=True, check=True).stdout)
    assert next(s for s in status["switches"] if s["iface"] == iface)["alive"]
    human = subprocess.run(SWITCH_CLI + ["status"], capture_output=True, text=True, check=True).stdout
    assert f"switch {iface}: user-space process, k=256" in human
    # Where the control port is reachable, the counters come from the daemon.
    inside = lab1.run(lab1.switch, SWITCH_CLI + ["status", "--json"], capture_output=True, text=True)
    mine = next(s for s in json.loads(inside.stdout)["switches"] if s["iface"] == iface)
    assert set(mine["counters"]) == set(wire.COUNTER_NAMES) and mine["active_job_ids"] == []
    r = subprocess.run(SWITCH_CLI + ["down", iface], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "stopped daemon" in r.stdout, r.stdout + r.stderr
    assert sw.proc.wait(5) == 0 and not os.path.exists(state_path(iface))
    # Killed: only its state file is left (its tables died with it), and `down` removes it.
    sw = SwitchProcess(lab1, ["--dataplane", "userspace"])
    sw.proc.kill()
    sw.proc.wait()
    r = lab1.run(lab1.switch, SWITCH_CLI + ["down", iface], check=False, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip().endswith(": removed the state file"), r.stdout


def test_userspace_refuses_an_interface_with_an_xdp_program(lab1):
    """A crashed XDP switch's program would take the packets first: refused, then down."""
    from switchml_xdp.lab.cluster import SwitchProcess

    sw = SwitchProcess(lab1)
    sw.proc.kill()
    sw.proc.wait()
    r = lab1.run(lab1.switch, SWITCH_CLI + ["up", sw.iface, "--dataplane", "userspace"],
                 check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "has an XDP program attached" in r.stderr, r.stderr
    r = lab1.run(lab1.switch, SWITCH_CLI + ["down", sw.iface], check=False, capture_output=True, text=True)
    assert "detached XDP" in r.stdout and not xdp_attached(lab1, sw.iface)
    with SwitchProcess(lab1, ["--dataplane", "userspace"]) as us:
        assert "user-space process" in us.ready_line


# --- one daemon an interface, whatever the timing; down after a crash -----------

@pytest.mark.parametrize("delay", [0.0, 0.3, 0.6, 0.8, 1.0])
def test_concurrent_up_leaves_exactly_one_daemon_with_its_program(lab1, delay):
    """A second `up` started while the first is still loading (the old check of
    the state file came too late: the second replaced the first's program and
    pins, or the first was left serving with none). Whichever wins, the other
    says so in one line and the winner serves with its program attached."""
    import time

    from control_helpers import Raw
    from switchml_xdp import bpf
    from switchml_xdp.switch.state_files import lock_holder, lock_path

    iface = lab1.switch.iface
    argv = SWITCH_CLI + ["up", iface]
    procs = [lab1.popen(lab1.switch, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
    time.sleep(delay)
    procs.append(lab1.popen(lab1.switch, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        deadline = time.monotonic() + 60
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        losers = [p for p in procs if p.poll() is not None]
        assert len(losers) == 1, "exactly one `up` must give way"
        loser, winner = losers[0], next(p for p in procs if p is not losers[0])
        if delay >= 0.6:
            assert winner is procs[0], "the first one, well ahead, must win"
        out = loser.stdout.read()
        want = (f"Error: swml-switch is already up on {iface} "
                f"(pid {winner.pid}); `swml-switch down {iface}` first")
        assert loser.returncode == 1 and out.strip() == want, out
        line = winner.stdout.readline()
        assert " up on " in line, line
        st = read_state(iface)
        assert st["pid"] == winner.pid == lock_holder(iface)
        assert bpf.attachment(iface, netns=lab1.switch.ns).prog_id == st["prog_id"] != 0
        assert SwitchMaps.exist(iface)
        with Raw(lab1, lab1.workers[0]) as r:   # ... and it serves
            assert r.request({"op": "status"})["ok"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                assert p.wait(15) == 0
    assert not xdp_attached(lab1, iface) and not SwitchMaps.exist(iface)
    os.unlink(lock_path(iface))   # the lab's interface name is not used again


def test_down_after_sigkill_from_another_namespace_detaches(lab1):
    """The daemon ran in the lab's switch namespace; `down` runs in the root
    namespace, where the interface is not: it detaches the program inside the
    daemon's namespace, then removes the pins (on the old code: pins removed,
    the program left attached and aggregating)."""
    from switchml_xdp.lab.cluster import SwitchProcess

    sw = SwitchProcess(lab1)
    iface = sw.iface
    sw.proc.kill()
    sw.proc.wait()
    assert xdp_attached(lab1, iface) and os.path.isdir(pin_dir(iface))
    r = subprocess.run(SWITCH_CLI + ["down", iface], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"detached XDP in network namespace {lab1.switch.ns}" in r.stdout, r.stdout
    assert not xdp_attached(lab1, iface) and not os.path.exists(pin_dir(iface))
    assert not os.path.exists(state_path(iface))


def test_down_says_what_it_could_not_do(lab1):
    """The daemon's namespace cannot be found by name: the program may still be
    attached there, so the pins stay and `down` says so (exit 1, one line)."""
    from switchml_xdp.lab.cluster import SwitchProcess
    from switchml_xdp.switch.state_files import tokens_path

    sw = SwitchProcess(lab1)
    iface = sw.iface
    sw.proc.kill()
    sw.proc.wait()
    st = read_state(iface)
    st["netns_inode"] = 1   # a namespace no name under /run/netns points to
    with open(state_path(iface), "w") as f:
        json.dump(st, f)
    r = subprocess.run(SWITCH_CLI + ["down", iface], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "could not finish" in r.stderr and "is not in this network namespace" in r.stderr
    assert f"pinned maps kept in {pin_dir(iface)}" in r.stderr
    assert xdp_attached(lab1, iface) and os.path.isdir(pin_dir(iface))
    # Where the interface lives, `down` finishes (the program is the switch's by name).
    r = lab1.run(lab1.switch, SWITCH_CLI + ["down", iface], check=False, capture_output=True, text=True)
    assert r.returncode == 0 and "detached XDP" in r.stdout, r.stdout + r.stderr
    assert not xdp_attached(lab1, iface) and not os.path.exists(pin_dir(iface))
    assert not os.path.exists(tokens_path(iface))


def test_a_closed_lab_leaves_no_switch_files_even_after_a_killed_daemon():
    """A daemon killed with SIGKILL leaves its pins, state and lock file on purpose
    (a restarted daemon adopts them); a lab that is done with its interface
    removes them, so runs do not pile files up in /run/swml and bpffs."""
    from conftest import NO_LAB
    if NO_LAB:
        pytest.skip(NO_LAB)
    from switchml_xdp.lab import Lab
    from switchml_xdp.switch.state_files import lock_path, tokens_path

    with Lab(workers=1) as lab:
        iface = lab.switch.iface
        proc = lab.popen(lab.switch, [sys.executable, "-m", "switchml_xdp.cli.switch", "up", iface],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            if " up on " in line:
                break
        else:
            pytest.fail(f"swml-switch did not come up (rc {proc.wait()})")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert os.path.exists(lock_path(iface)) and os.path.isdir(pin_dir(iface))
    for path in (state_path(iface), tokens_path(iface), lock_path(iface), pin_dir(iface)):
        assert not os.path.exists(path), f"{path} left behind"
