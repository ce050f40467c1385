"""A job's lanes in xdp/swml_switch.c (swml_maps.h, lane_mask;
docs/performance.md, "Several queues per worker"): slot s belongs to lane
s mod lanes; its DATA is taken only from the member's port + lane, and its
RESULT goes to the job's port + lane, as the user-space data plane does
(tests/unit/test_dataplanes.py). Through BPF_PROG_TEST_RUN."""
from __future__ import annotations

from dataclasses import replace

import pytest

from switchml_xdp import wire
from xdp_tester import Action, only, vec

LANES = 4


@pytest.mark.parametrize("slot", range(8))
def test_a_slot_s_result_goes_to_the_port_of_its_lane(sw, slot):
    job = sw.add_job(world=2, slot_count=8, result_port=40100, lanes=LANES)
    run = sw.round(job, slot, [vec(1, 2), vec(10, 20)])
    assert run.action == Action.TX
    res = sw.result(run)
    assert res.frame.dst == replace(job.group, port=40100 + slot % LANES)
    assert list(res.values[:2]) == [11, 22]
    assert sw.counters() == only(rx=2, aggregated=1, completed=1)


def test_data_from_another_lane_s_port_is_not_the_member_s(sw):
    """The member's address with the wrong lane's port: a stranger's
    packet, dropped before it reaches a slot."""
    job = sw.add_job(world=2, slot_count=8, lanes=LANES)
    m = sw.member(job, 0)
    for port in (m.port, m.port + 2, m.port + LANES + 1, m.port - 1):
        run = sw.run(sw.data(job, 0, slot=1, src=replace(m, port=port)))
        assert run.action == Action.DROP
    assert sw.counters() == only(rx=4, bad_source=4)
    # From lane 1's port: taken.
    assert sw.run(sw.data(job, 0, slot=1, src=replace(m, port=m.port + 1))).action == Action.DROP
    assert sw.counters() == only(rx=5, bad_source=4, aggregated=1)


def test_a_shadow_reply_goes_back_to_the_lane_s_port(sw):
    job = sw.add_job(world=2, slot_count=8, lanes=LANES)
    sw.round(job, 3, [vec(5), vec(6)])
    run = sw.run(sw.data(job, 1, slot=3, values=vec(9), flags=wire.FLAG_RETRANS))
    assert run.action == Action.TX
    res = sw.result(run)
    m = sw.member(job, 1)
    assert res.frame.dst == replace(m, port=m.port + 3) and res.values[0] == 11


def test_one_lane_is_the_member_s_port_itself(sw):
    """lanes = 1 (lane_mask 0), every job before lanes: one port, as ever."""
    job = sw.add_job(world=2, slot_count=8, result_port=40200)
    m = sw.member(job, 0)
    assert sw.run(sw.data(job, 0, slot=3, src=replace(m, port=m.port + 3))).action == Action.DROP
    assert sw.counters()["bad_source"] == 1
    res = sw.result(sw.round(job, 3, [vec(1), vec(2)]))
    assert res.frame.dst.port == 40200
