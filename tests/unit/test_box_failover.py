"""The `swml` group's recovery from lost boxes (torch/box_failover.py), with
two ranks on threads sharing a store, and the switch and Gloo played by
fakes that sum what the ranks send (tests/support/failover_fakes.py): the
race where one rank received every result of a call before its box died
and the other did not, an idle rank that catches up, no box left, and boxes
that come back."""
from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is an optional extra")

from failover_fakes import WORLD, Cluster, Rank, on_both, outcome  # noqa: E402 - after the importorskip
from switchml_xdp.torch import box_failover  # noqa: E402
from switchml_xdp.torch.box_agreement import FailoverError  # noqa: E402


@pytest.fixture(autouse=True)
def no_reaching_out(monkeypatch):
    """The watcher's look at the lost boxes' control ports: none answers."""
    monkeypatch.setattr(box_failover.BoxFailover, "_reach", lambda self, box: False)


def test_a_call_lost_everywhere_is_redone_on_the_box_left():
    cluster = Cluster()
    cluster.job(0, []).fail[1] = {0: ["10.0.0.2"], 1: ["10.0.0.2"]}

    def body(r: Rank):
        return [r.call(r.rank() + 1.0)[0] for _ in range(3)], r.failover.boxes

    out = on_both(body, cluster)
    assert out[0] == out[1] == ([3.0, 3.0, 3.0], ["10.0.0.1"])
    assert cluster.jobs[1].boxes == ["10.0.0.1"]
    assert sorted(cluster.jobs[1].inputs) == [0, 1]         # call 1 redone, then call 2


def test_a_rank_that_had_the_result_redoes_the_call_with_the_others():
    """Rank 0 received every result of call 1 before the box died, rank 1
    did not: rank 0's call 2 is interrupted; both redo call 1 (rank 0 from
    the input it kept, dropping the same result), then call 2."""
    cluster = Cluster()
    cluster.job(0, []).fail[1] = {1: ["10.0.0.2"]}

    def body(r: Rank):
        return [r.call(10.0 * step + r.rank())[0] for step in range(4)]

    out = on_both(body, cluster)
    assert out[0] == out[1] == [1.0, 21.0, 41.0, 61.0]
    redo = cluster.jobs[1].inputs
    assert [redo[0][r][0] for r in range(WORLD)] == [10.0, 11.0]   # call 1's inputs, both ranks


def test_an_idle_rank_that_had_the_result_catches_up():
    """Rank 0 completed its last call before the box died and calls no
    more: its watcher joins it to the agreement and the redo."""
    cluster = Cluster()
    cluster.job(0, []).fail[1] = {1: ["10.0.0.2"]}

    def body(r: Rank):
        out = [r.call(10.0 * step + r.rank())[0] for step in range(2)]
        if r.rank() == 0:
            done = threading.Event()
            while r.failover.generation == 0 and not done.wait(0.05):
                pass
        return out

    assert on_both(body, cluster) == [[1.0, 21.0], [1.0, 21.0]]


def test_with_no_box_left_the_calls_go_to_gloo():
    cluster = Cluster()
    cluster.job(0, []).fail[1] = {0: ["10.0.0.1"], 1: ["10.0.0.1"]}

    def body(r: Rank):
        return [r.call(r.rank() + 1.0)[0] for _ in range(3)], r.worker, r.failover.boxes

    out = on_both(body, cluster, boxes="10.0.0.1")
    assert out[0] == out[1] == ([3.0, 3.0, 3.0], None, [])
    assert cluster.gloo_opened == WORLD


def test_with_no_box_left_a_call_one_rank_had_is_an_error_on_every_rank():
    """Gloo's sum would not be the switch's that rank 0 handed on already."""
    cluster = Cluster()
    cluster.job(0, []).fail[1] = {1: ["10.0.0.1"]}

    def body(r: Rank):
        return [outcome(lambda: r.call(1.0)[0]) for _ in range(3 - r.rank())]

    out = on_both(body, cluster, boxes="10.0.0.1")
    assert out[0][:2] == [2.0, 2.0] and out[1][0] == 2.0
    for r, e in ((0, out[0][2]), (1, out[1][1])):
        assert isinstance(e, FailoverError) and "no box is left to redo it exactly" in str(e), (r, e)


def test_lost_boxes_that_every_rank_reaches_come_back_at_a_call_boundary(monkeypatch):
    monkeypatch.setenv("SWML_BOX_RETRY_CALLS", "4")
    monkeypatch.setattr(box_failover, "REACH_EVERY_S", 0.05)
    cluster = Cluster()
    cluster.job(0, []).fail[1] = {0: ["10.0.0.2"], 1: ["10.0.0.2"]}
    back = threading.Event()
    monkeypatch.setattr(box_failover.BoxFailover, "_reach", lambda self, box: back.is_set())

    def body(r: Rank):
        seen = []
        for step in range(9):
            if step == 2:
                back.set()
                threading.Event().wait(0.3)     # both watchers reach it
            r.call(1.0)
            seen.append(len(r.failover.boxes))
        return seen

    out = on_both(body, cluster)
    assert out[0] == out[1] == [2, 1, 1, 1, 2, 2, 2, 2, 2]   # back before call 4, on both
    assert cluster.jobs[2].boxes == ["10.0.0.1", "10.0.0.2"]


def test_a_box_is_back_only_by_a_try_that_began_after_it_was_lost():
    """A try that reached the box before it was lost says nothing of now."""
    r = Rank(Cluster(), 0)
    try:
        f = r.failover
        f._stop.set()       # no watcher's try meanwhile
        f._watcher.join()
        f._probes["10.0.0.1"] = (f._lost_at.get("10.0.0.1", 0.0) - 1.0, True)   # while it served
        f._set_boxes(["10.0.0.2"])
        assert f._reached() == []
        f._probes["10.0.0.1"] = (f._lost_at["10.0.0.1"] + 0.001, True)
        assert f._reached() == ["10.0.0.1"]
        f._probes["10.0.0.1"] = (f._lost_at["10.0.0.1"] + 0.002, False)
        assert f._reached() == []
        f._set_boxes(["10.0.0.1", "10.0.0.2"])
        assert "10.0.0.1" not in f._lost_at
    finally:
        r.close()
