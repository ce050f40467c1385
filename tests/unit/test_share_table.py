"""The job table under `--share` (switch/jobs.py): weights asked at join
and capped, the operator's changes and their refusals, slot quotas by
weight, over the in-memory maps (no root)."""
from __future__ import annotations

import pytest

from switchml_xdp.switch.jobs import ControlError, JobTable
from switchml_xdp.switch.shares import Shares
from switchml_xdp.switch.userspace import MemoryMaps

SLOTS = 1024


def table(job_slots: int = SLOTS, share: str = "weighted") -> JobTable:
    maps = MemoryMaps(k=8, slots=SLOTS)
    t = JobTable(maps, 8, SLOTS, job_slots)
    t.shares = Shares(share, 100_000_000, maps, max_weight=4)
    return t


def start(t: JobTable, name: str, n: int, weight=None):
    """A job of one rank (it starts at its join) from host n."""
    ip = f"10.0.0.{10 + n}"
    return t.join({"job": name, "world": 1, "rank": 0, "port": 47000, "ip": ip, "weight": weight},
                  None, ip)


def test_a_join_asks_for_its_weight_capped_at_the_box_s():
    t = table()
    assert start(t, "a", 0).weight == 1.0
    assert start(t, "b", 1, 3).weight == 3.0
    assert start(t, "c", 2, 100).weight == 4.0       # --max-weight


def test_the_operator_sets_weights_and_marks_all_or_nothing():
    t = table()
    start(t, "a", 0)
    assert t.set_share("a", 2.5, 46).weight == 2.5
    for weight, dscp, words in [(0, None, "above zero"), (-1, None, "above zero"),
                                ("x", None, "above zero"), (5, None, "cap of 4"),
                                (2, 64, "0..63"), (2, True, "0..63")]:
        with pytest.raises(ControlError) as e:
            t.set_share("a", weight, dscp)
        assert words in str(e.value) and "\n" not in str(e.value)
    job = t.jobs["a"]
    assert (job.weight, job.dscp) == (2.5, 46)
    with pytest.raises(ControlError, match="no job 'nobody'"):
        t.set_share("nobody", 1)


def test_without_shares_the_operator_is_told_to_start_the_box_with_them():
    t = JobTable(MemoryMaps(k=8, slots=64), 8, 64, 16)
    start(t, "a", 0)
    with pytest.raises(ControlError, match="--share"):
        t.set_share("a", 2)


def test_no_job_takes_the_pool_and_a_later_one_still_finds_slots():
    """--job-slots as large as the pool: each job gets its weight's part,
    and there is always room left for the next."""
    t = table(job_slots=SLOTS)
    first = start(t, "a", 0)
    assert first.slot_count == SLOTS // 2                 # itself and one more job of weight 1
    heavy = start(t, "b", 1, 3)
    assert 0 < heavy.slot_count <= 3 * (SLOTS - first.slot_count) // 4
    for n in range(2, 6):
        job = start(t, f"j{n}", n)
        assert job.state == "running" and job.slot_count >= 8, (job.name, job.slot_count)
    assert t.pool.free > 0


def test_a_job_alone_without_shares_gets_its_job_slots():
    t = JobTable(MemoryMaps(k=8, slots=SLOTS), 8, SLOTS, SLOTS)
    assert start(t, "a", 0).slot_count == SLOTS


def test_a_restarted_daemon_keeps_a_job_s_weight_mark_and_senders():
    """What the state file says of a job (describe) is what adopt takes
    back: the weight and mark the operator set, and the ranks that send."""
    t = table()
    for rank in (0, 1):
        ip = f"10.0.0.{10 + rank}"
        t.join({"job": "a", "world": 2, "rank": rank, "port": 47000, "ip": ip}, None, ip)
    t.set_share("a", 3, 10)
    desc = t.jobs["a"].describe()
    again = table()
    job = again.adopt(desc, None)
    assert (job.weight, job.dscp, job.senders) == (3.0, 10, 2)
