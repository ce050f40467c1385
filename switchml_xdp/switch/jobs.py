"""The control plane's view of jobs: membership, slots, leases and the data
plane entries that follow from them. No networking here: control.py feeds it.

A job is born at the first `join` of its name, becomes `running` when all
`world` ranks have joined, and ends when every rank has left or when it is
aborted (a rank stopped heartbeating or disconnected). A joining job holds no
id, no slots and nothing in the data plane: all of that is taken when the
barrier completes (so joins that never complete cannot starve anyone), and
given back when the job ends.

The first join of a name fixes the job's token (only its SHA-256 is kept);
every later join, and resume/leave/heartbeat, must present the same token
(docs/security.md).

Requests come here with every field already checked (request_fields.py, at
control.py's door); what is checked here depends on the table's state.
"""
from __future__ import annotations

import secrets
import time
from collections.abc import Callable

from .. import wire
from ..wire import AUTH_MODES
from .children import TREE_LEASE_S, child_of, rank_mask, wire_members
from .job_records import ControlError, Job, JobStartFailed, Member, ParentPlan, token_digest
from .maps import DataplaneMaps, JobEntry
from .share_policy import parse_weight
from .shares import Shares
from .slots import SlotPool, SlotPoolExhausted


class JobTable:
    """Jobs by name, with the data plane kept in step through `maps`."""

    def __init__(self, maps: DataplaneMaps, k: int, total_slots: int, job_slots: int,
                 on_change: Callable[[], None] = lambda: None, require_token: bool = False,
                 initial_seq: int = 0, auth: str = "header", below_parent: bool = False):
        """below_parent: a rack box, whose jobs start when their parent box's
        barrier completes (start_below), not when all their ranks joined here."""
        self.maps = maps
        self.below_parent = below_parent
        self.k = k
        self.job_slots = job_slots
        self.pool = SlotPool(total_slots)
        self.jobs: dict[str, Job] = {}
        self.on_change = on_change
        self.require_token = require_token   # `up --require-token`: no open jobs
        # Where every job's packet counter starts (`up --initial-seq`: tests run
        # a job through the wrap of the 32-bit seq by starting it near 2^32).
        self.initial_seq = initial_seq
        # What RESULT authenticators cover (`up --auth`): AUTH_MODES' keys.
        self.auth = auth
        # `up --share`: the share loop (shares.py), which follows this table.
        self.shares: Shares | None = None

    # --- joining ---------------------------------------------------------
    def join(self, msg: dict, conn, peer_ip: str) -> Job:
        """Register a rank (`peer_ip`: the address the request came from).
        All or nothing: a join that raises leaves no trace. The join that
        completes the set starts the job (JobStartFailed if it cannot)."""
        name, token, world, rank = msg["job"], msg.get("token"), msg["world"], msg["rank"]
        port, ip, mac = msg["port"], msg["ip"], msg.get("mac", "")
        rack = bool(msg.get("rack"))
        if token is None and self.require_token:
            raise ControlError("this switch takes only jobs with a token: 'token' is required")
        if ip != peer_ip:
            raise ControlError(f"'ip' {ip} is not the address this connection comes from "
                               f"({peer_ip}): a worker joins from the address it sends data from")
        k = msg.get("k")
        if k is not None and k != self.k:
            raise ControlError(f"this switch aggregates k={self.k} elements a packet, "
                               f"the worker asked for k={k}")

        lanes = msg.get("lanes", 1)
        self.check_lanes(lanes, port, rack)

        job = self.jobs.get(name)
        if job is None:
            job = Job(name, None, world, port, None, 0,
                      token_hash=token_digest(token) if token is not None else None,
                      boxes=msg.get("boxes"), lanes=lanes)
        else:
            # The token first: a stranger learns nothing more of the job.
            job.check_token(token)
            if job.state != "joining":
                raise ControlError(f"job {name!r} is already running (world {job.world}); "
                                   f"wait for it to end or use another name")
            if job.world != world:
                raise ControlError(f"job {name!r} has world {job.world}, this worker says {world}")
            if job.lanes != lanes:
                raise ControlError(f"job {name!r} has {job.lanes} lane(s), this worker asks for "
                                   f"{lanes}: every rank of a job streams in the same lanes")
            if job.boxes != msg.get("boxes"):
                raise ControlError(f"job {name!r}: its ranks list different boxes: "
                                   f"{job.boxes or 'this one only'} and, from rank {rank}, "
                                   f"{msg.get('boxes') or 'this one only'}")
        if rank in job.members:
            m = job.members[rank]
            raise ControlError(f"rank {rank} of job {name!r} already joined from {m.ip}:{m.port}")
        if port != job.port:
            raise ControlError(f"job {name!r} uses UDP port {job.port}: every rank must use the same port")
        for other in job.members.values():
            if (other.ip, other.port) == (ip, port) and other.rack != rack:
                raise ControlError(
                    f"rank {other.rank} of job {name!r} joined from {ip}:{port} "
                    f"{'behind' if other.rack else 'not behind'} a rack box, rank {rank} "
                    f"{'behind' if rack else 'not behind'} one: an address is a rack box "
                    f"or a worker, not both")
            if (other.ip, other.port) == (ip, port) and not rack:
                raise ControlError(
                    f"rank {other.rank} of job {name!r} already uses {ip}:{port}: one host is one "
                    f"member of a job (results go to one address and port); ranks that share a "
                    f"host reduce among themselves first, as the torch backend does "
                    f"(docs/pytorch.md)")
            if lanes > 1 and other.rack != rack:
                raise ControlError(
                    f"job {name!r} streams in {lanes} lanes: its ranks join all through rack "
                    f"boxes or all directly, not both (a rack box's uplink is one lane)")

        if msg.get("weight") is not None and len(job.members) == 0:
            job.weight = self.join_weight(msg["weight"])
        job.members[rank] = Member(rank, ip, port, mac, conn, rack=rack)
        self.jobs[name] = job
        try:
            if len(job.members) == job.world and not self.below_parent:
                self._start(job)
            self.on_change()
        except JobStartFailed:
            self.on_change()
            raise
        except BaseException:
            self.withdraw(job, rank)   # e.g. EMFILE writing the state file: no phantom rank
            raise
        return job

    def check_lanes(self, lanes: int, port: int, rack: bool) -> None:
        """A join's lanes (docs/performance.md, "Several queues per worker"):
        a power of two, ports port..port+lanes-1. A rack box's join carries
        its ranks' lanes, which the whole job agrees on, and streams one
        lane from its uplink's port itself."""
        if lanes & (lanes - 1):
            raise ControlError(f"'lanes' must be a power of two, got {lanes}")
        if not rack and port + lanes - 1 > 65535:
            raise ControlError(f"{lanes} lanes from port {port} need ports up to "
                               f"{port + lanes - 1}: past 65535")

    def start_below(self, job: Job, plan: ParentPlan) -> None:
        """A rack box's job starts as its parent box said (JobStartFailed
        if it cannot): the parent's window exactly, its seq_base, this box's
        ranks completing a round here, each round sent up (docs/scale-out.md)."""
        if job.state != "joining":
            return
        missing = [r for r in plan.ranks if r not in job.members]
        if missing or len(plan.ranks) != len(job.members):
            self._forget(job, f"job {job.name!r} could not start: the parent box counts ranks "
                              f"{', '.join(map(str, plan.ranks))} behind this box, "
                              f"which has {', '.join(map(str, sorted(job.members)))}")
            raise JobStartFailed(job, job.failure)
        if plan.slots % job.lanes:      # a parent that did not take the lanes into its window
            self._forget(job, f"job {job.name!r} could not start: the parent box's window of "
                              f"{plan.slots} slots is not a multiple of its {job.lanes} lanes")
            raise JobStartFailed(job, job.failure)
        self._start(job, plan)

    def _start(self, job: Job, plan: ParentPlan | None = None) -> None:
        """The barrier completed: take an id and slots, then open the data
        plane to the job (members first, the job entry last)."""
        used = {j.id for j in self.jobs.values() if j.id is not None}
        free_ids = [i for i in range(1, wire.MAX_JOBS) if i not in used]
        want = plan.slots if plan else self.job_slots
        if self.shares is not None and not plan:
            want = max(1, min(want, self.slot_quota(job.weight)))
        # Each lane has slots s = q mod lanes: the count is a multiple of lanes.
        want = max(job.lanes, want - want % job.lanes)
        try:
            if not free_ids:
                raise ControlError(f"too many concurrent jobs (limit {wire.MAX_JOBS - 1})")
            try:
                # Below a parent, its window exactly: slot i here is slot i there.
                base, count = self.pool.allocate(
                    want, least=want if plan else max(job.lanes, min(8, want)),
                    multiple=job.lanes)
            except SlotPoolExhausted as e:
                raise ControlError(str(e) + (" (the parent box's window)" if plan else "")) from None
        except ControlError as e:
            self._forget(job, f"job {job.name!r} could not start: {e}")
            raise JobStartFailed(job, job.failure) from None
        job.id, job.slot_base, job.slot_count = free_ids[0], base, count
        job.key = secrets.randbits(64)
        job.seq_base = plan.seq_base if plan else self.initial_seq
        job.result_key = secrets.token_bytes(wire.RESULT_KEY_LEN)
        try:
            # Fresh bitmaps and counts: the slots may have served an earlier job.
            self.maps.reset_slots(base, count)
            members = wire_members(job.members.values())
            for w in members:
                self.maps.write_member(job.id, w.rank, w.ip, w.port)
            gip, gmac = job.group
            racks = any(w.rack for w in members)
            tree = plan is not None or racks
            # Rack boxes' uplinks stream one lane: their slot s comes from
            # their port itself (the members behind them use the lanes).
            self.maps.write_job(job.id, JobEntry(
                len(members), base, count, gip, gmac, job.port, job.key, job.result_key,
                AUTH_MODES[self.auth], rank_mask=rank_mask(w.rank for w in members) if tree else None,
                uplink=plan.uplink if plan else None, lanes=1 if racks else job.lanes))
        except BaseException:
            self.maps.clear_job(job.id, job.world)
            self.pool.release(base)
            job.id = job.slot_base = None
            job.slot_count = 0
            raise
        job.state = "running"
        job.senders = len(members)
        now = time.monotonic()
        for m in job.members.values():
            m.last_seen = now

    def join_reply(self, job: Job, rank: int) -> dict:
        gip, gmac = job.group
        return {"ok": True, "job": job.name, "job_id": job.id, "world": job.world, "rank": rank,
                "k": self.k, "slots": job.slot_count, "slot_base": job.slot_base,
                "lanes": job.lanes,
                "key": f"{job.key:016x}", "seq_base": job.seq_base,
                "result_key": job.result_key.hex(), "auth": self.auth,
                "group": {"ip": gip, "mac": gmac, "port": job.port},
                **self._rack_reply(job, rank)}

    @staticmethod
    def _rack_reply(job: Job, rank: int) -> dict:
        """What a rank behind a rack box is told besides: the ranks its rack
        box speaks for and the box's rank on the wire (docs/protocol.md)."""
        child = child_of(job.members.values(), rank) if job.members[rank].rack else None
        return {"rack": {"ranks": list(child.ranks), "rank": child.rank}} if child else {}

    def withdraw(self, job: Job, rank: int) -> None:
        """A joiner gave up before the barrier completed (timeout, disconnect, error)."""
        if job.state != "joining" or job.members.get(rank) is None:
            return
        del job.members[rank]
        if not job.members:
            self._forget(job)
        self.on_change()

    def _forget(self, job: Job, failure: str | None = None) -> None:
        """Drop a job that never started (it holds nothing in the data plane)."""
        if self.jobs.get(job.name) is job:
            del self.jobs[job.name]
        job.state, job.failure = "ended", failure

    # --- running ---------------------------------------------------------
    def heartbeat(self, job: Job, rank: int) -> None:
        job.members[rank].last_seen = time.monotonic()

    def leave(self, job: Job, rank: int) -> bool:
        """Mark a rank gone; the job ends when all have left. True if it ended."""
        job.members[rank].left = True
        job.members[rank].conn = None
        # (A rack box's job has only its own ranks: the rest are other racks'.)
        complete = len(job.members) == job.world or self.below_parent
        if all(m.left for m in job.members.values()) and complete:
            self._remove(job)
            self.on_change()
            return True
        self.on_change()
        return False

    def expired(self, lease_s: float) -> list[tuple[Job, Member]]:
        """Members silent for longer than their lease: `lease_s`, and at most
        TREE_LEASE_S for a rank behind a rack box (a box heartbeats for it)."""
        now = time.monotonic()
        rack_lease_s = min(lease_s, TREE_LEASE_S)
        return [(j, m) for j in self.jobs.values() if j.state == "running"
                for m in j.members.values()
                if not m.left and now - m.last_seen > (rack_lease_s if m.rack else lease_s)]

    def remove(self, job: Job) -> None:
        self._remove(job)
        self.on_change()

    def _remove(self, job: Job) -> None:
        if self.jobs.get(job.name) is not job:
            return
        if job.id is None:
            self._forget(job)
            return
        self.maps.clear_job(job.id, job.world)
        self.pool.release(job.slot_base)
        del self.jobs[job.name]
        job.state = "ended"

    def adopt(self, desc: dict, token_hash: bytes | None) -> Job:
        """Take over a running job that an earlier daemon left in the pinned maps
        (desc is its `describe()` from the state file, token_hash its token's
        digest from the daemon's private file). Its members must reconnect
        with `resume`; their lease clocks start now."""
        job = Job(desc["name"], desc["id"], desc["world"], desc["port"], desc["slot_base"],
                  desc["slots"], token_hash=token_hash, state="running",
                  weight=desc.get("weight", 1.0), dscp=desc.get("dscp"),
                  lanes=desc.get("lanes", 1))
        for r, m in desc["members"].items():
            job.members[int(r)] = Member(int(r), m["ip"], m["port"], m["mac"], left=m["left"],
                                         rack="rack" in m)
        job.senders = len(wire_members(job.members.values()))
        self.pool.claim(job.slot_base, job.slot_count)
        self.jobs[job.name] = job
        return job

    def resume(self, msg: dict, conn) -> tuple[Job, object]:
        """A member of a running job re-attaches its control connection (after
        the daemon restarted, or its connection broke). Returns the job and
        the member's previous connection, which no longer speaks for it."""
        name, token = msg["job"], msg.get("token")
        job = self.jobs.get(name)
        if job is None or job.state != "running":
            raise ControlError(f"no running job {name!r} to resume")
        job.check_token(token)
        rank, job_id = msg["rank"], msg["job_id"]
        if rank >= job.world:
            raise ControlError(f"'rank' must be in 0..{job.world - 1}, got {rank}")
        if job_id != job.id:
            raise ControlError(f"job {name!r} now has id {job.id}, not {job_id!r}: it is another job")
        m = job.members.get(rank)
        if m is None or m.left:
            raise ControlError(f"rank {rank} is not a member of job {name!r}")
        previous, m.conn = m.conn, conn
        m.last_seen = time.monotonic()
        return job, previous

    def token_hashes(self) -> dict[str, str]:
        """Running protected jobs' token digests (hex), for a daemon that
        re-adopts them; kept out of `describe()` and the public state file."""
        return {j.name: j.token_hash.hex() for j in self.jobs.values()
                if j.state == "running" and j.token_hash is not None}

    def describe(self) -> list[dict]:
        out = []
        for j in sorted(self.jobs.values(), key=lambda j: (j.id is None, j.id or 0, j.name)):
            d = j.describe()
            share = self.shares.describe(j) if self.shares else None
            if share is not None:
                d["share"] = share
            out.append(d)
        return out

    # --- shares (shares.py) ------------------------------------------------
    def join_weight(self, asked) -> float:
        """The weight a join gets: what it asked (a number above zero,
        checked at the door) capped at the box's --max-weight; 1 unasked."""
        if asked is None:
            return 1.0
        cap = self.shares.max_weight if self.shares else None
        return min(float(asked), cap) if cap else float(asked)

    def set_share(self, name: str, weight=None, dscp=None) -> Job:
        """The operator's `swml-switch job NAME --weight W --dscp D`: all or
        nothing, a one-line ControlError for what is refused."""
        if self.shares is None:
            raise ControlError("this box divides nothing between jobs: start it with "
                               "swml-switch up --share fair|weighted|srpt")
        job = self.jobs.get(name)
        if job is None:
            raise ControlError(f"no job {name!r} on this box")
        if weight is not None:
            try:
                weight = parse_weight(weight, self.shares.max_weight)
            except ValueError as e:
                raise ControlError(str(e)) from None
        if dscp is not None and (isinstance(dscp, bool) or not isinstance(dscp, int)
                                 or not 0 <= dscp <= 63):
            raise ControlError(f"a DSCP mark is an integer 0..63, not {dscp!r}")
        if weight is not None:
            job.weight = weight
        if dscp is not None:
            job.dscp = dscp
        return job

    def slot_quota(self, weight: float) -> int:
        """Under --share, the most slots a starting job of `weight` gets: its
        weight's part of the pool among the jobs running, itself and room
        for one more job of weight 1 counted, and of the free slots the same
        part beside that one more job, so that no job takes the pool and a
        later one still finds slots (docs/operations.md)."""
        others = sum(j.weight for j in self.jobs.values() if j.state == "running")
        return int(min(self.pool.total * weight / (weight + others + 1.0),
                       self.pool.free * weight / (weight + 1.0)))
