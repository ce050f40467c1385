"""Transport: the lab's emulated switch-port buffer depth.

`Lab(queue_packets=N)` / `swml-lab up --queue N` puts a pfifo of N packets
under every shaper of the bridge's ports (the switch's buffers), and a host's
queue (HOST_QUEUE_PACKETS) under each worker's own shaper (lab/shaping.py).
The window is tests/test_window.py's.
"""
from __future__ import annotations

import subprocess

import pytest

from requires import NO_LAB
from switchml_xdp.lab import Lab
from switchml_xdp.lab.addressing import new_prefix
from switchml_xdp.lab.wiring import HOST_QUEUE_PACKETS


def _qdiscs(ns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "show"],
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(bool(NO_LAB), reason=f"lab tests: {NO_LAB}")
def test_every_switch_port_holds_queue_packets_and_every_host_a_hosts_queue():
    """The bridge's shapers (a TBF a worker port, an HTB class a worker on the
    switch's port) hold 32 packets; a worker's own TBF a host's 1000, where a
    32-packet queue dropped a third of Gloo's TCP segments before the switch."""
    with Lab(workers=2, prefix=new_prefix(), rate_mbit=200, queue_packets=32) as lab:
        out = _qdiscs(lab.bridge_ns)
        shapers = out.count("qdisc tbf") + out.count("qdisc htb") * 2   # HTB: one class per worker
        assert shapers == 2 + 2 and out.count("limit 32p") == shapers, out
        assert f"limit {HOST_QUEUE_PACKETS}p" not in out, out
        for w in lab.workers:
            out = _qdiscs(w.ns)
            assert out.count("qdisc tbf") == 1, out
            assert f"limit {HOST_QUEUE_PACKETS}p" in out and "limit 32p" not in out, out
        assert lab.describe()["queue_packets"] == 32
