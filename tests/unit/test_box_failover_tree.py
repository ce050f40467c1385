"""The `swml` group's recovery when its job goes through a tree of boxes
(torch/box_agreement.py; docs/pytorch.md, "A lost box"): each rank's
SWML_SWITCH is its own rack box, so a rack box lost is seen differently on
each rack (BoxLost naming it on its own, an abort from their own box or
only an interrupt on the others), and every rank must still decide alike:
Gloo for all. Two ranks on threads, the switch and Gloo played by the fakes
of tests/support/failover_fakes.py."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is an optional extra")

from failover_fakes import WORLD, Cluster, Rank, on_both  # noqa: E402 - after the importorskip
from switchml_xdp.torch import box_failover  # noqa: E402
from switchml_xdp.torch.box_agreement import Agreement, agree, post  # noqa: E402

PARENT = "10.0.0.1"
RACK_BOXES = ("10.0.1.1", "10.0.2.1")    # rank r's rack box


class RackRank(Rank):
    """A rank whose job goes through its rack's box, a child of PARENT."""

    parent = PARENT

    def __init__(self, cluster: Cluster, rank: int, boxes: str = ""):
        super().__init__(cluster, rank, RACK_BOXES[rank])


@pytest.fixture(autouse=True)
def said(monkeypatch) -> list[str]:
    """Every warning of the failover (and no look at the lost boxes' ports)."""
    out: list[str] = []
    monkeypatch.setattr(box_failover.BoxFailover, "_reach", lambda self, box: False)
    monkeypatch.setattr(box_failover.BoxFailover, "_say", lambda self, message: out.append(message))
    return out


def _three_calls(r: Rank):
    return [r.call(r.rank() + 1.0)[0] for _ in range(3)], r.worker, r.failover.boxes


@pytest.mark.parametrize("other", ["interrupted", "aborted by its own box"])
def test_a_rack_box_lost_sends_every_rack_to_gloo(other, said):
    """Rank 0's rack box is lost (BoxLost naming it); rank 1's own box is
    alive: it is interrupted by rank 0's post, or fails first with the
    abort its box passed on (its own box among the call's lost boxes).
    Either way both redo the call on Gloo, and both warnings say why."""
    cluster = Cluster()
    fail = {0: [RACK_BOXES[0]]}
    if other != "interrupted":
        fail[1] = [RACK_BOXES[1]]
    job = cluster.job(0, [])
    job.fail[1], job.unsent = fail, {1}     # rank 0's box went before its packets: no result
    out = on_both(_three_calls, cluster, make=RackRank)
    assert out[0] == out[1] == ([3.0, 3.0, 3.0], None, [])
    assert cluster.gloo_opened == WORLD and set(cluster.jobs) == {0}   # no new job on a box
    assert len(said) == WORLD, said
    for rank, message in enumerate(sorted(said, key=lambda m: RACK_BOXES[1] in m)):
        assert f"box(es) {RACK_BOXES[rank]} lost at swml call #1" in message, message
        assert "gloo (no box left)" in message
        assert f"(rank 0: box {RACK_BOXES[0]}: the box is lost)" in message, message


def test_without_a_tree_a_rank_keeps_the_boxes_no_rank_lost():
    """The rule is the tree's: over boxes of its own a rank keeps those
    that no rank lost (the several-boxes failover, unchanged)."""
    posts = [post(4, ["10.0.0.2"]), post(4, [])]
    assert agree(posts, ["10.0.0.1", "10.0.0.2"]).lost == ("10.0.0.2",)
    assert agree(posts, ["10.0.0.3"]).lost == ()


def test_in_a_tree_every_rank_counts_all_of_its_boxes_lost_whatever_it_saw():
    posts = [post(4, [RACK_BOXES[0]], tree=True, why="box 10.0.1.1: the box is lost"),
             post(5, [], tree=True)]
    for boxes in ([RACK_BOXES[0]], [RACK_BOXES[1]]):
        assert agree(posts, boxes) == Agreement(4, tuple(boxes), (1,),
                                                (0, "box 10.0.1.1: the box is lost"))
    # One rank in a tree is enough (a rank on the parent directly says no tree).
    assert agree([post(4, [], tree=False), post(4, [], tree=True)], [PARENT]).lost == (PARENT,)
