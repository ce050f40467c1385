"""A job over several boxes (client/boxes.py): the box list, the split of a
tensor by capacity (the same on every rank: integers only), and a box's
refusal of a rank that lists other boxes than the job's first rank."""
from __future__ import annotations

import numpy as np
import pytest

from switchml_xdp.client.boxes import (
    block_shares,
    box_port,
    lost_boxes,
    named,
    parse_switches,
    ports_used,
    split,
)
from switchml_xdp.client.calls import Call, CallMismatch


def test_one_box_or_several():
    assert parse_switches("10.0.0.1") == ["10.0.0.1"]
    assert parse_switches("10.0.0.1, 10.0.0.2") == ["10.0.0.1", "10.0.0.2"]
    assert parse_switches(["10.0.0.2", "10.0.0.1"]) == ["10.0.0.2", "10.0.0.1"]   # order kept


@pytest.mark.parametrize("bad, words", [
    ("", "one box or several"), ("10.0.0.1,", "one box or several"), ([], "one box or several"),
    ("10.0.0.1,10.0.0.1", "given twice"), (",".join(f"10.0.0.{i}" for i in range(1, 10)), "at most 8"),
])
def test_a_bad_box_list_is_one_clear_error(bad, words):
    with pytest.raises(ValueError, match=words):
        parse_switches(bad)


def test_shares_follow_capacity_and_sum_to_the_blocks():
    assert block_shares(100, [10**9, 10**9]) == [50, 50]
    assert block_shares(100, [2 * 10**9, 10**9, 10**9]) == [50, 25, 25]
    assert block_shares(7, [1, 1, 1]) == [3, 2, 2]              # the remainder to the earlier
    assert block_shares(10, [100, 100, 200]) == [3, 2, 5]       # largest fractions first, ties early
    assert block_shares(9, [10**9, None]) == [5, 4]             # one unknown: equal parts
    rng = np.random.default_rng(3)
    for _ in range(500):
        caps = [int(c) for c in rng.integers(1, 10**11, int(rng.integers(1, 9)))]
        blocks = int(rng.integers(0, 10**5))
        shares = block_shares(blocks, caps)
        assert sum(shares) == blocks and min(shares) >= 0
        exact = [blocks * c / sum(caps) for c in caps]
        assert all(abs(s - e) < 1 for s, e in zip(shares, exact))


def test_parts_are_whole_blocks_in_order():
    k = 256
    parts = split(10 * k + 5, k, [10**9, 10**9])
    assert parts == [(0, 6 * k), (6 * k, 10 * k + 5)]
    assert split(3, k, [1, 1, 1]) == [(0, 3), (3, 3), (3, 3)]   # one block: one box


def test_a_failure_names_its_box_and_keeps_its_type():
    class Box:
        address = "10.0.0.2"
    call = Call(4, "j", 100, "float32", "sum")
    e = named(Box(), call, CallMismatch("the ranks did not make the same call"))
    assert isinstance(e, CallMismatch) and str(e).startswith("box 10.0.0.2: ")
    e = named(Box(), call, TimeoutError("no result from the switch for 2 s"))
    assert isinstance(e, TimeoutError) and "box 10.0.0.2" in str(e)
    aborted = RuntimeError("job 'j' was aborted: box stopped")
    aborted.lost_boxes = ("10.0.0.2",)
    assert lost_boxes(named(Box(), call, aborted)) == ("10.0.0.2",)   # a new error, still listing it


def test_a_worker_s_ports_are_its_boxes_times_its_lanes():
    assert [box_port(48864, i, 2) for i in range(3)] == [48864, 48866, 48868]
    assert ports_used("10.0.0.1,10.0.0.2", 4) == 8 and ports_used("10.0.0.1", 1) == 1


def test_a_box_refuses_a_rank_that_lists_other_boxes():
    from switchml_xdp.switch.control import ControlError
    from switchml_xdp.switch.jobs import JobTable
    from switchml_xdp.switch.userspace import MemoryMaps

    table = JobTable(MemoryMaps(k=8, slots=64), 8, 64, 16)
    first = {"job": "j", "world": 2, "port": 47000, "boxes": "10.0.0.1,10.0.0.2"}
    table.join({**first, "rank": 0, "ip": "10.0.0.11"}, None, "10.0.0.11")
    with pytest.raises(ControlError, match="list different boxes: 10.0.0.1,10.0.0.2 and, from "
                                           "rank 1, 10.0.0.1,10.0.0.3"):
        table.join({**first, "rank": 1, "ip": "10.0.0.12", "boxes": "10.0.0.1,10.0.0.3"}, None,
                   "10.0.0.12")
    with pytest.raises(ControlError, match="this one only"):
        table.join({**first, "rank": 1, "ip": "10.0.0.12", "boxes": None}, None, "10.0.0.12")
    table.join({**first, "rank": 1, "ip": "10.0.0.12"}, None, "10.0.0.12")   # the same list: in
