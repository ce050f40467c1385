"""Copies after a lost resend (switchml_xdp/client/retransmit.py): a packet
whose timer runs out again goes as 2^(n-1) copies at its n-th expiry, at most
RTO_COPIES_MAX, so a run of lost frames ends in a few timeouts. On a fake
clock, and through both loops of the udp backend (the engine's twin is
worker/stream.c, resend_expired) against a fake switch that loses a run of
one packet's frames."""
from __future__ import annotations

from collections import Counter

import numpy as np

from fake_switch import result_of
from retransmit_timers import FIXED_POLICY, FakeClock
from switchml_xdp.client.calls import Call
from switchml_xdp.client.retransmit import RTO_COPIES_MAX, RetransmitPolicy, RetransmitTimers


def test_copies_double_with_every_expiry_up_to_the_cap():
    clock = FakeClock()
    timers = RetransmitTimers(FIXED_POLICY, clock)
    timers.sent(0)
    got = []
    for _ in range(6):
        clock.t += 2.0
        got.append(len(list(timers.expired())))
    want = [min(2 ** n, RTO_COPIES_MAX) for n in range(6)]
    assert got == want and RTO_COPIES_MAX > 1
    assert timers.timeout_copies == sum(want) - len(want)


def test_an_answer_or_a_new_stream_starts_the_count_again():
    clock = FakeClock()
    timers = RetransmitTimers(FIXED_POLICY, clock)
    timers.sent(0)
    for copies in (1, 2):
        clock.t += 2.0
        assert list(timers.expired()) == [0] * copies
    timers.answered(0)
    timers.sent(1)                                   # a new packet: one copy first
    clock.t += 2.0
    assert list(timers.expired()) == [1]
    timers.start()                                   # a new stream
    timers.sent(1)
    clock.t += 2.0
    assert list(timers.expired()) == [1]


def lose_first_copies_of(p_lost: int, n: int):
    """An answer that echoes every DATA at once (world 1), except the first n
    frames of packet p_lost: a run of losses that its resends fall into."""
    lost = Counter()

    def answer(h, values):
        p = int(h["seq"])
        if p == p_lost and lost[p] < n:
            lost[p] += 1
            return []
        return [(False, result_of(h, values))]
    return answer


def test_a_resend_lost_again_goes_as_two_copies_through_the_backend(fake):
    """One packet, its first three frames lost: the send and the first resend
    each alone, then the second expiry's two copies, of which the second gets
    through. One copy a doubled timeout would need a third expiry."""
    policy = RetransmitPolicy(initial_s=0.05, min_s=0.05, max_s=1.0, adaptive=False)
    sw, be = fake(lose_first_copies_of(0, 3), k=8, slots=4, policy=policy)
    x = np.arange(8, dtype=np.int32)
    be.allreduce(x, Call(0, "fake", x.size, "int32", "sum", "32"))
    np.testing.assert_array_equal(x, np.arange(8, dtype=np.int32))
    stats = be.stats()
    assert stats["retransmissions"] == 3 and stats["timeout_copies"] == 1, stats
    assert [int(h["seq"]) for h in sw.headers] == [0, 0, 0, 0]
