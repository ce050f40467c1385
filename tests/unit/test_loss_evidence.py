"""Loss by evidence (switchml_xdp/client/retransmit.py, RACK's rule): a packet
goes again when a packet sent after it has its result, before any timer; its
resends back off in round trips; a resend's too-early answer says nothing.
On a fake clock, and through the udp backend against a fake switch whose
timers are far too long to be what recovers. The engine's twin
(worker/stream.c, rack_detect) runs in tests/lab/test_loss_matrix.py."""
from __future__ import annotations

import time

import numpy as np
import pytest

from fake_switch import hold_first_copy_of
from retransmit_timers import engine_like_timers
from switchml_xdp.client.calls import Call
from switchml_xdp.client.retransmit import RACK_REORDER_DIV, RetransmitPolicy


def _stream(timers, clock, n: int, gap: float) -> None:
    for p in range(n):
        timers.sent(p)
        clock.t += gap


def test_a_later_packet_s_result_resends_the_earlier_ones_at_once():
    clock, timers = engine_like_timers()
    _stream(timers, clock, 5, 0.001)                 # 1 ms apart: past any margin
    assert timers.lost_by_evidence() == []          # no result yet: no evidence
    clock.t -= 0.0005
    timers.answered(4, lost=False)                   # 0.5 ms round trip
    assert timers.lost_by_evidence() == [0, 1, 2, 3]
    assert timers.evidence_resends == 4
    assert timers.lost_by_evidence() == []          # nothing new came back
    rto = timers.estimator.rto
    assert list(timers.expired()) == []             # nothing timed out: no back-off
    assert timers.estimator.rto == rto == pytest.approx(0.002)


def test_the_margin_is_a_quarter_of_the_smoothed_round_trip():
    """Packets sent within srtt / 4 before the answered one are not judged."""
    clock, timers = engine_like_timers()
    timers.sent(0)
    clock.t += 0.001
    timers.answered(0, lost=False)                   # srtt 1 ms: margin 250 us
    assert timers.estimator.srtt == pytest.approx(0.001)
    timers.sent(1)
    clock.t += 0.001 / RACK_REORDER_DIV / 2          # 125 us later
    timers.sent(2)
    clock.t += 0.001
    timers.answered(2, lost=False)
    assert timers.lost_by_evidence() == []
    timers.sent(3)
    clock.t += 0.0003
    timers.sent(4)
    clock.t += 0.001
    timers.answered(4, lost=False)
    assert timers.lost_by_evidence() == [1, 3]


def test_a_resend_on_evidence_backs_off_in_round_trips():
    """The round of packet 0 waits for another rank's resend: our own resends
    of 0 are duplicates, the n-th waits 2^n round trips after the last."""
    clock, timers = engine_like_timers()
    rtt = 0.001
    timers.sent(0)
    clock.t += rtt / 2
    p, resends = 1, []
    for step in range(64):                           # 64 round trips of evidence
        timers.sent(p)
        clock.t += rtt
        timers.answered(p, lost=False)
        p += 1
        if timers.lost_by_evidence() == [0]:
            resends.append(step)
    gaps = [b - a for a, b in zip(resends, resends[1:])]
    assert resends[0] == 0                           # the first at once
    assert all(b > 1.5 * a for a, b in zip(gaps, gaps[1:])), resends  # about doubling
    assert len(resends) <= 6, resends                # not one a round trip


def test_a_result_sooner_than_the_base_round_trip_after_a_resend_is_no_evidence():
    """It answers the original, sent long before: taking the resend's time
    would condemn every packet sent in between."""
    clock, timers = engine_like_timers()
    timers.sent(0)
    clock.t += 0.001
    timers.answered(0, lost=False)                   # base 1 ms
    timers.sent(1)
    clock.t += 0.0004
    for p in range(2, 6):
        timers.sent(p)
    clock.t += 0.006
    assert list(timers.expired()) == [1]             # its timer: resent now
    clock.t += 0.0002
    timers.answered(1, lost=False)                   # 0.2 ms after the resend
    assert timers.lost_by_evidence() == []           # 2..5 are not condemned


def test_the_udp_backend_recovers_a_lost_packet_without_waiting_for_its_timer(fake):
    """Timers of 2 s: only the evidence of the later results can recover
    packet 5 in well under a second.

    Under load (CI's 2 cores, a bench beside) the fake switch's thread can be
    late enough to inflate the smoothed round trip until evidence's margin
    (a quarter of it) covers every later packet; packet 5 is then the last in
    flight and the tail probe, also not a timer, recovers it (seen once in
    CI). Every run must recover without a timer; up to three fresh runs, one
    of them must recover on evidence, so a backend that never asks for
    evidence still fails."""
    slow = RetransmitPolicy(initial_s=2.0, min_s=2.0, max_s=4.0)
    runs = []
    for _ in range(3):
        sw, be = fake(hold_first_copy_of(5), k=8, slots=16, policy=slow)
        x = np.arange(8 * 40, dtype=np.int32)
        t0 = time.monotonic()
        be.allreduce(x, Call(0, "fake", x.size, "int32", "sum", "32"))
        assert time.monotonic() - t0 < 1.0
        np.testing.assert_array_equal(x, np.arange(8 * 40, dtype=np.int32))
        stats = be.stats()
        assert stats["retransmissions"] >= 1
        assert stats["retransmissions"] == stats["rack_resends"] + stats["tail_probes"]  # no timer
        runs.append((stats["rack_resends"], stats["tail_probes"]))
        if stats["rack_resends"] >= 1:
            break
    assert runs[-1][0] >= 1, f"(evidence, tail probe) resends a run: {runs}"


def test_a_lost_tail_is_probed_after_two_round_trips_not_a_timeout():
    """The last packets of a call: no later result can reveal their loss.
    After 2 srtt without a result the newest goes again, once; its answer
    then condemns the older ones."""
    clock, timers = engine_like_timers()
    timers.sent(0)
    clock.t += 0.001
    timers.answered(0, lost=False)                   # srtt 1 ms, RTO 2 ms
    for p in (1, 2, 3):
        timers.sent(p)
        clock.t += 0.0001
    timers.pacing = True                             # a new packet waits for its paced time
    assert timers.next_deadline() == pytest.approx(100.001 + 0.003)   # timers only
    timers.pacing = False                            # 3 was the call's last packet
    assert timers.next_deadline() == pytest.approx(100.0012 + 0.002)  # 2 srtt after the last send
    clock.t = 100.0012 + 0.0019
    assert timers.tail_probe() is None               # not yet: 2 srtt
    clock.t = 100.0012 + 0.0021
    assert timers.tail_probe() == 3                  # the newest
    assert timers.tail_probe() is None               # once until a result
    assert timers.tail_probes == 1
    clock.t += 0.0011
    timers.answered(3, lost=True)
    assert timers.lost_by_evidence() == [1, 2]
    assert list(timers.expired()) == []              # before any timer


def test_no_tail_probe_while_the_pacer_holds_a_packet():
    """A paced stream whose RESULTs are more than 2 srtt apart: its later
    packets' RESULTs are the evidence, a probe each gap would double it."""
    clock, timers = engine_like_timers()
    timers.sent(0)
    clock.t += 0.0002
    timers.answered(0, lost=False)                   # srtt 0.2 ms
    timers.pacing = True
    for p in range(1, 20):
        timers.sent(p)
        clock.t += 0.001                             # 1 ms apart: 5 srtt
        assert timers.tail_probe() is None
        timers.answered(p, lost=False)


def test_nothing_in_flight_no_tail_probe():
    clock, timers = engine_like_timers()
    timers.sent(0)
    clock.t += 0.001
    timers.answered(0, lost=False)
    clock.t += 1.0
    assert timers.tail_probe() is None and timers.next_deadline() is None
