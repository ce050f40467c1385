"""`swml-lab train`'s driver before anything is built (switchml_xdp/lab/
train_runs.py): where each rank's SWML_SWITCH points in each kind of lab,
a rank's own environment reaching its process, and how each box of a tree
is lost (`--kill-box`). The runs themselves: tests/lab/test_lab_train_racks.py."""
from __future__ import annotations

import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from switchml_xdp.lab import Lab
from switchml_xdp.lab.cluster import run_rank_processes
from switchml_xdp.lab.racks import RacksLab


def test_each_rank_finds_its_own_box_in_swml_switch():
    from switchml_xdp.lab.train_runs import rank_switch

    tree = RacksLab(2, "1,2", "tree", prefix="t")
    assert [rank_switch(tree, w) for w in tree.workers] == ["10.0.1.1", "10.0.2.1", "10.0.2.1"]
    flat = RacksLab(2, 2, "flat", prefix="f")
    assert {rank_switch(flat, w) for w in flat.workers} == {"10.0.0.1"}
    boxes = Lab(workers=2, boxes=2, prefix="b")
    assert {rank_switch(boxes, w) for w in boxes.workers} == {"10.0.0.1,10.0.0.2"}


class _LocalLab:
    """popen without a namespace: what run_rank_processes gives each rank."""

    def popen(self, host, argv, **kw):
        return subprocess.Popen(argv, **kw)


def test_a_rank_gets_its_own_environment_on_top_of_everyones():
    show = [sys.executable, "-c", "import os; print(os.environ['SWML_SWITCH'], "
                                  "os.environ['SHARED'], os.environ['GLOO_SOCKET_IFNAME'])"]
    host = SimpleNamespace(iface="w-eth")
    outs = run_rank_processes(_LocalLab(), [(host, show, {"SWML_SWITCH": "10.0.1.1"}),
                                            (host, show, {"SWML_SWITCH": "10.0.2.1"}),
                                            (host, show)],
                              timeout=30, env={"SHARED": "x", "SWML_SWITCH": "everyone's"})
    assert [o.split() for o, _ in outs] == [["10.0.1.1", "x", "w-eth"], ["10.0.2.1", "x", "w-eth"],
                                            ["everyone's", "x", "w-eth"]]


class _Daemon:
    def __init__(self, said: list):
        self.said = said
        self.proc = SimpleNamespace(kill=lambda: said.append("kill"),
                                    wait=lambda: said.append("wait"))

    def stop(self):
        self.said.append("leftovers removed")


@pytest.mark.parametrize("box", [0, 2])
def test_the_parent_is_powered_off_and_a_rack_box_loses_its_data_plane_not_its_routing(
        monkeypatch, box):
    from switchml_xdp.lab.train_runs import _killer

    lab, said = RacksLab(2, 2, "tree", prefix="k"), []
    monkeypatch.setattr(lab, "run", lambda host, argv: said.append((host.name, *argv[4:])))
    daemons = [_Daemon(said) for _ in lab.switches]
    done = threading.Event()
    killer = _killer(lab, daemons, (box, 0.01), "/",
                     lambda line: (said.append(line), done.set())).start()
    assert done.wait(5)
    killer.cancel()
    if box == 0:
        assert said[:-1] == [("sw", lab.switch.iface, "down"), "kill"], said
        assert "powered off" in said[-1] and "its link down, its daemon killed" in said[-1]
    else:
        port, up = lab.rack_ports[1], lab.uplinks[1]
        assert said[:-1] == ["kill", (port.name, port.iface, "xdp", "off"),
                             (up.name, up.iface, "xdp", "off"), "wait", "leftovers removed"], said
        assert said[-1].startswith(f"  box r1 ({port.ip}) killed ") and "routing kept" in said[-1]
