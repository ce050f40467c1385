"""A job over the lab's boxes as `swml-lab demo`, `train` and `bench` run it:
a switch on every box, told its port's rate where the port is shaped, and
each box's share of the job, printed from the per-box part of
Worker.stats() (`"boxes"`: address, datapath, the capacity the box told,
packets, retransmissions), one or more ranks' summed (docs/scale-out.md)."""
from __future__ import annotations

import contextlib
from collections.abc import Sequence

from .cluster import SwitchProcess
from .namespace_lab import Lab


def capacity_args(box_rate: float | None) -> list[str]:
    """`swml-switch up --capacity` for a box whose port is shaped to box_rate
    Mbit/s: what it tells joiners, instead of its veth's link speed."""
    return ["--capacity", f"{box_rate:g}M"] if box_rate else []


def switches_on_every_box(stack: contextlib.ExitStack, lab: Lab, args: Sequence[str] = (),
                          box_rate: float | None = None) -> list[SwitchProcess]:
    """`swml-switch up ARGS` on each of the lab's boxes, in order; each stops
    when `stack` closes (also when a later one fails to come up)."""
    return [stack.enter_context(SwitchProcess(lab, [*args, *capacity_args(box_rate)], box=b))
            for b in range(len(lab.switches))]


def box_lines(per_rank: Sequence[Sequence[dict]], what: str) -> list[str]:
    """A heading (what the counts cover) and a line a box; nothing for a
    job over one box (its stats have no "boxes")."""
    per_rank = [boxes for boxes in per_rank if boxes]
    if not per_rank:
        return []
    lines = [f"per box, {what}:"]
    total = sum(b["packets_sent"] for boxes in per_rank for b in boxes) or 1
    for i, box in enumerate(per_rank[0]):
        sent = sum(boxes[i]["packets_sent"] for boxes in per_rank)
        retx = sum(boxes[i]["retransmissions"] for boxes in per_rank)
        told = (f"capacity {box['capacity_bps'] / 1e6:g} Mbit/s" if box.get("capacity_bps")
                else "capacity not told")
        lines.append(f"  box {box['box']:<15} {box['backend']:>5}, {told}: {sent} packets "
                     f"({100 * sent / total:.1f}%), {retx} retransmissions")
    return lines
