"""The share loop of a box started with `swml-switch up --share POLICY`
(docs/operations.md, "Shares between jobs").

Every TICK_S it reads, for each running job, the DATA bytes the data plane
took in and what the job's ranks last said they have left of their call
(DataplaneMaps.read_job_progress), decides which jobs have data to send,
divides the box's capacity between them (share_policy.py), and writes each
job's per-rank rate and DSCP mark into the data plane (write_job_pace), which
stamps them into the job's RESULTs; the ranks' pacers keep to the rate
(docs/transport.md, "The box's rate"). A job that stops sending gives its
part back at the next tick after IDLE_S; one that leaves, at the next tick.

The jobs themselves (names, ids, weights, pinned marks) are the JobTable's:
this loop follows them, it keeps only what it measured.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field

from .. import wire
from .maps import DataplaneMaps, JobPace
from .share_policy import Demand, divide, dscp_marks, part_if_active

log = logging.getLogger("swml.shares")

TICK_S = 0.02        # how often the parts are recomputed: a few round trips
IDLE_S = 0.06        # a job whose DATA stopped this long has nothing to send ...
QUIET_TICKS = 3      # ... and for this many ticks in a row
RATE_TAU_S = 0.25    # the actual rate shown is an average over about this long
DEFAULT_MAX_WEIGHT = 8.0


@dataclass(frozen=True)
class ShareConfig:
    """`swml-switch up --share POLICY --max-weight W --dscp LIST`."""
    policy: str
    max_weight: float = DEFAULT_MAX_WEIGHT
    dscp: tuple[int, ...] = field(default_factory=tuple)


@dataclass
class Measured:
    """What the loop knows of one job between ticks."""
    job_id: int
    bytes: int = 0               # cumulative DATA frame bytes at the last tick
    active_at: float = -math.inf
    quiet: int = 0               # ticks in a row without new bytes
    served_at: float = 0.0       # when it was last served first (srpt's age)
    left: int = 0                # bytes into the box left of its call, as last said
    part: float = 0.0
    target_bps: float = 0.0
    actual_bps: float = 0.0
    dscp: int | None = None
    pace: JobPace | None = None  # what the data plane holds for it
    sampled_at: float | None = None


class Shares:
    """One box's parts, kept in its data plane."""

    def __init__(self, policy: str, capacity_bps: int, maps: DataplaneMaps,
                 max_weight: float = DEFAULT_MAX_WEIGHT, dscp: tuple[int, ...] = (),
                 packet_bytes: int = 0):
        """packet_bytes: the most payload a DATA packet carries (4 k): a job
        whose ranks said no more than that is left, and then sent nothing for
        a round, has finished its call and gives its part back at once."""
        self.policy, self.capacity_bps, self.maps = policy, capacity_bps, maps
        self.packet_bytes = packet_bytes
        self.max_weight, self.dscp = max_weight, dscp
        self.seen: dict[str, Measured] = {}

    def info(self) -> dict:
        """What `status` shows of the box's policy."""
        return {"policy": self.policy, "capacity_bps": self.capacity_bps,
                "max_weight": self.max_weight, "dscp": list(self.dscp)}

    # --- the loop ----------------------------------------------------------
    def tick(self, jobs, now: float) -> None:
        """One round: `jobs`, the table's jobs (running ones have an id)."""
        running = {j.name: j for j in jobs if j.state == "running" and j.id is not None}
        for name in [n for n, m in self.seen.items()
                     if n not in running or running[n].id != m.job_id]:
            del self.seen[name]
        for name, j in running.items():
            self.seen.setdefault(name, Measured(j.id, served_at=now))
        if not running:
            return
        progress = self.maps.read_job_progress([m.job_id for m in self.seen.values()])
        for name, m in self.seen.items():
            self._sample(m, running[name], progress.get(m.job_id, (m.bytes, 0)), now)
        demands = {name: Demand(name, running[name].weight, m.left, now - m.served_at)
                   for name, m in self.seen.items()}
        active = [demands[n] for n, m in self.seen.items()
                  if self._active(m, now) and not self._finished(m, running[n].senders)]
        parts = divide(self.policy, active)
        if self.policy == "srpt" and active:
            self.seen[max(parts, key=parts.get)].served_at = now
        marks = dscp_marks(self.policy, active, self.dscp)
        for name, m in self.seen.items():
            j = running[name]
            m.part = parts[name] if name in parts else part_if_active(self.policy, active,
                                                                      demands[name])
            m.target_bps = m.part * self.capacity_bps
            m.dscp = j.dscp if j.dscp is not None else marks.get(name, self._idle_mark())
            self._write(m, j.senders)

    def _sample(self, m: Measured, job, progress: tuple[int, int], now: float) -> None:
        nbytes, left_code = progress
        if m.sampled_at is not None and nbytes > m.bytes:
            m.active_at, m.quiet = now, 0
        else:
            m.quiet += 1
        if m.sampled_at is not None and now > m.sampled_at:
            rate = max(0, nbytes - m.bytes) * 8 / (now - m.sampled_at)
            a = min(1.0, (now - m.sampled_at) / RATE_TAU_S)
            m.actual_bps += a * (rate - m.actual_bps)
        m.bytes, m.sampled_at = nbytes, now
        m.left = wire.pace_decode(left_code) * job.senders

    @staticmethod
    def _active(m: Measured, now: float) -> bool:
        """Sending: new bytes within IDLE_S, or within the last QUIET_TICKS
        ticks where the loop runs late (a busy daemon's ticks stretch, and
        a job must not look idle only because its bytes came between them)."""
        return now - m.active_at <= IDLE_S or (m.active_at > -math.inf and m.quiet < QUIET_TICKS)

    def _finished(self, m: Measured, senders: int) -> bool:
        """Its last DATA was its call's last packet and nothing came since:
        idle now, not after IDLE_S (a job between calls is back at its next
        DATA, which says its new call's bytes)."""
        return 0 < m.left <= self.packet_bytes * senders and m.quiet >= 1

    def _idle_mark(self) -> int | None:
        return self.dscp[-1] if self.dscp else None

    def _write(self, m: Measured, senders: int) -> None:
        kbps = max(1, int(m.target_bps / max(1, senders) / 1000))
        pace = JobPace(wire.pace_encode(kbps), m.dscp)
        if pace != m.pace:
            self.maps.write_job_pace(m.job_id, pace)
            m.pace = pace

    # --- what status shows -------------------------------------------------
    def describe(self, job) -> dict | None:
        m = self.seen.get(job.name)
        if m is None:
            return None
        return {"policy": self.policy, "weight": job.weight, "share": round(m.part, 4),
                "target_bps": int(m.target_bps), "actual_bps": int(m.actual_bps),
                "remaining_bytes": m.left, "dscp": m.dscp}


async def keep_shares(shares: Shares, table) -> None:
    """The loop, on the daemon's event loop until cancelled. A failing round
    is logged once a kind and the next one tried: the box goes on serving."""
    failed: set[str] = set()
    while True:
        try:
            shares.tick(list(table.jobs.values()), time.monotonic())
        except Exception as e:   # noqa: BLE001 - a map read racing a job's end, say
            if str(e) not in failed:
                failed.add(str(e))
                log.warning("shares: a round failed: %s", e)
        await asyncio.sleep(TICK_S)
