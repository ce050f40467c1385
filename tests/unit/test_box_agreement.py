"""What the ranks of a `swml` group agree on when boxes are lost
(torch/box_agreement.py): the same decision from the same posts, on every
rank."""
from __future__ import annotations

import pytest

from switchml_xdp.client.boxes import split
from switchml_xdp.torch.box_agreement import (
    Agreement,
    FailoverError,
    agree,
    post,
    remaining,
    retry_due,
    retry_every,
    returning,
)

BOXES = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


def test_the_lost_boxes_are_the_union_of_every_ranks_in_list_order():
    posts = [post(7, ["10.0.0.3"]), post(7, ["10.0.0.2", "10.0.0.3"]), post(7, [])]
    assert agree(posts, BOXES) == Agreement(7, ("10.0.0.2", "10.0.0.3"), ())


def test_a_rank_that_completed_the_call_redoes_it_with_the_others():
    """Rank 1 had every result of call 7 before the box died: it is in call
    8 (or idle after 7); call 7 is the one to redo, and rank 1 is ahead."""
    posts = [post(7, ["10.0.0.2"]), post(8, []), post(7, ["10.0.0.2"])]
    assert agree(posts, BOXES) == Agreement(7, ("10.0.0.2",), (1,))


def test_posts_more_than_a_call_apart_are_an_error_not_a_guess():
    with pytest.raises(FailoverError, match="out of step"):
        agree([post(7, ["10.0.0.2"]), post(9, [])], BOXES)


def test_every_rank_decides_the_same_from_the_same_posts():
    posts = [post(3, ["10.0.0.1"]), post(4, ["10.0.0.3"])]
    decisions = {agree(list(posts), BOXES) for _ in range(3)}
    assert len(decisions) == 1


def test_the_split_over_the_boxes_left_is_that_of_a_worker_built_over_them():
    left = remaining(BOXES, ["10.0.0.2"])
    assert left == ["10.0.0.1", "10.0.0.3"]
    caps = {"10.0.0.1": 10**9, "10.0.0.2": 10**9, "10.0.0.3": 2 * 10**9}
    assert split(1000, 8, [caps[b] for b in left]) == [(0, 336), (336, 1000)]
    assert remaining(BOXES, BOXES) == []


def test_boxes_come_back_only_when_every_rank_reached_them():
    current = ["10.0.0.1"]
    assert returning(BOXES, current, [["10.0.0.2", "10.0.0.3"], ["10.0.0.3"]]) == \
        ["10.0.0.1", "10.0.0.3"]
    assert returning(BOXES, current, [["10.0.0.2"], []]) == current
    assert returning(BOXES, [], [["10.0.0.2"], ["10.0.0.2"]]) == ["10.0.0.2"]


def test_the_lost_boxes_are_looked_at_every_n_calls_at_a_call_boundary(monkeypatch):
    assert [c for c in range(12) if retry_due(c, ["10.0.0.2"], 5)] == [5, 10]
    assert not any(retry_due(c, [], 5) for c in range(12))     # nothing lost: never
    monkeypatch.setenv("SWML_BOX_RETRY_CALLS", "20")
    assert retry_every() == 20
    monkeypatch.delenv("SWML_BOX_RETRY_CALLS")
    assert retry_every() == 100
    for bad in ("0", "-3", "often"):
        monkeypatch.setenv("SWML_BOX_RETRY_CALLS", bad)
        with pytest.raises(ValueError, match="SWML_BOX_RETRY_CALLS must be a positive number"):
            retry_every()
