"""What every rank of a `swml` group agrees on when a call loses boxes
(box_failover.py; docs/pytorch.md, "A lost box"): pure functions of what
the ranks posted, so that every rank, given the same posts, decides the same.

A rank posts, for the failure it saw (or heard of): the first call it has
not completed, and the boxes it found lost. The agreement is the earliest
such call (a rank that received every result of call c before the box died
has moved on to c + 1, or sits idle after c: it redoes c with the others,
from the input it kept), the union of the lost boxes, and which ranks are
ahead. Boxes come back at call boundaries only, every `every` calls, and
only when every rank reached them: never from one rank's timing.

A rank whose job goes through a tree of boxes (its box a rack box) says
so in its post: such a job lives or dies whole (the parent aborts it on
every rack when any box of the tree is lost: docs/scale-out.md, "Faults"),
so every rank then counts all of its own boxes lost, whichever box it saw
go (its own rack box, an abort from it naming another, or only an
interrupt), and every rank goes to Gloo alike.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

RETRY_ENV = "SWML_BOX_RETRY_CALLS"
RETRY_EVERY_CALLS = 100


class FailoverError(RuntimeError):
    """The group could not go on without the lost boxes: says why (every
    rank raises it for the same call)."""


@dataclasses.dataclass(frozen=True)
class Agreement:
    call: int                   # the call every rank redoes
    lost: tuple[str, ...]       # the boxes lost, in the job's list order
    ahead: tuple[int, ...]      # ranks that had completed `call` already
    why: tuple[int, str] | None = None  # the first rank (in rank order) that said why, and what


def post(first_unfinished: int, lost: Sequence[str], tree: bool = False, why: str = "") -> dict:
    """What a rank posts: tree, whether its job goes through a tree of boxes;
    why, its failure's words (where it had one)."""
    return {"call": int(first_unfinished), "lost": sorted(set(lost)), "tree": bool(tree),
            "why": why}


def agree(posts: Sequence[dict], boxes: Sequence[str]) -> Agreement:
    """The agreement from every rank's post (in rank order). A rank more
    than one call ahead cannot be (the ahead rank's next call needs every
    rank's packets): FailoverError if posts say so."""
    calls = [p["call"] for p in posts]
    first = min(calls)
    if max(calls) > first + 1:
        raise FailoverError(f"the ranks' posts disagree by more than one call ({calls}): "
                            "the group's calls are out of step")
    union = set().union(*(p["lost"] for p in posts))
    if any(p.get("tree") for p in posts):    # the module's docstring: all or nothing
        union = set(boxes)
    why = next(((r, p["why"]) for r, p in enumerate(posts) if p.get("why")), None)
    return Agreement(first, tuple(b for b in boxes if b in union),
                     tuple(r for r, c in enumerate(calls) if c > first), why)


def remaining(boxes: Sequence[str], lost: Sequence[str]) -> list[str]:
    """The boxes left, in list order: the split over them is that of a Worker
    built over this list (client/boxes.py), the same on every rank."""
    gone = set(lost)
    return [b for b in boxes if b not in gone]


def returning(all_boxes: Sequence[str], current: Sequence[str], reached: Sequence[Sequence[str]]
              ) -> list[str]:
    """The job's boxes for the next calls: the current ones and those every
    rank reached (`reached`: each rank's list), in the job's list order."""
    back = set.intersection(*(set(r) for r in reached)) if reached else set()
    keep = set(current) | back
    return [b for b in all_boxes if b in keep]


def retry_every() -> int:
    """Calls between two looks at the lost boxes (SWML_BOX_RETRY_CALLS, >= 1)."""
    raw = os.environ.get(RETRY_ENV)
    try:
        every = int(raw) if raw is not None else RETRY_EVERY_CALLS
    except ValueError:
        every = 0
    if every < 1:
        raise ValueError(f"{RETRY_ENV} must be a positive number of calls, not {raw!r}")
    return every


def retry_due(call: int, lost: Sequence[str], every: int) -> bool:
    """Whether the ranks look at the lost boxes before call `call` (the same
    on every rank: the call numbers are)."""
    return bool(lost) and call > 0 and call % every == 0
