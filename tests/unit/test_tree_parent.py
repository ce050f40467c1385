"""A parent box's side of a tree of boxes (switch/jobs.py, switch/children.py):
ranks that join from one rack box's ip:port with "rack": true are one member
of the data plane at the lowest of their ranks; direct members keep theirs.
The rack box's side: test_tree_control.py."""
from __future__ import annotations

import pytest

from switchml_xdp.switch.jobs import ControlError, JobTable
from tree_maps import TreeMaps

RACK_A, RACK_B, DIRECT = "10.0.1.1", "10.0.2.1", "10.0.0.14"
PORT = 48864


def join(table, rank, ip, rack, world=5, job="t"):
    msg = {"job": job, "world": world, "rank": rank, "port": PORT, "ip": ip, "rack": rack}
    return table.join(msg, None, ip)


def tree_job():
    """Ranks 0 and 2 behind rack A, 1 and 3 behind rack B, 4 direct."""
    maps = TreeMaps()
    table = JobTable(maps, 8, 256, 16)
    for rank, ip, rack in [(2, RACK_A, True), (1, RACK_B, True), (0, RACK_A, True),
                           (4, DIRECT, False), (3, RACK_B, True)]:
        job = join(table, rank, ip, rack)
    return maps, table, job


def test_a_rack_box_is_one_member_at_its_lowest_rank():
    maps, table, job = tree_job()
    assert job.state == "running" and job.world == 5
    e = maps.entries[job.id]
    assert e.world == 3 and e.rank_mask == 0b10011 and e.uplink is None
    assert maps.member_rows[job.id] == {0: (RACK_A, PORT), 1: (RACK_B, PORT), 4: (DIRECT, PORT)}


def test_a_rack_rank_is_told_its_group_and_wire_rank():
    _, table, job = tree_job()
    reply = table.join_reply(job, 2)
    assert reply["rack"] == {"ranks": [0, 2], "rank": 0}
    assert table.join_reply(job, 3)["rack"] == {"ranks": [1, 3], "rank": 1}
    for key in ("job_id", "key", "result_key", "auth", "slots", "seq_base", "group", "world"):
        assert key in reply
    assert reply["world"] == 5 and reply["rank"] == 2
    assert "rack" not in table.join_reply(job, 4)


def test_describe_shows_the_children():
    _, table, job = tree_job()
    d = job.describe()
    assert d["members"]["2"]["rack"] == f"{RACK_A}:{PORT}" and "rack" not in d["members"]["4"]
    assert d["children"] == [{"box": f"{RACK_A}:{PORT}", "rank": 0, "ranks": [0, 2]},
                             {"box": f"{RACK_B}:{PORT}", "rank": 1, "ranks": [1, 3]}]
    # What the state file keeps comes back as it was (a daemon that re-adopts).
    again = JobTable(TreeMaps(), 8, 256, 16).adopt(d, None)
    assert again.describe()["children"] == d["children"]


def test_leases_and_leaves_stay_per_rank_and_the_end_clears_every_row():
    maps, table, job = tree_job()
    job_id = job.id
    for rank in (0, 1, 2, 3):
        assert not table.leave(job, rank)
    assert table.leave(job, 4)
    assert job_id not in maps.entries and not maps.member_rows[job_id]
    assert not maps.job_active(job_id)


def test_two_workers_on_one_address_are_still_refused():
    table = JobTable(TreeMaps(), 8, 256, 16)
    join(table, 0, DIRECT, False, world=3)
    with pytest.raises(ControlError, match="one host is one member of a job"):
        join(table, 1, DIRECT, False, world=3)


@pytest.mark.parametrize("first, second", [(True, False), (False, True)])
def test_a_rack_box_and_a_worker_cannot_share_an_address(first, second):
    table = JobTable(TreeMaps(), 8, 256, 16)
    join(table, 0, RACK_A, first, world=3)
    with pytest.raises(ControlError, match=r"rank 0 of job 't' joined from 10\.0\.1\.1:48864 "
                                           r".*a rack box or a worker, not both"):
        join(table, 1, RACK_A, second, world=3)
    assert list(table.jobs["t"].members) == [0]   # the refused join left no trace


def test_a_flat_job_is_unchanged():
    maps = TreeMaps()
    table = JobTable(maps, 8, 256, 16)
    join(table, 0, "10.0.0.11", False, world=2)
    job = join(table, 1, "10.0.0.12", False, world=2)
    e = maps.entries[job.id]
    assert e.rank_mask is None and e.ranks == 0b11 and e.world == 2
    assert "children" not in job.describe() and "rack" not in table.join_reply(job, 0)
