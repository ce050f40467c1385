"""Transport (issue 12): the lab's emulated switch-port buffer depth.

`Lab(queue_packets=N)` / `swml-lab up --queue N` puts a pfifo of N packets
under every shaper (lab/shaping.py). The window/pacing part of issue 12 is
not built yet (docs/transport.md says so).
"""
from __future__ import annotations

import subprocess

import pytest

from conftest import NO_LAB
from switchml_xdp.lab import Lab, LabError
from switchml_xdp.lab.addressing import new_prefix


def test_queue_needs_a_rate_and_a_sane_depth():
    with pytest.raises(LabError, match="needs a rate"):
        Lab(workers=1, queue_packets=32)
    with pytest.raises(LabError, match="queue must be"):
        Lab(workers=1, rate_mbit=100, queue_packets=0)


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


# --- the window policy's Python reference (not yet wired into the backends) ---
from switchml_xdp.worker.window import CongestionWindow, WindowPolicy  # noqa: E402


def test_window_never_exceeds_the_slots_nor_drops_below_one():
    w = CongestionWindow(slots=8)
    t = 0.0
    for _ in range(1000):
        t += 0.001
        w.on_ack(0.001, t)
    assert w.cwnd == 8
    for _ in range(50):
        t += 1.0
        w.on_loss(t)
    assert w.cwnd == 1


def test_window_grows_about_ai_a_round_below_target():
    w = CongestionWindow(slots=1000, policy=WindowPolicy(initial=10))
    t = 0.0
    for _ in range(10):          # one round trip: 10 acks at 10 packets
        t += 0.0001
        w.on_ack(0.001, t)
    assert 10.8 < w.cwnd < 11.1


def test_queueing_delay_shrinks_the_window_once_a_round_trip():
    w = CongestionWindow(slots=64, policy=WindowPolicy(initial=32))
    w.on_ack(0.001, 0.0)                      # base 1 ms
    before = w.cwnd
    w.on_ack(0.005, 0.010)                    # 4 ms of queue
    once = w.cwnd
    assert once < before
    w.on_ack(0.005, 0.0101)                   # same round trip: no second cut
    assert w.cwnd == once
    assert w.pacing_gap_s() == pytest.approx(w.srtt / w.cwnd)


def test_loss_halves_once_a_round_trip():
    w = CongestionWindow(slots=64, policy=WindowPolicy(initial=32))
    w.on_ack(0.002, 0.0)
    w.on_loss(1.0)
    assert w.cwnd == pytest.approx(16.0, abs=0.2)
    w.on_loss(1.0001)
    assert w.cwnd == pytest.approx(16.0, abs=0.2)
