"""A rack box's link to its parent box (docs/scale-out.md, "A tree of boxes";
docs/protocol.md, "Rack boxes").

Every job at a box started with `--uplink IFACE --parent IP` is a tree job.
Its workers join this box as on any other; for each of them the box joins
the parent's job with the same job, token, world and rank, from the
uplink's address and as `"rack": true` (one control connection a rank: the
parent's leases are per rank). When the parent's barrier completes, its
replies say which ranks this box speaks for, its window, its first seq and
this box's rank and keys there: the local job starts from them
(JobTable.start_below), the data plane is told the way up (UplinkEntry and
the parent route), and the workers get their replies.

While the job runs each rank's connection to the parent heartbeats, and
carries its `leave`. The parent aborting the job, or a connection to it
breaking, aborts the local job with a reason that names the parent; the
local job ending closes the connections (the parent then aborts its job
for every other rack).
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import net, wire
from .children import TREE_HEARTBEAT_S, TREE_LEASE_S
from .control_connection import Connection
from .jobs import Job, JobStartFailed, JobTable, ParentPlan
from .maps import UplinkEntry

log = logging.getLogger("swml.uplink")

CONNECT_TIMEOUT_S = 5.0
MAX_LINE = 64 * 1024
# A local join waits this much longer than its own timeout, so that the
# parent's answer (with its reason) comes first when the parent times out.
PARENT_GRACE_S = 2.0


@dataclass(frozen=True)
class UplinkPort:
    """The rack box's port towards its parent, with its own address."""
    iface: str
    ip: str
    mac: str
    ifindex: int


def uplink_port(iface: str) -> UplinkPort:
    """The uplink's addresses, as the kernel has them (net.NetError if none)."""
    return UplinkPort(iface, net.link_ipv4(iface), net.link_mac(iface), net.link_index(iface))


class ParentError(Exception):
    """Something from the parent box a local worker is told, as one line."""


class RankUp:
    """One local rank's control connection to the parent box."""

    def __init__(self, link: ParentLink, job: Job, rank: int):
        self.link, self.job, self.rank = link, job, rank
        self.result: asyncio.Future = asyncio.get_running_loop().create_future()
        self.reply: dict | None = None
        self.conn: Connection | None = None
        self.leaving = self.closed = False
        self.task: asyncio.Task | None = None

    async def run(self, msg: dict) -> None:
        try:
            await self._run(msg)
        except Exception as e:  # a bug or a parent's odd reply: say so, end the rank's join
            log.exception("job %s: rank %d's connection to the parent box failed",
                          self.job.name, self.rank)
            self._answer(f"unexpected answer: {e}")
            self.link.lost(self.job, f"the parent box {self.link.parent_ip}: unexpected answer")

    async def _run(self, msg: dict) -> None:
        link = self.link
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                link.parent_ip, link.control_port, local_addr=(link.port.ip, 0), limit=MAX_LINE),
                CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as e:
            self._answer(f"cannot reach its control port {link.parent_ip}:{link.control_port}: "
                         f"{getattr(e, 'strerror', None) or e or 'timed out'}")
            return
        self.conn = Connection(reader, writer)
        if self.closed:
            writer.close()
            return
        up = {"op": "join", "job": msg["job"], "token": msg.get("token"), "world": msg["world"],
              "rank": self.rank, "ip": link.port.ip, "port": link.data_port, "mac": link.port.mac,
              "rack": True, "timeout": msg["timeout"], "k": link.table.k,
              "lanes": msg.get("lanes")}
        self.conn.send({k: v for k, v in up.items() if v is not None})
        try:
            reply = await self._next(reader)
        except (ConnectionError, ParentError, OSError) as e:
            self._answer(str(e) or "its control connection closed during the join")
            return
        if not reply.get("ok"):
            self._answer(str(reply.get("error", "refused the join")))
            return
        self.reply = reply
        if not self.result.done():
            self.result.set_result(None)
        link.replied(self.job)
        # Closer than the parent's workers (children.py): a box gone dark
        # is noticed within 2 s at either end.
        await self._member(reader, min(float(reply.get("heartbeat_s", 1.0)), TREE_HEARTBEAT_S),
                           min(float(reply.get("lease_s", 3.0)), TREE_LEASE_S))

    async def _member(self, reader, heartbeat_s: float, lease_s: float) -> None:
        """The rank's life at the parent: heartbeats out, events in."""
        beat = asyncio.create_task(self._heartbeat(heartbeat_s))
        try:
            while True:
                obj = await asyncio.wait_for(self._next(reader), lease_s)
                if obj.get("event") == "abort":
                    self.link.lost(self.job, f"the parent box {self.link.parent_ip} aborted the "
                                             f"job: {obj.get('reason', 'no reason given')}")
                    return
                if obj.get("op") == "leave" and self.leaving:
                    return
        except TimeoutError:
            self.link.lost(self.job, f"lost the parent box {self.link.parent_ip} (no answer to "
                                     f"heartbeats for {lease_s:g} s)")
        except (ConnectionError, ParentError, OSError):
            if not self.leaving:
                self.link.lost(self.job, f"lost the parent box {self.link.parent_ip} (its control "
                                         f"connection closed)")
        finally:
            beat.cancel()
            self.close()

    async def _heartbeat(self, every_s: float) -> None:
        token = self.link.tokens.get(id(self.job))
        while not self.leaving:
            await asyncio.sleep(every_s)
            self.conn.send({"op": "heartbeat", **({"token": token} if token else {})})

    @staticmethod
    async def _next(reader) -> dict:
        line = await reader.readline()
        if not line:
            raise ConnectionResetError("its control connection closed")
        try:
            obj = json.loads(line)
        except ValueError:
            raise ParentError("sent a line that is not JSON") from None
        if not isinstance(obj, dict):
            raise ParentError("sent a line that is not a JSON object")
        return obj

    def _answer(self, error: str) -> None:
        """The worker's join fails with the parent's reason."""
        if not self.result.done():
            self.result.set_result(f"parent box {self.link.parent_ip}: {error}")
        self.close()

    def leave(self) -> None:
        if self.conn is not None and not self.closed:
            self.leaving = True
            token = self.link.tokens.get(id(self.job))
            self.conn.send({"op": "leave", **({"token": token} if token else {})})

    def close(self) -> None:
        self.closed = True
        if self.conn is not None:
            self.conn.writer.close()
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()


@dataclass
class TreeJob:
    """What a rack box holds for one tree job."""
    job: Job
    ranks_up: dict[int, RankUp] = field(default_factory=dict)
    plan: ParentPlan | None = None
    group_sock: socket.socket | None = None


class ParentLink:
    """The rack box's side of the tree, for every job of the box."""

    def __init__(self, port: UplinkPort, parent_ip: str, control_port: int, data_port: int,
                 resolve_mac: Callable[[str, str], str] = net.next_hop_mac):
        self.port, self.parent_ip, self.control_port = port, parent_ip, control_port
        self.data_port, self.resolve_mac = data_port, resolve_mac
        self.jobs: dict[int, TreeJob] = {}     # id(job) -> its tree state
        self.tokens: dict[int, str | None] = {}
        self.table: JobTable | None = None
        self.abort: Callable[[Job, str], None] = lambda job, reason: None
        self.wake: Callable[[Job], None] = lambda job: None

    def attach(self, table: JobTable, abort: Callable[[Job, str], None],
               wake: Callable[[Job], None]) -> None:
        """The control server's job table, its abort and its barrier's wake-up."""
        self.table, self.abort, self.wake = table, abort, wake

    # --- joining ---------------------------------------------------------------
    def join_up(self, job: Job, rank: int, msg: dict) -> asyncio.Future:
        """Join the parent's job for a local rank; the future gives None once
        the parent's reply came, or the worker's error line."""
        tree = self.jobs.setdefault(id(job), TreeJob(job))
        self.tokens[id(job)] = msg.get("token")
        up = tree.ranks_up[rank] = RankUp(self, job, rank)
        up.task = asyncio.create_task(up.run(msg))
        return up.result

    def withdraw(self, job: Job, rank: int) -> None:
        """A local rank gave up before its job started: so does its join above."""
        tree = self.jobs.get(id(job))
        if tree is None or job.state == "running":
            return
        up = tree.ranks_up.pop(rank, None)
        if up is not None:
            up.close()
        if not tree.ranks_up:
            self._forget(job)

    def replied(self, job: Job) -> None:
        """A parent's reply came: start the job once every rank it names has one."""
        tree = self.jobs.get(id(job))
        if tree is None or job.state != "joining":
            return
        replies = {r: up.reply for r, up in tree.ranks_up.items() if up.reply is not None}
        try:
            ranks = sorted(next(iter(replies.values()))["rack"]["ranks"])
            if not all(r in replies for r in ranks):
                return
            tree.plan = self._plan(replies, ranks)
        except (KeyError, TypeError, ValueError, StopIteration, net.NetError) as e:
            self._fail(job, f"job {job.name!r} could not start: the parent box "
                            f"{self.parent_ip}: {e}")
            return
        try:
            self.table.start_below(job, tree.plan)
        except JobStartFailed:
            self.ended(job)
            self.wake(job)
            return
        except OSError as e:
            tree.plan = None
            self._fail(job, f"job {job.name!r} could not start: {e}")
            return
        try:
            self.table.maps.write_parent_route(self.parent_ip, tree.plan.uplink.job_id, job.id)
        except OSError as e:
            self._fail(job, f"job {job.name!r} could not start: no route from the parent: {e}")
            return
        tree.group_sock = self._join_group(replies[ranks[0]]["group"]["ip"])
        self.table.on_change()   # the state file shows the tree
        self.wake(job)

    def _plan(self, replies: dict[int, dict], ranks: list[int]) -> ParentPlan:
        """The local job's start, from the parent's replies (which must agree)."""
        first = replies[ranks[0]]
        for r in ranks:
            got = replies[r]
            if (got["job_id"], got["rack"]["rank"], sorted(got["rack"]["ranks"])) != \
                    (first["job_id"], first["rack"]["rank"], ranks):
                raise ValueError(f"its replies to ranks {ranks[0]} and {r} disagree")
        parent_port = int(first["switch"]["port"])
        uplink = UplinkEntry(
            ifindex=self.port.ifindex, parent_ip=self.parent_ip, parent_port=parent_port,
            parent_mac=self.resolve_mac(self.parent_ip, self.port.iface),
            src_ip=self.port.ip, src_port=self.data_port, src_mac=self.port.mac,
            job_id=int(first["job_id"]), rank=int(first["rack"]["rank"]),
            key=int(first["key"], 16), result_key=bytes.fromhex(first["result_key"]),
            auth=wire.AUTH_MODES[first["auth"]])
        if len(uplink.result_key) != wire.RESULT_KEY_LEN:
            raise ValueError(f"a result key of {len(uplink.result_key)} bytes")
        return ParentPlan(int(first["slots"]), int(first["seq_base"]), tuple(ranks), uplink)

    def _join_group(self, group_ip: str) -> socket.socket | None:
        """Join the parent job's multicast group on the uplink, for switches
        that deliver multicast only where it was asked for (IGMP snooping)."""
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                         socket.inet_aton(group_ip) + socket.inet_aton(self.port.ip))
        except OSError as e:
            log.warning("cannot join the parent's group %s on %s: %s", group_ip, self.port.iface,
                        e.strerror)
            s.close()
            return None
        return s

    def _fail(self, job: Job, reason: str) -> None:
        job.failure = reason
        self.abort(job, reason)

    # --- running ---------------------------------------------------------------
    def left(self, job: Job, rank: int) -> None:
        """A local rank left: so does it at the parent."""
        tree = self.jobs.get(id(job))
        if tree is not None and rank in tree.ranks_up:
            tree.ranks_up[rank].leave()

    def lost(self, job: Job, reason: str) -> None:
        """The parent ended the job, or cannot be heard: the local job ends."""
        if job.state != "ended":
            self._fail(job, reason)

    def ended(self, job: Job) -> None:
        """The local job ended: forget its route, its group and, but for the
        ranks leaving, its connections up (the parent aborts its job)."""
        tree = self.jobs.get(id(job))
        if tree is None:
            return
        for up in tree.ranks_up.values():
            if not up.leaving:
                up.close()
        if tree.plan is not None:
            self.table.maps.clear_parent_route(self.parent_ip, tree.plan.uplink.job_id)
        if tree.group_sock is not None:
            tree.group_sock.close()
        self._forget(job)
        if tree.plan is not None:
            self.table.on_change()

    def _forget(self, job: Job) -> None:
        self.jobs.pop(id(job), None)
        self.tokens.pop(id(job), None)

    def describe(self) -> dict:
        """The tree as `status` shows it (no keys)."""
        return {"uplink": self.port.iface, "ip": self.port.ip, "parent": self.parent_ip,
                "parent_control_port": self.control_port,
                "jobs": {t.job.name: {"parent_job": t.plan.uplink.job_id, "rank": t.plan.uplink.rank,
                                      "ranks": list(t.plan.ranks)}
                         for t in self.jobs.values() if t.plan is not None}}
