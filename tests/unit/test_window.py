"""The window (switchml_xdp/client/window.py): how it grows, shrinks and paces,
on traces, and the C engine's window bit for bit the Python one. Through
shaped links: tests/lab/test_window_lab.py."""
from __future__ import annotations

import random

import pytest

from switchml_xdp.client.window import (
    DEFAULT_WINDOW,
    NO_WINDOW,
    CongestionWindow,
    WindowPolicy,
    window_policy,
)


def test_window_never_exceeds_the_slots_nor_drops_below_one():
    w = CongestionWindow(slots=8, policy=WindowPolicy(random_loss_md=0.2))
    t = 0.0
    for _ in range(1000):
        t += 0.001
        w.on_ack(0.001, t)
    assert w.cwnd == 8 and w.limit() == 8
    for _ in range(50):
        t += 1.0
        w.on_loss(t)
    assert w.cwnd == 1 and w.limit() == 1


def test_window_grows_about_ai_a_round_trip_without_backlog():
    w = CongestionWindow(slots=1000, policy=WindowPolicy(initial=10))
    t = 0.0
    for _ in range(10):          # one round trip: 10 acks at 10 packets, no queueing
        t += 0.0001
        w.on_ack(0.001, t)
    assert 10.8 < w.cwnd < 11.1


def test_a_backlog_above_target_shrinks_the_window_once_a_round_trip():
    w = CongestionWindow(slots=256, policy=WindowPolicy(initial=64, target_backlog=8,
                                                          max_backlog=8))
    w.on_ack(0.001, 0.0)                      # base 1 ms
    before = w.cwnd
    w.on_ack(0.009, 0.010)                    # srtt 2 ms: backlog 64 * 1/2 = 32 > 8
    once = w.cwnd
    assert once < before
    w.on_ack(0.009, 0.0101)                   # same round trip: no second cut
    assert w.cwnd == once


def test_the_window_settles_where_the_backlog_is_the_target():
    """A path of 1 ms base round trip and a bottleneck of 10 packets/ms: the
    round trip is base + queue/rate; starting below the pipe (so it sees the
    base round trip, as the first packet of a burst does), the window
    converges near the bandwidth-delay product plus the target backlog, far
    below 256 slots."""
    w = CongestionWindow(slots=256, policy=WindowPolicy(initial=4, target_backlog=8,
                                                         max_backlog=8))
    rate, base, t = 10.0, 0.001, 0.0
    for _ in range(20000):
        queue = max(0.0, w.cwnd - rate * base * 1e3)    # packets beyond the pipe
        rtt = base + queue / rate * 1e-3
        t += rtt / w.cwnd
        w.on_ack(rtt, t)
    assert 10 + 8 - 3 <= w.cwnd <= 10 + 8 + 3, w.cwnd


def test_the_backlog_allowed_is_a_millisecond_of_sending_within_8_and_32():
    slow = CongestionWindow(slots=512, policy=WindowPolicy(initial=10))
    slow.on_ack(0.002, 0.0)                   # 10 packets / 2 ms: 5 packets a ms
    assert slow.target == 8
    mid = CongestionWindow(slots=512, policy=WindowPolicy(initial=40))
    mid.on_ack(0.002, 0.0)                    # 20 a ms
    assert mid.target == pytest.approx(0.001 * 40 / 0.002)    # the window before this ack
    fast = CongestionWindow(slots=512, policy=WindowPolicy(initial=40))
    fast.on_ack(0.0001, 0.0)                  # 400 a ms
    assert fast.target == 32


def test_a_loss_behind_a_queue_halves_once_a_round_trip():
    w = CongestionWindow(slots=64, policy=WindowPolicy(initial=32, max_backlog=8))
    w.on_ack(0.001, 0.0)
    w.on_ack(0.004, 0.0005)                   # srtt 1.4 ms on a 1 ms base: backlog 9 > 8
    before = w.cwnd
    w.on_loss(1.0)
    assert w.cwnd == pytest.approx(before / 2)
    w.on_loss(1.0001)                         # same round trip: no second cut
    assert w.cwnd == pytest.approx(before / 2)


def test_a_loss_found_by_evidence_without_a_queue_keeps_the_window():
    """At 5% loss both ways a rank of 4 loses about a quarter of its rounds:
    any cut per loss would hold the window near nothing."""
    w = CongestionWindow(slots=64, policy=WindowPolicy(initial=32))
    w.on_ack(0.002, 0.0)                      # no backlog
    before = w.cwnd
    for i in range(100):
        w.on_loss(1.0 + i * 0.01, timeout=False)
    assert w.cwnd == before


def test_a_timeout_without_a_queue_cuts_a_fifth():
    """Nothing came back to show the path works: Veno's fifth."""
    w = CongestionWindow(slots=64, policy=WindowPolicy(initial=32))
    w.on_ack(0.002, 0.0)
    before = w.cwnd
    w.on_loss(1.0)
    assert w.cwnd == pytest.approx(before * 0.8)
    w.on_loss(1.0001)                         # once a round trip
    assert w.cwnd == pytest.approx(before * 0.8)


def test_a_random_loss_does_not_hold_off_a_congestion_cut():
    w = CongestionWindow(slots=64, policy=WindowPolicy(initial=32, max_backlog=8))
    w.on_ack(0.001, 0.0)
    w.on_loss(0.0002, timeout=False)          # no backlog: no cut, and no cut's hold
    assert w.last_decrease < 0
    w.on_ack(0.0011, 0.0003)                  # backlog 2.6 < 8: grows
    w.backlog = 9.0                           # as if the queue had grown
    before = w.cwnd
    w.on_loss(0.0004)                         # within the round trip of the first loss
    assert w.cwnd == pytest.approx(before / 2)


def test_pacing_spreads_the_window_over_a_round_trip_with_a_small_credit():
    w = CongestionWindow(slots=64, policy=WindowPolicy(initial=10, pace_burst=4))
    w.sent(0.0)
    assert w.send_at() == 0.0                 # no round trip yet: no pacing
    w.on_ack(0.001, 0.001)
    gap = w.gap()
    assert gap == pytest.approx(w.srtt / w.cwnd)
    now = 1.0                                 # idle for long: up to pace_burst at once
    sent = 0
    while w.send_at() <= now:
        w.sent(now)
        sent += 1
    assert sent == 4
    assert w.send_at() == pytest.approx(now + gap)


def test_no_window_is_the_old_rule():
    w = CongestionWindow(slots=128, policy=NO_WINDOW)
    assert w.limit() == 128 and w.gap() == 0.0


def test_environment_knobs(monkeypatch):
    monkeypatch.setenv("SWML_WINDOW", "off")
    assert window_policy().enabled is False
    monkeypatch.setenv("SWML_WINDOW", "on")
    monkeypatch.setenv("SWML_WINDOW_TARGET_BACKLOG", "16")
    assert window_policy() == WindowPolicy(target_backlog=16)
    assert window_policy(NO_WINDOW) is NO_WINDOW          # an explicit policy wins
    monkeypatch.setenv("SWML_WINDOW", "sometimes")
    with pytest.raises(ValueError, match="SWML_WINDOW"):
        window_policy()
    with pytest.raises(ValueError, match="invalid window policy"):
        WindowPolicy(max_mdf=1.5)


@pytest.mark.parametrize("policy", [DEFAULT_WINDOW, NO_WINDOW,
                                    WindowPolicy(initial=3, ai=2, beta=0.9, max_mdf=0.3,
                                                 target_backlog=0, pace_burst=1,
                                                 random_loss_md=0.5, max_backlog=4,
                                                 target_delay_s=0.01)],
                         ids=["default", "off", "odd"])
def test_the_engine_window_is_bit_for_bit_the_python_one(policy):
    rng = random.Random(12)
    t, events = 100.0, []
    for _ in range(20000):
        t += rng.expovariate(20000)
        r = rng.random()
        if r < 0.5:
            events.append(("sent", t))
        elif r < 0.98:
            events.append(("ack", 0.0002 + rng.expovariate(2000), t))
        elif r < 0.995:
            events.append(("loss", t, float(rng.random() < 0.5)))
        else:  # the box's cap: none, binding (1-100 Mbit/s), or above the window's pace
            events.append(("rate", rng.choice([0.0, 1e6, 2.5e7, 1e8, 1e11]),
                           rng.choice([8.0 * (74 + 1024), 8.0 * (74 + 512)])))
    for slots in (1, 7, 128):
        python = _python_trace(slots, policy, events)
        assert _engine().window_trace(slots, policy.as_tuple(), events) == python
        assert any(row[5] for row in python), "the trace never tried the box's cap"


FRAME_BITS = 8.0 * (74 + 1024)     # a DATA frame of 256 int32, headers included


def test_the_box_s_rate_spaces_sends_window_or_no_window():
    for policy in (DEFAULT_WINDOW, NO_WINDOW):
        w = CongestionWindow(slots=128, policy=policy)
        w.set_rate(10e6, FRAME_BITS)                 # 10 Mbit/s: 878.4 us a frame
        assert w.gap() == pytest.approx(FRAME_BITS / 10e6) and w.rate_bound()
        t, sent = 5.0, 0
        w.next_send = t                               # not idle: no credit
        while w.send_at() <= t + 0.1:                # 100 ms of sending
            w.sent(w.send_at())
            sent += 1
        assert sent == pytest.approx(0.1 * 10e6 / FRAME_BITS, abs=1)
        w.set_rate(0, FRAME_BITS)                    # lifted
        assert w.rate_gap() == 0.0 and not w.rate_bound()
    assert CongestionWindow(8, NO_WINDOW).gap() == 0.0


def test_the_gap_is_the_larger_of_the_window_s_and_the_cap_s():
    w = CongestionWindow(slots=128, policy=WindowPolicy(initial=10))
    w.on_ack(0.001, 0.001)                           # 10 packets a ms: 100 us apart
    w.set_rate(1e9, FRAME_BITS)                      # 8.8 us a frame: the window's pace
    assert w.gap() == pytest.approx(w.srtt / w.cwnd) and not w.rate_bound()
    w.set_rate(10e6, FRAME_BITS)                     # 878 us: the cap's
    assert w.gap() == pytest.approx(FRAME_BITS / 10e6) and w.rate_bound()


def test_the_window_does_not_inflate_behind_the_cap_and_grows_once_it_is_lifted():
    """At 10 Mbit/s (~1138 frames a second) on a 1 ms path the cap's packets a
    round trip are 1.14: the window grows to twice that plus the backlog
    allowed (32 packets: 1 ms of its sending, at most 32), no further."""
    small = CongestionWindow(slots=1024, policy=WindowPolicy(initial=4))
    big = CongestionWindow(slots=1024, policy=WindowPolicy(initial=64))
    bound = 2 * 10e6 * 0.001 / FRAME_BITS + 32
    t = 0.0
    for w in (small, big):
        w.set_rate(10e6, FRAME_BITS)
        for _ in range(20000):                       # loss-free, queue-free acks
            t += 0.001
            w.on_ack(0.001, t)
    assert bound < small.cwnd < bound + 0.1 and big.cwnd == 64
    big.set_rate(0, 0)
    for _ in range(64):
        t += 0.001
        big.on_ack(0.001, t)
    assert 64.9 < big.cwnd < 65.1                    # about ai a round trip again
    # on a fast path the cap's packets a round trip are below one: the window
    # still grows to the backlog allowed, so that jitter does not starve the cap
    fast = CongestionWindow(slots=1024, policy=WindowPolicy(initial=2))
    fast.set_rate(10e6, FRAME_BITS)
    for _ in range(2000):
        t += 0.0002
        fast.on_ack(0.0002, t)
    assert fast.cwnd > 30


def test_the_engine_refuses_a_bad_window():
    with pytest.raises(ValueError, match="window"):
        _engine().window_trace(8, (True, 0.5, 1, 0.5, 0.5, 8, 4, 0.2, 32, 0.001), [])
    with pytest.raises(TypeError):
        _engine().window_trace(8, [1, 2], [])


def _engine():
    try:
        from switchml_xdp import _engine
    except ImportError as e:
        pytest.skip(f"the C engine is not built: {e}")
    return _engine


def _python_trace(slots, policy, events):
    w, rows = CongestionWindow(slots, policy), []
    for kind, *args in events:
        {"ack": w.on_ack, "loss": w.on_loss, "sent": w.sent, "rate": w.set_rate}[kind](*args)
        rows.append((w.cwnd, w.srtt, w.next_send, w.limit(), w.gap(), int(w.rate_bound())))
    return rows
