"""The control plane's view of jobs: membership, slots, leases and the data
plane entries that follow from them. No networking here: control.py feeds it.

A job is born at the first `join` of its name, becomes `running` when all
`world` ranks have joined (only then does the data plane accept its packets),
and ends when every rank has left or when it is aborted (a rank stopped
heartbeating or disconnected). Its id and slots then go back to the pools.
"""
from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass, field
from typing import Callable

from .. import wire
from .maps import DataplaneMaps, JobEntry
from .slots import SlotPool, SlotPoolExhausted


class ControlError(Exception):
    """A request the control plane refuses; the message goes back to the client."""


@dataclass
class Member:
    rank: int
    ip: str
    port: int
    mac: str
    conn: object = None          # the control connection, to push events on
    last_seen: float = field(default_factory=time.monotonic)
    left: bool = False


@dataclass
class Job:
    name: str
    id: int
    world: int
    port: int                     # the workers' UDP port (RESULTs go there)
    slot_base: int
    slot_count: int
    members: dict[int, Member] = field(default_factory=dict)
    state: str = "joining"        # joining -> running -> (removed)
    created: float = field(default_factory=time.time)

    @property
    def group(self) -> tuple[str, str]:
        return wire.group_of_job(self.id)

    def missing_ranks(self) -> list[int]:
        return [r for r in range(self.world) if r not in self.members]

    def describe(self) -> dict:
        gip, gmac = self.group
        return {"name": self.name, "id": self.id, "world": self.world, "state": self.state,
                "port": self.port, "slot_base": self.slot_base, "slots": self.slot_count,
                "group": {"ip": gip, "mac": gmac},
                "members": {str(r): {"ip": m.ip, "port": m.port, "mac": m.mac, "left": m.left}
                            for r, m in sorted(self.members.items())}}


def _check_int(msg: dict, key: str, lo: int, hi: int, default=None) -> int:
    v = msg.get(key, default)
    if v is None:
        raise ControlError(f"'{key}' is required")
    if not isinstance(v, int) or isinstance(v, bool):
        raise ControlError(f"'{key}' must be an integer, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise ControlError(f"'{key}' must be in {lo}..{hi}, got {v}")
    return v


def _check_str(msg: dict, key: str, maxlen: int = 64) -> str:
    v = msg.get(key)
    if not isinstance(v, str) or not v or len(v) > maxlen:
        raise ControlError(f"'{key}' must be a non-empty string of at most {maxlen} characters")
    return v


class JobTable:
    """Jobs by name, with the data plane kept in step through `maps`."""

    def __init__(self, maps: DataplaneMaps, k: int, total_slots: int, job_slots: int,
                 on_change: Callable[[], None] = lambda: None):
        self.maps = maps
        self.k = k
        self.job_slots = job_slots
        self.pool = SlotPool(total_slots)
        self.jobs: dict[str, Job] = {}
        self.on_change = on_change

    # --- joining ---------------------------------------------------------
    def join(self, msg: dict, conn) -> Job:
        name = _check_str(msg, "job")
        world = _check_int(msg, "world", 1, 1 << 16)
        if world > wire.MAX_WORLD:
            raise ControlError(f"world {world} exceeds the switch's limit of {wire.MAX_WORLD} workers a job")
        rank = _check_int(msg, "rank", 0, world - 1)
        port = _check_int(msg, "port", 1, 65535)
        ip = _check_str(msg, "ip", 15)
        try:
            ipaddress.IPv4Address(ip)
        except ValueError:
            raise ControlError(f"'ip' is not an IPv4 address: {ip!r}") from None
        mac = msg.get("mac", "")
        if not isinstance(mac, str):
            raise ControlError("'mac' must be a string")
        k = msg.get("k")
        if k is not None and k != self.k:
            raise ControlError(f"this switch aggregates k={self.k} elements a packet, the worker asked for k={k}")

        job = self.jobs.get(name)
        if job is None:
            job = self._new_job(name, world, port)
        elif job.state != "joining":
            raise ControlError(f"job {name!r} is already running (world {job.world}); "
                               f"wait for it to end or use another name")
        elif job.world != world:
            raise ControlError(f"job {name!r} has world {job.world}, this worker says {world}")
        if rank in job.members:
            m = job.members[rank]
            raise ControlError(f"rank {rank} of job {name!r} already joined from {m.ip}:{m.port}")
        if port != job.port:
            raise ControlError(f"job {name!r} uses UDP port {job.port}: every rank must use the same port")
        for other in job.members.values():
            if (other.ip, other.port) == (ip, port):
                raise ControlError(f"rank {other.rank} of job {name!r} already uses {ip}:{port}")

        job.members[rank] = Member(rank, ip, port, mac, conn)
        self.maps.write_member(job.id, rank, ip, port)
        if len(job.members) == job.world:
            self._start(job)
        self.on_change()
        return job

    def _new_job(self, name: str, world: int, port: int) -> Job:
        used = {j.id for j in self.jobs.values()}
        free_ids = [i for i in range(1, wire.MAX_JOBS) if i not in used]
        if not free_ids:
            raise ControlError(f"too many concurrent jobs (limit {wire.MAX_JOBS - 1})")
        try:
            base, count = self.pool.allocate(self.job_slots, least=min(8, self.job_slots))
        except SlotPoolExhausted as e:
            raise ControlError(str(e)) from None
        job = Job(name, free_ids[0], world, port, base, count)
        # Fresh bitmaps and counts: the slots may have served an earlier job.
        self.maps.reset_slots(base, count)
        self.jobs[name] = job
        return job

    def _start(self, job: Job) -> None:
        gip, gmac = job.group
        self.maps.write_job(job.id, JobEntry(job.world, job.slot_base, job.slot_count, gip, gmac, job.port))
        job.state = "running"
        now = time.monotonic()
        for m in job.members.values():
            m.last_seen = now

    def join_reply(self, job: Job, rank: int) -> dict:
        gip, gmac = job.group
        return {"ok": True, "job": job.name, "job_id": job.id, "world": job.world, "rank": rank,
                "k": self.k, "slots": job.slot_count, "slot_base": job.slot_base,
                "group": {"ip": gip, "mac": gmac, "port": job.port}}

    def withdraw(self, job: Job, rank: int) -> None:
        """A joiner gave up before the barrier completed (timeout, disconnect)."""
        if job.state != "joining" or job.members.get(rank) is None:
            return
        del job.members[rank]
        self.maps.write_member(job.id, rank, "0.0.0.0", 0)
        if not job.members:
            self._remove(job)
        self.on_change()

    # --- running ---------------------------------------------------------
    def heartbeat(self, job: Job, rank: int) -> None:
        job.members[rank].last_seen = time.monotonic()

    def leave(self, job: Job, rank: int) -> bool:
        """Mark a rank gone; the job ends when all have left. True if it ended."""
        job.members[rank].left = True
        job.members[rank].conn = None
        if all(m.left for m in job.members.values()) and len(job.members) == job.world:
            self._remove(job)
            self.on_change()
            return True
        self.on_change()
        return False

    def expired(self, lease_s: float) -> list[tuple[Job, Member]]:
        now = time.monotonic()
        return [(j, m) for j in self.jobs.values() if j.state == "running"
                for m in j.members.values() if not m.left and now - m.last_seen > lease_s]

    def remove(self, job: Job) -> None:
        self._remove(job)
        self.on_change()

    def _remove(self, job: Job) -> None:
        if self.jobs.get(job.name) is not job:
            return
        self.maps.clear_job(job.id, job.world)
        self.pool.release(job.slot_base)
        del self.jobs[job.name]
        job.state = "ended"

    def adopt(self, desc: dict) -> Job:
        """Take over a running job that an earlier daemon left in the pinned maps
        (desc is its `describe()` from the state file). Its members must
        reconnect with `resume`; their lease clocks start now."""
        job = Job(desc["name"], desc["id"], desc["world"], desc["port"], desc["slot_base"],
                  desc["slots"], state="running")
        for r, m in desc["members"].items():
            job.members[int(r)] = Member(int(r), m["ip"], m["port"], m["mac"], left=m["left"])
        self.pool.claim(job.slot_base, job.slot_count)
        self.jobs[job.name] = job
        return job

    def resume(self, msg: dict, conn) -> tuple[Job, object]:
        """A member of a running job re-attaches its control connection (after
        the daemon restarted, or its connection broke). Returns the job and
        the member's previous connection, which no longer speaks for it."""
        name = _check_str(msg, "job")
        job = self.jobs.get(name)
        if job is None or job.state != "running":
            raise ControlError(f"no running job {name!r} to resume")
        rank = _check_int(msg, "rank", 0, job.world - 1)
        job_id = msg.get("job_id")
        if job_id != job.id:
            raise ControlError(f"job {name!r} now has id {job.id}, not {job_id!r}: it is another job")
        m = job.members.get(rank)
        if m is None or m.left:
            raise ControlError(f"rank {rank} is not a member of job {name!r}")
        previous, m.conn = m.conn, conn
        m.last_seen = time.monotonic()
        return job, previous

    def describe(self) -> list[dict]:
        return [j.describe() for j in sorted(self.jobs.values(), key=lambda j: j.id)]
