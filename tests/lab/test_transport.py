"""Transport: the lab's emulated switch-port buffer depth.

`Lab(queue_packets=N)` / `swml-lab up --queue N` puts a pfifo of N packets
under every shaper (lab/shaping.py). The window is tests/test_window.py's.
"""
from __future__ import annotations

import subprocess

import pytest

from requires import NO_LAB
from switchml_xdp.lab import Lab
from switchml_xdp.lab.addressing import new_prefix


def _qdiscs(ns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "show"],
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(bool(NO_LAB), reason=f"lab tests: {NO_LAB}")
def test_every_shaped_queue_holds_queue_packets():
    with Lab(workers=2, prefix=new_prefix(), rate_mbit=200, queue_packets=32) as lab:
        for ns in [w.ns for w in lab.workers] + [lab.bridge_ns]:
            out = _qdiscs(ns)
            shapers = out.count("qdisc tbf") + out.count("qdisc htb") * 2   # HTB: one class per worker
            assert out.count("limit 32p") == shapers, out
        assert lab.describe()["queue_packets"] == 32
