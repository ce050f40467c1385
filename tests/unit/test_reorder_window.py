"""RACK's margin adapts to reordering (switchml_xdp/client/retransmit.py,
"Reordering"; worker/stream.c, reorder_judge): the packets resent on
evidence are judged in samples of RACK_REO_SAMPLE; where at least 3/4 had
a second RESULT (TCP's DSACK: the resend was for nothing) the margin grows
by a quarter of the smoothed round trip, up to the whole of it; where at
most 1/4 did, it is a quarter again; in between (another rank's losses) it
stays. On a fake clock, and through both loops of the udp backend against a
fake switch whose RESULTs of some packets come late."""
from __future__ import annotations

import numpy as np
import pytest

from fake_switch import result_of
from retransmit_timers import engine_like_timers
from switchml_xdp.client.calls import Call
from switchml_xdp.client.retransmit import RACK_REO_SAMPLE, RACK_REORDER_DIV, RetransmitPolicy

RTT = 0.001


def _resend_round(clock, timers, p: int, twice: bool) -> list[int]:
    """Packet p, then p + 1 1.5 ms later (past any margin); p + 1's RESULT
    first, a round trip on: evidence resends p. Then p's RESULT, and,
    `twice`, a second one."""
    timers.sent(p)
    clock.t += 0.0015
    timers.sent(p + 1)
    clock.t += RTT
    timers.answered(p + 1, lost=False)
    lost = timers.lost_by_evidence()
    clock.t += RTT
    timers.answered(p, lost=not twice)
    if twice:
        timers.duplicate(p)
    return lost


def _timers_with_srtt():
    clock, timers = engine_like_timers()
    timers.sent(0)
    clock.t += RTT
    timers.answered(0, lost=False)                   # srtt 1 ms: margin 250 us
    return clock, timers


def _sample(clock, timers, first: int, twice: int) -> int:
    """One sample of resends on evidence, `twice` of them answered twice."""
    for i in range(RACK_REO_SAMPLE):
        assert _resend_round(clock, timers, first + 2 * i, i < twice) == [first + 2 * i]
    return first + 2 * RACK_REO_SAMPLE


def test_a_sample_of_resends_answered_twice_widens_the_margin():
    clock, timers = _timers_with_srtt()
    assert timers.reorder_window() == pytest.approx(RTT / RACK_REORDER_DIV)
    p = _sample(clock, timers, 10, twice=RACK_REO_SAMPLE - 1)
    assert timers.reorder_seen == RACK_REO_SAMPLE - 1 and timers.reo_mult == 2
    assert timers.reorder_window() == pytest.approx(2 * RTT / RACK_REORDER_DIV)
    # and grows no further than the smoothed round trip
    for _ in range(2 * RACK_REORDER_DIV):
        p = _sample(clock, timers, p, twice=RACK_REO_SAMPLE)
    assert timers.reo_mult == RACK_REORDER_DIV
    assert timers.reorder_window() == pytest.approx(timers.estimator.srtt)


def test_another_rank_s_losses_leave_it_and_real_losses_narrow_it():
    """About half of the resends for another rank's lost packet come back
    twice: no change. A sample of losses of its own: a quarter again."""
    clock, timers = _timers_with_srtt()
    p = _sample(clock, timers, 10, twice=RACK_REO_SAMPLE)
    p = _sample(clock, timers, p, twice=RACK_REO_SAMPLE)
    assert timers.reo_mult == 3
    p = _sample(clock, timers, p, twice=RACK_REO_SAMPLE // 2)
    assert timers.reo_mult == 3
    p = _sample(clock, timers, p, twice=RACK_REO_SAMPLE // 4)
    assert timers.reo_mult == 1
    timers.duplicate(p + 1000)                        # never sent: nothing
    assert timers.reorder_seen == 2 * RACK_REO_SAMPLE + RACK_REO_SAMPLE // 2 + RACK_REO_SAMPLE // 4


def late_first_answers(every: int, late_by: int):
    """An echo (world 1) that sends the RESULT of the first copy of every
    `every`-th packet only after `late_by` more DATA came in: RESULTs
    reordered far beyond any margin, so the backend resends those packets on
    evidence, has each resend answered at once, and then gets the
    original's RESULT as well."""
    held: list[list] = []      # [DATA count to release at, payload]
    seen: set[int] = set()
    count = [0]

    def answer(h, values):
        p = int(h["seq"])
        count[0] += 1
        out = []
        if p % every == every // 2 and p not in seen:
            held.append([count[0] + late_by, result_of(h, values)])
        else:
            out.append((False, result_of(h, values)))
        seen.add(p)
        for item in [x for x in held if x[0] <= count[0]]:
            out.append((False, item[1]))
            held.remove(item)
        return out
    return answer


def test_both_loops_widen_the_margin_when_results_come_late(fake):
    slow = RetransmitPolicy(initial_s=2.0, min_s=2.0, max_s=4.0)   # no timer in this
    n = 8 * 40 * RACK_REO_SAMPLE
    sw, be = fake(late_first_answers(20, 30), k=8, slots=64, policy=slow)
    x = np.arange(n, dtype=np.int32)
    be.allreduce(x, Call(0, "fake", x.size, "int32", "sum", "32"))
    np.testing.assert_array_equal(x, np.arange(n, dtype=np.int32))
    stats = be.stats()
    assert stats["rack_resends"] >= RACK_REO_SAMPLE and stats["duplicates"] >= RACK_REO_SAMPLE
    assert stats["reorder_seen"] >= RACK_REO_SAMPLE and stats["reo_mult"] >= 2, stats
