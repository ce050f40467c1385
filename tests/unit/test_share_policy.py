"""The share policies' arithmetic and the share loop over a fake data plane
(switch/share_policy.py, switch/shares.py): no root, no maps."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from switchml_xdp import wire
from switchml_xdp.switch import share_policy as sp
from switchml_xdp.switch.maps import JobPace
from switchml_xdp.switch.shares import IDLE_S, TICK_S, Shares

MBIT = 1_000_000


def test_fair_and_weighted_parts():
    jobs = [sp.Demand("a", 3.0), sp.Demand("b", 1.0)]
    assert sp.divide("fair", jobs) == {"a": 0.5, "b": 0.5}
    assert sp.divide("weighted", jobs) == {"a": 0.75, "b": 0.25}
    assert sp.divide("fair", []) == {}
    assert sp.divide("weighted", [sp.Demand("alone", 5.0)]) == {"alone": 1.0}


def test_srpt_serves_the_least_left_first_and_keeps_floors():
    jobs = [sp.Demand("big", left=32 << 20), sp.Demand("small", left=2 << 20),
            sp.Demand("mid", left=8 << 20)]
    parts = sp.divide("srpt", jobs)
    assert max(parts, key=parts.get) == "small"
    assert parts["big"] == parts["mid"] == sp.SRPT_FLOOR
    assert sum(parts.values()) == pytest.approx(1.0)
    assert sp.serving_order("srpt", jobs) == ["small", "mid", "big"]


def test_srpt_floors_together_stay_within_their_cap():
    jobs = [sp.Demand(f"j{i}", left=(i + 1) << 20) for i in range(40)]
    parts = sp.divide("srpt", jobs)
    assert sum(v for k, v in parts.items() if k != "j0") <= sp.SRPT_FLOORS_AT_MOST + 1e-12
    assert parts["j0"] >= 1 - sp.SRPT_FLOORS_AT_MOST - 1e-12


def test_srpt_age_lets_a_long_wait_pass_a_shorter_call():
    fresh = sp.Demand("short", left=4 << 20, waited_s=0.0)
    waited = sp.Demand("long", left=32 << 20, waited_s=4 * sp.SRPT_AGE_HALF_S)   # 32/16 = 2 MiB
    assert sp.serving_order("srpt", [fresh, waited]) == ["long", "short"]
    # A job that says nothing goes behind the ones that do, until it has waited.
    assert sp.serving_order("srpt", [sp.Demand("mute"), fresh]) == ["short", "mute"]


def test_an_idle_job_is_told_the_part_it_would_get():
    active = [sp.Demand("a", 1.0), sp.Demand("b", 1.0)]
    assert sp.part_if_active("fair", active, sp.Demand("c")) == pytest.approx(1 / 3)
    assert sp.part_if_active("weighted", active, sp.Demand("c", 2.0)) == pytest.approx(0.5)
    assert sp.part_if_active("srpt", [sp.Demand("a", left=1)], sp.Demand("c", left=9)) == \
        sp.SRPT_FLOOR


def test_dscp_marks_follow_the_serving_order():
    jobs = [sp.Demand("a", left=3), sp.Demand("b", left=1), sp.Demand("c", left=2)]
    assert sp.dscp_marks("srpt", jobs, (46, 34)) == {"b": 46, "c": 34, "a": 34}
    assert sp.dscp_marks("fair", jobs, (46, 34)) == {"a": 46, "b": 46, "c": 46}
    assert sp.dscp_marks("srpt", jobs, ()) == {}


@pytest.mark.parametrize("text", ["", "64", "46,46", "a,b", "-1", "1,2,3,4,5,6,7,8,9"])
def test_bad_dscp_lists_get_one_line(text):
    with pytest.raises(ValueError) as e:
        sp.parse_dscp_classes(text)
    assert "\n" not in str(e.value)


def test_dscp_lists_parse():
    assert sp.parse_dscp_classes("46, 34,26,0") == (46, 34, 26, 0)


@pytest.mark.parametrize("value", [0, -1, "x", None, True, float("nan"), float("inf"), 9])
def test_bad_weights_get_one_line(value):
    with pytest.raises(ValueError) as e:
        sp.parse_weight(value, cap=8)
    assert "\n" not in str(e.value)


def test_weights_parse_within_the_cap():
    assert sp.parse_weight("3", cap=8) == 3.0
    assert sp.parse_weight(8, cap=8) == 8.0


# --- the loop over a fake data plane ------------------------------------------

@dataclass
class FakeJob:
    name: str
    id: int
    weight: float = 1.0
    dscp: int | None = None
    senders: int = 2
    state: str = "running"


class FakeMaps:
    """job id -> cumulative bytes and the last pace code its DATA said."""

    def __init__(self):
        self.bytes: dict[int, int] = {}
        self.left: dict[int, int] = {}
        self.paces: dict[int, JobPace] = {}

    def read_job_progress(self, ids):
        return {j: (self.bytes.get(j, 0), self.left.get(j, 0)) for j in ids}

    def write_job_pace(self, job_id, pace):
        self.paces[job_id] = pace


def run(shares, maps, jobs, seconds, now, sending):
    """Tick for `seconds`, the jobs in `sending` each moving 1 MB a tick."""
    t = now
    while t < now + seconds:
        for j in jobs:
            if j.name in sending:
                maps.bytes[j.id] = maps.bytes.get(j.id, 0) + 1_000_000
        shares.tick(jobs, t)
        t += TICK_S
    return t


def rate_kbps(maps, job_id):
    return wire.pace_decode(maps.paces[job_id].rate_code)


def test_the_loop_divides_between_the_jobs_sending():
    maps, jobs = FakeMaps(), [FakeJob("a", 1), FakeJob("b", 2)]
    shares = Shares("fair", 100 * MBIT, maps)
    t = run(shares, maps, jobs, 0.2, 0.0, {"a", "b"})
    # 100 Mbit/s in halves, each half between 2 ranks: 25 Mbit/s a rank.
    assert rate_kbps(maps, 1) == pytest.approx(25_000, rel=2e-3)
    assert rate_kbps(maps, 2) == pytest.approx(25_000, rel=2e-3)
    # b stops: a gets the whole link once b has been idle IDLE_S.
    run(shares, maps, jobs, IDLE_S + 3 * TICK_S, t, {"a"})
    assert rate_kbps(maps, 1) == pytest.approx(50_000, rel=2e-3)
    assert shares.describe(jobs[0])["share"] == 1.0
    assert shares.describe(jobs[0])["target_bps"] == 100 * MBIT


def test_a_weight_change_takes_effect_at_the_next_tick():
    maps, jobs = FakeMaps(), [FakeJob("a", 1, weight=3.0), FakeJob("b", 2)]
    shares = Shares("weighted", 100 * MBIT, maps)
    t = run(shares, maps, jobs, 0.2, 0.0, {"a", "b"})
    assert rate_kbps(maps, 1) / rate_kbps(maps, 2) == pytest.approx(3.0, rel=2e-3)
    jobs[0].weight = 1.0
    run(shares, maps, jobs, 2 * TICK_S, t, {"a", "b"})
    assert rate_kbps(maps, 1) == pytest.approx(rate_kbps(maps, 2), rel=2e-3)


def test_srpt_follows_what_the_ranks_say_is_left():
    maps, jobs = FakeMaps(), [FakeJob("a", 1), FakeJob("b", 2)]
    shares = Shares("srpt", 100 * MBIT, maps, dscp=(46, 0))
    maps.left = {1: wire.pace_encode(8 << 20), 2: wire.pace_encode(2 << 20)}
    t = run(shares, maps, jobs, 0.2, 0.0, {"a", "b"})
    assert rate_kbps(maps, 2) > 100 * rate_kbps(maps, 1)
    assert shares.describe(jobs[0])["share"] == sp.SRPT_FLOOR
    assert (maps.paces[2].dscp, maps.paces[1].dscp) == (46, 0)
    assert shares.describe(jobs[1])["remaining_bytes"] == 2 * (2 << 20)
    maps.left[2] = wire.pace_encode(16 << 20)   # b's next call is the larger one
    run(shares, maps, jobs, 2 * TICK_S, t, {"a", "b"})
    assert maps.paces[1].dscp == 46 and shares.describe(jobs[1])["share"] == sp.SRPT_FLOOR


@pytest.mark.parametrize("dscp", [(), (46, 0)])
def test_srpt_holds_the_waiting_jobs_to_their_floor(dscp):
    """With marks too: a waiting job sending more than its floor would fill
    the lower classes of a fabric's priority queues, where control traffic
    waits as well (in the lab its workers lost the box)."""
    maps, jobs = FakeMaps(), [FakeJob("a", 1), FakeJob("b", 2)]
    shares = Shares("srpt", 100 * MBIT, maps, dscp=dscp)
    maps.left = {1: wire.pace_encode(8 << 20), 2: wire.pace_encode(2 << 20)}
    run(shares, maps, jobs, 0.2, 0.0, {"a", "b"})
    assert rate_kbps(maps, 2) > 100 * rate_kbps(maps, 1)
    assert rate_kbps(maps, 1) == pytest.approx(100_000 * sp.SRPT_FLOOR / 2, rel=2e-3)


def test_a_job_that_ends_is_forgotten_and_its_part_given_back():
    maps, jobs = FakeMaps(), [FakeJob("a", 1), FakeJob("b", 2)]
    shares = Shares("fair", 100 * MBIT, maps)
    t = run(shares, maps, jobs, 0.1, 0.0, {"a", "b"})
    run(shares, maps, jobs[:1], TICK_S, t, {"a"})
    assert shares.describe(jobs[1]) is None
    assert rate_kbps(maps, 1) == pytest.approx(50_000, rel=2e-3)


def test_a_job_whose_call_ended_gives_its_part_back_at_the_next_round():
    maps, jobs = FakeMaps(), [FakeJob("a", 1), FakeJob("b", 2)]
    shares = Shares("fair", 100 * MBIT, maps, packet_bytes=1024)
    t = run(shares, maps, jobs, 0.2, 0.0, {"a", "b"})
    maps.left[2] = wire.pace_encode(1024)      # b's last packet of its call
    run(shares, maps, jobs, 2 * TICK_S, t, {"a"})   # well within IDLE_S
    assert rate_kbps(maps, 1) == pytest.approx(50_000, rel=2e-3)
    # Its next call's first DATA says more is left: back to halves.
    maps.left[2] = wire.pace_encode(1 << 20)
    run(shares, maps, jobs, 2 * TICK_S, t + 2 * TICK_S, {"a", "b"})
    assert rate_kbps(maps, 1) == pytest.approx(25_000, rel=2e-3)
