"""The control protocol server: TCP, one JSON object a line (docs/protocol.md).

Every request gets exactly one reply line, {"ok": true, ...} or
{"ok": false, "error": "<one-line reason>"}. A member's connection also carries
events the switch pushes: {"event": "abort", ...} and {"event": "left", ...}.
Every field of a request is checked at the door, once, by
request_fields.py; the handlers here and the job table take checked values.
A worker keeps its connection open for the life of its job: closing it without
`leave` means it died, and the job is aborted at once (a lease catches the
workers that hang without closing).

No client can hold more than its share: connections and joins waiting at a
barrier are counted per source address (MAX_CONNECTIONS_PER_IP,
MAX_PENDING_JOINS_PER_IP), connections in all within the daemon's
descriptors (descriptors.py), a join waits at most MAX_JOIN_TIMEOUT_S (request_fields.py), and a
client that does not read what the switch sends is dropped after the idle
timeout (its replies would otherwise pile up in the daemon).
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from .. import wire
from .children import TREE_LEASE_S
from .control_connection import (  # noqa: F401 - MAX_BUFFERED_OUTPUT: one of the limits named here
    IDLE_TIMEOUT_S,
    MAX_BUFFERED_OUTPUT,
    Connection,
    idle_timeout_from_env,
)
from .descriptors import control_connection_cap
from .jobs import ControlError, Job, JobStartFailed, JobTable
from .listener import Listener
from .operator_ops import job_share
from .quiet_log import QuietLog
from .request_fields import FieldError, validate
from .uplink import PARENT_GRACE_S, ParentLink

log = logging.getLogger("swml.control")

MAX_LINE = 64 * 1024
LINGER_S = 2.0   # how long a connection the switch closes may still drain the client's input
MAX_CONNECTIONS_PER_IP = 128     # open control connections from one source address
MAX_PENDING_JOINS_PER_IP = 16    # joins from one source address waiting at barriers at once


class ControlServer:
    def __init__(self, table: JobTable, switch_info: dict, lease_s: float,
                 status_extra: Callable[[], dict] = dict, parent: ParentLink | None = None):
        """parent: a rack box's link to its parent box (uplink.py): every job
        here is then a tree job, which starts when the parent's does."""
        self.table = table
        self.parent = parent
        if parent is not None:
            parent.attach(table, self.abort, self._wake)
        self.switch_info = switch_info   # ip, mac, port: told to joiners
        self.lease_s = lease_s
        self.status_extra = status_extra
        self._listener: Listener | None = None
        self._conns: set[Connection] = set()
        self._lease_task: asyncio.Task | None = None
        self._ready: dict[int, asyncio.Event] = {}  # joining job -> set when all ranks are in
        self.idle_timeout_s = IDLE_TIMEOUT_S
        self._pending_by_ip: dict[str, int] = {}
        self.operator_token: str | None = None   # the daemon's (operator_ops.py)

    async def start(self, host: str, port: int) -> None:
        self.idle_timeout_s = idle_timeout_from_env()
        self._listener = Listener("control port", self._serve_socket, self._refuse,
                                  MAX_CONNECTIONS_PER_IP, control_connection_cap, QuietLog(log))
        self._listener.start(host, port)
        self._lease_task = asyncio.create_task(self._watch_leases())

    async def stop(self, reason: str) -> None:
        """Close the server; tell every member its job is over."""
        if self._lease_task:
            self._lease_task.cancel()
        if self._listener:
            await self._listener.stop_accepting()
        for job in list(self.table.jobs.values()):
            self.abort(job, reason)
        for c in list(self._conns):
            c.writer.close()

    # --- the connection loop ---------------------------------------------
    @staticmethod
    def _refuse(sock, ip: str) -> None:
        """A connection over the per-address cap: why, if the socket takes it at once."""
        reason = f"too many control connections from {ip} (limit {MAX_CONNECTIONS_PER_IP}); closing"
        sock.send((json.dumps({"ok": False, "error": reason}) + "\n").encode())

    async def _serve_socket(self, sock, ip: str) -> None:
        try:
            reader, writer = await asyncio.open_connection(sock=sock, limit=MAX_LINE)
        except OSError:
            sock.close()
            return
        await self._serve(reader, writer)

    async def _serve(self, reader, writer) -> None:
        conn = Connection(reader, writer)
        self._conns.add(conn)
        try:
            while True:
                line = await self._read_line(conn)
                if line is None:
                    break
                await self._dispatch(conn, line)
                conn.op = None
                await self._drain(conn)
                if conn.closing:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:  # a bug must not take the daemon down; say so and drop the client
            log.exception("control connection %s failed", conn.peer)
        finally:
            self._conns.discard(conn)
            self._lost(conn)
            await self._close(conn)

    async def _drain(self, conn: Connection) -> None:
        """Wait until the client has taken the replies so far; one that does
        not read for the idle timeout is dropped (ConnectionResetError)."""
        try:
            await asyncio.wait_for(conn.writer.drain(), self.idle_timeout_s)
        except TimeoutError:
            conn.drop(f"did not read for {self.idle_timeout_s:g} s")
            raise ConnectionResetError from None

    @staticmethod
    async def _close(conn: Connection) -> None:
        """Close a connection. When the switch is the one ending it, half-close
        first and discard what the client still sends for a moment: closing a
        socket with unread input makes the kernel reset the connection, and
        the reset can destroy the error line before the client has read it."""
        w = conn.writer
        if conn.closing and not w.is_closing():
            async def linger():
                await w.drain()
                if w.can_write_eof():
                    w.write_eof()
                while await conn.reader.read(1 << 16):
                    pass
            try:
                await asyncio.wait_for(linger(), LINGER_S)
            except (TimeoutError, ConnectionError, OSError):
                pass
            finally:
                w.close()  # also when the daemon stops meanwhile (the task is cancelled)
        w.close()

    async def _read_line(self, conn: Connection) -> bytes | None:
        """Next line, or None when the connection should end (after telling why)."""
        # Members are watched by their lease; anyone else must speak or go.
        timeout = None if conn.job is not None else self.idle_timeout_s
        try:
            line = await asyncio.wait_for(conn.reader.readline(), timeout)
        except TimeoutError:
            conn.error(f"idle for {self.idle_timeout_s:g} s without a request; closing")
            conn.closing = True
            return None
        except (ValueError, asyncio.LimitOverrunError):
            conn.error(f"request line longer than {MAX_LINE} bytes; closing")
            conn.closing = True
            return None
        return line or None

    async def _dispatch(self, conn: Connection, line: bytes) -> None:
        conn.op = None  # nothing is echoed until the request names a valid op
        try:
            msg = json.loads(line)
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            conn.error(f"malformed JSON: {e}")
            return
        except RecursionError:
            conn.error("malformed JSON: nested too deeply")
            return
        if not isinstance(msg, dict):
            conn.error("a request must be a JSON object")
            return
        op = msg.get("op")
        conn.op = op if isinstance(op, str) and len(op) < 32 else None
        handlers = {"join": self._join, "resume": self._resume, "leave": self._leave,
                    "heartbeat": self._heartbeat, "status": self._status, "job": self._job}
        handler = handlers.get(op if isinstance(op, str) else "")
        if handler is None:
            conn.error(f"unknown op {op!r}; ops are {', '.join(handlers)}")
            return
        try:
            # The door: every field checked once, before any handler sees it.
            await handler(conn, validate(op, msg))
        except (FieldError, ControlError) as e:
            conn.error(str(e))
        except OSError as e:  # e.g. EMFILE: the request changed nothing (jobs.py undoes it)
            log.warning("control request %s from %s failed: %s", op, conn.peer, e)
            conn.error(f"the switch could not serve this request: {e.strerror or e}")

    # --- ops ---------------------------------------------------------------
    async def _join(self, conn: Connection, msg: dict) -> None:
        if conn.job is not None:
            raise ControlError(f"this connection already joined job {conn.job.name!r} as rank {conn.rank}")
        timeout = msg["timeout"]
        ip = conn.peer_ip
        # A rack box joins for each of its ranks: counted by job (a job has at
        # most MAX_WORLD ranks), and still within its connections' cap.
        pending, limit = ((ip, msg["job"]), wire.MAX_WORLD) if msg["rack"] else \
            (ip, MAX_PENDING_JOINS_PER_IP)
        if self._pending_by_ip.get(pending, 0) >= limit:
            raise ControlError(f"too many joins from {ip} waiting at barriers "
                               f"(limit {limit}); try again when one completes")
        try:
            job = self.table.join(msg, conn, ip)
        except JobStartFailed as e:
            self._wake(e.job)   # the ranks waiting for this one learn why
            raise
        rank = msg["rank"]
        log.info("job %s: rank %d joined from %s (%d/%d)", job.name, rank, conn.peer,
                 len(job.members), job.world)
        upstream = self.parent.join_up(job, rank, msg) if self.parent else None
        self._pending_by_ip[pending] = self._pending_by_ip.get(pending, 0) + 1
        try:
            joined = await self._barrier(conn, job, rank, timeout, upstream)
        except BaseException:
            self._withdraw(job, rank)   # no phantom rank, whatever went wrong
            raise
        finally:
            self._pending_by_ip[pending] -= 1
            if not self._pending_by_ip[pending]:
                del self._pending_by_ip[pending]
        if not joined:
            return
        conn.job, conn.rank = job, rank
        reply = self.table.join_reply(job, rank)
        reply.update(switch=self.switch_info, lease_s=self.lease_s, heartbeat_s=self.lease_s / 4)
        conn.send(reply)

    async def _barrier(self, conn: Connection, job: Job, rank: int, timeout: float,
                       upstream: asyncio.Future | None = None) -> bool:
        """Wait until all ranks joined, the joiner hangs up, or time runs out.
        upstream: a rack box's join of the parent for this rank (None: its
        reply came; a string: why the parent refused it)."""
        ready = self._ready.setdefault(id(job), asyncio.Event())
        if job.state != "joining":
            ready.set()
        hangup = asyncio.ensure_future(conn.reader.read(1))
        started = asyncio.ensure_future(ready.wait())
        waits = {hangup, started}
        if upstream is not None:
            waits.add(upstream)
            timeout += PARENT_GRACE_S   # the parent's own timeout, with its reason, first
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            while True:
                done, _ = await asyncio.wait(waits, timeout=deadline - asyncio.get_running_loop().time(),
                                             return_when=asyncio.FIRST_COMPLETED)
                if done != {upstream} or upstream.result() is not None:
                    break
                waits.discard(upstream)   # the parent took this rank: wait for the others
            if job.state == "running":
                # (Checked whatever woke us: the last rank may have come in just
                # as the timeout fired.)
                if hangup not in done:
                    return True
                # It spoke or hung up as the last rank came in: the job cannot run.
                self.abort(job, f"rank {rank} ({job.members[rank].ip}) disconnected "
                                f"from the switch during its join")
            missing = job.missing_ranks()
            self._withdraw(job, rank)
            if hangup in done:
                # Nothing may be sent during a join: data or EOF both end it.
                if hangup.result():
                    conn.error("request sent before the join completed; closing")
                conn.closing = True
            elif upstream in done and upstream.result() is not None:
                conn.error(upstream.result())
            elif started in done:
                conn.error(job.failure or f"job {job.name!r} ended before it started")
            else:
                conn.error(f"timed out after {timeout:g} s waiting for rank(s) "
                           f"{', '.join(map(str, missing))} of job {job.name!r} (world {job.world})")
            return False
        finally:
            # The reader is free again only once the read has really ended.
            for t in (hangup, started):
                t.cancel()
                try:
                    await t
                except (asyncio.CancelledError, ConnectionError):
                    pass
            if job.state != "joining":
                self._ready.pop(id(job), None)

    def _withdraw(self, job: Job, rank: int) -> None:
        self.table.withdraw(job, rank)
        if self.parent is not None:
            self.parent.withdraw(job, rank)

    async def _resume(self, conn: Connection, msg: dict) -> None:
        if conn.job is not None:
            raise ControlError(f"this connection already belongs to job {conn.job.name!r}")
        job, previous = self.table.resume(msg, conn)
        if previous is not None:
            previous.job = previous.rank = None
        old = job.members[msg["rank"]]
        conn.job, conn.rank = job, old.rank
        log.info("job %s: rank %d resumed from %s", job.name, old.rank, conn.peer)
        conn.send({"ok": True, "job": job.name, "job_id": job.id, "lease_s": self.lease_s,
                   "heartbeat_s": self.lease_s / 4})

    def _member(self, conn: Connection, msg: dict) -> Job:
        if conn.job is None:
            raise ControlError(f"{msg['op']} needs a joined job on this connection")
        if conn.job.state != "running":
            raise ControlError(f"job {conn.job.name!r} is no longer running")
        conn.job.check_token(msg["token"])
        return conn.job

    async def _heartbeat(self, conn: Connection, msg: dict) -> None:
        job = self._member(conn, msg)
        self.table.heartbeat(job, conn.rank)
        conn.send({"ok": True})

    async def _leave(self, conn: Connection, msg: dict) -> None:
        job = self._member(conn, msg)
        rank = conn.rank
        conn.job = conn.rank = None
        ended = self.table.leave(job, rank)
        log.info("job %s: rank %d left%s", job.name, rank, " (job ended)" if ended else "")
        if self.parent is not None:
            self.parent.left(job, rank)
            if ended:
                self.parent.ended(job)
        conn.send({"ok": True, "job_ended": ended})
        if not ended:
            for m in job.members.values():
                if m.conn is not None and not m.left:
                    m.conn.send({"event": "left", "job": job.name, "rank": rank})

    def status_reply(self) -> dict:
        """What `status` answers anyone (no secrets): the switch, its jobs and
        members, slots, and the data plane's counters (cumulative; per job too
        where the data plane counts them: "job_stats"). Also what the metrics
        endpoint exports. Call it on the event loop."""
        return {"ok": True, "switch": self.switch_info, "jobs": self.table.describe(),
                "slots_free": self.table.pool.free, "slots_total": self.table.pool.total,
                **self.status_extra()}

    async def _status(self, conn: Connection, msg: dict) -> None:
        conn.send(self.status_reply())

    async def _job(self, conn: Connection, msg: dict) -> None:
        conn.send(job_share(self.table, self.operator_token, self.switch_info["iface"], msg))

    # --- failures ------------------------------------------------------------
    def _lost(self, conn: Connection) -> None:
        job, rank = conn.job, conn.rank
        if job is None or job.state != "running":
            return
        m = job.members[rank]
        if m.conn is not conn:
            return  # an old connection of a member that has resumed on a new one
        self.abort(job, f"{_who(m)} disconnected from the switch without leaving")

    def abort(self, job: Job, reason: str) -> None:
        """End a job now: free its slots, and tell every other member why."""
        if job.state == "ended":
            return
        log.warning("job %s aborted: %s", job.name, reason)
        self.table.remove(job)
        job.failure = job.failure or reason   # what the ranks still at its barrier are told
        if self.parent is not None:
            self.parent.ended(job)
        self._wake(job)
        for m in job.members.values():
            c = m.conn
            if c is not None and not m.left:
                c.send({"event": "abort", "job": job.name, "reason": reason})
                c.job = c.rank = None

    def _wake(self, job: Job) -> None:
        """Joiners still at the job's barrier look at it again (it ended)."""
        if id(job) in self._ready:
            self._ready[id(job)].set()

    async def _watch_leases(self) -> None:
        while True:
            await asyncio.sleep(min(0.25, self.lease_s / 4))
            for job, m in self.table.expired(self.lease_s):
                lease_s = min(self.lease_s, TREE_LEASE_S) if m.rack else self.lease_s
                self.abort(job, f"{_who(m)} stopped heartbeating (lease of {lease_s:g} s expired)")


def _who(m) -> str:
    """A member as an abort's reason names it: a rank, or the rack box it is behind."""
    return f"the rack box {m.ip} (rank {m.rank} behind it)" if m.rack else f"rank {m.rank} ({m.ip})"
