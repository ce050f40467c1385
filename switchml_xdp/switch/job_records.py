"""The records of the control plane's jobs: a job, its members, what a rack
box's job starts from, and the errors the control plane answers with
(jobs.py keeps the table of them).

The first join of a name fixes the job's token (only its SHA-256 is kept);
every later join, and resume/leave/heartbeat, must present the same token
(docs/security.md).
"""
from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass, field

from .. import wire
from .children import wire_members
from .maps import UplinkEntry


class ControlError(Exception):
    """A request the control plane refuses; the message goes back to the client."""


class JobStartFailed(ControlError):
    """The barrier completed but the job could not get an id or slots: every
    rank that waited is told, and the job is gone."""

    def __init__(self, job: Job, reason: str):
        super().__init__(reason)
        self.job = job


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass
class Member:
    rank: int
    ip: str
    port: int
    mac: str
    conn: object = None          # the control connection, to push events on
    last_seen: float = field(default_factory=time.monotonic)
    left: bool = False
    rack: bool = False           # behind the rack box at ip:port (a tree: children.py)


@dataclass(frozen=True)
class ParentPlan:
    """How a rack box's job starts, as its parent box's join replies said
    (docs/scale-out.md, "A tree of boxes"): the parent's window and first seq,
    this box's ranks, and its way up."""
    slots: int
    seq_base: int
    ranks: tuple[int, ...]
    uplink: UplinkEntry


@dataclass
class Job:
    name: str
    id: int | None                # None until the barrier completes
    world: int
    port: int                     # the workers' UDP port (RESULTs go there)
    slot_base: int | None         # the slot range, also taken at the barrier
    slot_count: int
    token_hash: bytes | None = None   # SHA-256 of the job's token; None: an open job
    # The data key every DATA packet carries (drawn at the barrier, told to the
    # members in the join reply, kept only in the data plane's jobs map after).
    key: int | None = None
    # The key of its RESULTs' authenticator (drawn at the barrier too, told
    # only in the join reply: unlike the data key, it never goes on the wire).
    result_key: bytes | None = None
    seq_base: int = 0             # the seq of the job's first packet
    members: dict[int, Member] = field(default_factory=dict)
    state: str = "joining"        # joining -> running -> ended
    created: float = field(default_factory=time.time)
    failure: str | None = None    # why a job ended before it started (told to its joiners)
    boxes: str | None = None      # the boxes its ranks join, as its first rank listed them
    # Under `swml-switch up --share` (shares.py): its weight (asked at join,
    # capped at --max-weight, or set by the operator), a DSCP mark the
    # operator pinned, and the ranks that send to this box (set at start).
    weight: float = 1.0
    dscp: int | None = None
    senders: int = 0
    # Its lanes, as its first rank asked (every rank the same): rank r sends
    # slot s from port + s mod lanes and gets its RESULT there (swml_maps.h).
    lanes: int = 1

    @property
    def protected(self) -> bool:
        return self.token_hash is not None

    def check_token(self, token) -> None:
        """Refuse (ControlError) unless `token` is this job's token. An open
        job (no token at its first join) takes requests without one."""
        if self.token_hash is None:
            if token is not None:
                raise ControlError(f"job {self.name!r} was opened without a token; "
                                   f"a rank with a token cannot join it")
            return
        if not isinstance(token, str):
            raise ControlError(f"job {self.name!r} needs its token")
        if not hmac.compare_digest(token_digest(token), self.token_hash):
            raise ControlError(f"wrong token for job {self.name!r}")

    @property
    def group(self) -> tuple[str, str | None]:
        return wire.group_of_job(self.id) if self.id is not None else (None, None)

    def missing_ranks(self) -> list[int]:
        return [r for r in range(self.world) if r not in self.members]

    def describe(self) -> dict:
        gip, gmac = self.group
        out = {"name": self.name, "id": self.id, "world": self.world, "state": self.state,
               "protected": self.protected, "port": self.port, "lanes": self.lanes,
               "slot_base": self.slot_base, "slots": self.slot_count,
               "weight": self.weight, "dscp": self.dscp,
               "group": {"ip": gip, "mac": gmac},
               "members": {str(r): {"ip": m.ip, "port": m.port, "mac": m.mac, "left": m.left,
                                    **({"rack": f"{m.ip}:{m.port}"} if m.rack else {})}
                           for r, m in sorted(self.members.items())}}
        children = [w for w in wire_members(self.members.values()) if w.rack]
        if children:
            out["children"] = [{"box": w.address, "rank": w.rank, "ranks": list(w.ranks)}
                               for w in children]
        return out
