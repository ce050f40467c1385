"""A lab of several boxes (switch hosts), each link shaped (needs root): every
box reachable from every worker at its own address, shaped both ways, with
the pass program on its bridge port and the loss injector's settings; a
switch on any box serves a job; `swml-lab up --boxes 2 --switch` starts one
on each and prints the workers' box list; nothing is left behind."""
from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from requires import NO_LAB

if NO_LAB:
    pytest.skip(f"lab tests: {NO_LAB}", allow_module_level=True)

from clis import LAB_CLI
from lab_jobs import run_job
from switchml_xdp.lab import Lab, cleanup_leftovers, lifecycle, netns
from switchml_xdp.lab.addressing import new_prefix
from switchml_xdp.lab.cluster import SwitchProcess, daemon_key
from switchml_xdp.lab.wiring import HOST_QUEUE_PACKETS
from switchml_xdp.switch import state_files

BOX_RATE = 50
needs_ping = pytest.mark.skipif(shutil.which("ping") is None,
                                reason="ping not installed (Debian package iputils-ping)")


@pytest.fixture
def prefix():
    """A fresh prefix, removed after the test whatever happened."""
    cleanup_leftovers(orphans_only=True)
    p = new_prefix()
    yield p
    cleanup_leftovers(p)


def _tc(ns: str, *args: str) -> str:
    return subprocess.run(["tc", "-n", ns, *args], capture_output=True, text=True,
                          check=True).stdout


def _links_named(prefix: str) -> str:
    """Interfaces of lab `prefix` visible from this namespace (there should be none)."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                         check=True).stdout
    return "\n".join(line for line in out.splitlines() if f"{prefix}-" in line)


def _assert_gone(prefix: str, boxes) -> None:
    assert not lifecycle.lab_namespaces(prefix)
    assert not lifecycle.state_path(prefix).exists()
    assert not _links_named(prefix)
    for b, box in enumerate(boxes):
        assert not lifecycle.switch_log_path(prefix, b).exists()
        assert not os.path.exists(state_files.state_path(box.iface))


@needs_ping
def test_three_shaped_boxes_each_serve_and_leave_nothing(prefix):
    with Lab(workers=2, prefix=prefix, boxes=3, box_rate_mbit=BOX_RATE) as lab:
        boxes = lab.switches
        assert [b.name for b in boxes] == ["sw", "sw1", "sw2"] and boxes[0] is lab.switch
        assert len({b.ip for b in boxes}) == 3
        assert sorted(lifecycle.lab_namespaces(prefix)) == sorted(lab.namespaces)
        assert {b.ns for b in boxes} <= set(lab.namespaces)
        for w in lab.workers:
            for b in boxes:
                lab.run(w, ["ping", "-c1", "-W2", b.ip])

        for b in boxes:
            into_box = _tc(lab.bridge_ns, "qdisc", "show", "dev", b.peer)
            out_of_box = lab.run(b, ["tc", "qdisc", "show", "dev", b.iface]).stdout
            for out in (into_box, out_of_box):
                assert "tbf" in out and f"rate {BOX_RATE}Mbit" in out, out
            port = subprocess.run(["ip", "-n", lab.bridge_ns, "link", "show", "dev", b.peer],
                                  capture_output=True, text=True, check=True).stdout
            assert " xdp " in port and "swml_pass" in port, port
        for w in lab.workers:    # the workers' links keep their own (here: no) rate
            assert "tbf" not in _tc(lab.bridge_ns, "qdisc", "show", "dev", w.peer)

        # A switch on the third box serves a job of both workers.
        far = boxes[2]
        with SwitchProcess(lab, ["-k", "64"], box=2) as sw:
            assert sw.iface == far.iface and far.ip in sw.ready_line

            def body(rank, w):
                data = np.arange(4096, dtype=np.int32) * (rank + 1)
                return w.allreduce(data)

            for got in run_job(lab, "boxes", ["udp", "udp"], body, switch_ip=far.ip):
                np.testing.assert_array_equal(got, np.arange(4096, dtype=np.int32) * 3)
        assert sw.proc.returncode == 0, "\n".join(sw.output[-20:])

        # Loss on one box's link only.
        lab.set_loss(0.25, hosts=["sw1"], direction="up")
        settings = lab.loss_settings()
        assert settings["sw1"]["up"]["loss"] == 0.25 and settings["sw1"]["down"]["loss"] == 0
        assert settings["sw2"]["up"]["loss"] == 0 and settings["w0"]["up"]["loss"] == 0
    _assert_gone(prefix, boxes)


def test_worker_and_box_rates_together(prefix):
    """Into a box: each worker's class under one parent at the box's rate,
    guaranteed its share and capped at the lower of the two rates; out of a
    box: TBF over a host's queue (the queue asked for is the bridge's ports')."""
    with Lab(workers=2, prefix=prefix, boxes=2, rate_mbit=100, box_rate_mbit=BOX_RATE,
             queue_packets=32) as lab:
        for b in lab.switches:
            classes = _tc(lab.bridge_ns, "class", "show", "dev", b.peer)
            assert f"class htb 1:1 root rate {BOX_RATE}Mbit ceil {BOX_RATE}Mbit" in classes
            share = f"parent 1:1 leaf 2{{}}: prio 0 rate {BOX_RATE // 2}Mbit ceil {BOX_RATE}Mbit"
            for i in range(len(lab.workers)):
                assert share.format(i) in classes, classes
            out = lab.run(b, ["tc", "qdisc", "show", "dev", b.iface]).stdout
            assert f"rate {BOX_RATE}Mbit" in out and f"limit {HOST_QUEUE_PACKETS}p" in out, out
            assert "limit 32p" in _tc(lab.bridge_ns, "qdisc", "show", "dev", b.peer)
        w = lab.workers[0]
        assert "rate 100Mbit" in _tc(lab.bridge_ns, "qdisc", "show", "dev", w.peer)
    _assert_gone(prefix, lab.switches)


def test_up_with_boxes_starts_a_switch_on_each(prefix):
    env = {k: v for k, v in os.environ.items() if k != "SUDO_UID"}
    r = subprocess.run(LAB_CLI + ["up", "-n", "2", "--prefix", prefix, "--boxes", "2",
                                  "--box-rate", "80", "--switch", "--switch-args", "-k 64"],
                       capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    lab = Lab.from_state(prefix)
    assert [b.ip for b in lab.switches] == ["10.0.0.1", "10.0.0.2"]
    assert lab.box_rate_mbit == 80
    state = lifecycle.read_state(prefix)
    pids = [state[daemon_key(b)]["pid"] for b in range(2)]
    # Each box tells joiners the rate its port is shaped to.
    assert all(state[daemon_key(b)]["args"] == ["-k", "64", "--capacity", "80M"] for b in range(2))
    for pid in pids:
        os.kill(pid, 0)   # running, detached from `swml-lab up`, which has exited
    assert r.stdout.count("up on") == 2 and "box links to 80 Mbit/s" in r.stdout
    commands = [line for line in r.stdout.splitlines() if "swml-worker bench" in line]
    assert len(commands) == 2
    assert all("--switch 10.0.0.1,10.0.0.2 " in c for c in commands), commands

    # `exec` knows the second box by its short name and by its namespace.
    for name in ("sw1", f"{prefix}-sw1"):
        argv = ["exec", name, "--", "ip", "-o", "addr", "show", "dev", f"{prefix}-s1"]
        argv[1:1] = ["--lab", prefix] if name == "sw1" else []
        out = subprocess.run(LAB_CLI + argv, capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0 and "inet 10.0.0.2/24" in out.stdout, out.stdout + out.stderr

    down = subprocess.run(LAB_CLI + ["down", prefix], capture_output=True, text=True,
                          timeout=60, env=env)
    assert down.returncode == 0, down.stderr
    _assert_gone(prefix, lab.switches)
    assert not any(netns._alive(pid) for pid in pids)
