"""A parent box's view of a tree job's members (docs/scale-out.md, "A tree of
boxes"): the ranks that joined with `"rack": true` from one rack box's
ip:port are one member of the data plane, a child, whose wire rank is the
lowest global rank behind it; a rank that joined the parent directly is a
member of its own. jobs.py keeps the ranks; this says what the data plane
sees of them."""
from __future__ import annotations

from dataclasses import dataclass

# Boxes watch each other closer than workers: a rack box heartbeats its
# parent every TREE_HEARTBEAT_S, and each takes the other for lost after
# TREE_LEASE_S of silence (at most the job's lease), so that a box that goes
# dark (power, cable) fails the job on every rank within 2 s, as a lost box
# does for its own workers (docs/scale-out.md, "Faults").
TREE_HEARTBEAT_S = 0.25
TREE_LEASE_S = 1.5


@dataclass(frozen=True)
class WireMember:
    """One member of a job in the data plane: a rank, or a rack box with the
    ranks behind it."""
    rank: int                     # its rank on the wire (a child: its lowest rank)
    ip: str
    port: int
    ranks: tuple[int, ...]        # the global ranks it speaks for
    rack: bool = False

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"


def wire_members(members) -> list[WireMember]:
    """The data plane's members of a job, by wire rank: `members` are the
    job's Member rows (rank, ip, port, rack)."""
    direct, racks = [], {}
    for m in members:
        if m.rack:
            racks.setdefault((m.ip, m.port), []).append(m.rank)
        else:
            direct.append(WireMember(m.rank, m.ip, m.port, (m.rank,)))
    children = [WireMember(min(ranks), ip, port, tuple(sorted(ranks)), rack=True)
                for (ip, port), ranks in racks.items()]
    return sorted(direct + children, key=lambda w: w.rank)


def rank_mask(ranks) -> int:
    """Bit r set for each rank r (the data plane's rank_mask)."""
    mask = 0
    for r in ranks:
        mask |= 1 << r
    return mask


def child_of(members, rank: int) -> WireMember | None:
    """The child (rack box) that `rank` is behind, or None for a direct member."""
    for w in wire_members(members):
        if w.rack and rank in w.ranks:
            return w
    return None
