"""A job's lanes in the control plane (switchml_xdp/switch/jobs.py): asked at
join, the same on every rank, a power of two; the job's slots a multiple of
them; told in the join reply, written to the data plane as lane_mask. Over
the in-memory maps, without a kernel."""
from __future__ import annotations

import pytest

from switchml_xdp import wire
from switchml_xdp.switch.job_records import ControlError
from switchml_xdp.switch.jobs import JobTable
from switchml_xdp.switch.request_fields import FieldError, validate
from switchml_xdp.switch.userspace import MemoryMaps


def join(table, job="j", rank=0, world=2, lanes=None, port=47000, **extra):
    msg = {"job": job, "world": world, "rank": rank, "port": port, "ip": f"10.0.0.{11 + rank}",
           **({"lanes": lanes} if lanes is not None else {}), **extra}
    return table.join(validate("join", msg), None, msg["ip"])


def test_lanes_are_asked_at_join_told_in_the_reply_and_written_as_a_mask():
    maps = MemoryMaps(k=8, slots=64)
    table = JobTable(maps, 8, 64, 16)
    join(table, lanes=4)
    job = join(table, rank=1, lanes=4)
    assert job.state == "running" and job.lanes == 4 and job.slot_count % 4 == 0
    assert maps.jobs[job.id]["lane_mask"] == 3
    assert table.join_reply(job, 0)["lanes"] == 4 and job.describe()["lanes"] == 4


def test_without_lanes_a_job_has_one():
    maps = MemoryMaps(k=8, slots=64)
    table = JobTable(maps, 8, 64, 16)
    join(table)
    job = join(table, rank=1)
    assert job.lanes == 1 and maps.jobs[job.id]["lane_mask"] == 0


def test_a_job_short_of_slots_gets_a_multiple_of_its_lanes():
    maps = MemoryMaps(k=8, slots=64)
    table = JobTable(maps, 8, 64, 54)
    join(table, "big", world=1)                       # 54 of 64: 10 left
    join(table, "small", lanes=4)
    job = join(table, "small", rank=1, lanes=4)
    assert job.state == "running" and job.slot_count == 8


def test_a_rank_asking_for_other_lanes_is_refused():
    table = JobTable(MemoryMaps(k=8, slots=64), 8, 64, 16)
    join(table, lanes=2)
    with pytest.raises(ControlError, match="job 'j' has 2 lane\\(s\\), this worker asks for 4"):
        join(table, rank=1, lanes=4)


@pytest.mark.parametrize("lanes, extra, reason", [
    (3, {}, "'lanes' must be a power of two, got 3"),
    (4, {"port": 65534}, "4 lanes from port 65534 need ports up to 65537: past 65535"),
])
def test_lanes_a_job_cannot_have_get_one_line_reasons(lanes, extra, reason):
    table = JobTable(MemoryMaps(k=8, slots=64), 8, 64, 16)
    with pytest.raises(ControlError, match=reason):
        join(table, lanes=lanes, **extra)
    assert not table.jobs


def test_a_rack_box_s_join_carries_lanes_from_its_one_port():
    """The uplink's port itself: no lane ports above it to check."""
    table = JobTable(MemoryMaps(k=8, slots=64), 8, 64, 16)
    assert join(table, lanes=4, port=65535, rack=True).lanes == 4


def test_a_rack_box_s_job_fails_to_start_in_a_window_its_lanes_do_not_divide():
    from switchml_xdp.switch.job_records import JobStartFailed, ParentPlan

    table = JobTable(MemoryMaps(k=8, slots=64), 8, 64, 16, below_parent=True)
    job = join(table, lanes=4)
    join(table, rank=1, lanes=4)
    with pytest.raises(JobStartFailed, match="window of 6 slots is not a multiple of its 4 lanes"):
        table.start_below(job, ParentPlan(6, 0, (0, 1), None))


@pytest.mark.parametrize("lanes", [0, wire.MAX_LANES * 2, "2"])
def test_lanes_out_of_the_field_s_range_are_refused_by_its_schema(lanes):
    with pytest.raises(FieldError, match="'lanes' must be"):
        validate("join", {"job": "j", "world": 2, "rank": 0, "port": 1, "ip": "10.0.0.1",
                          "lanes": lanes})
