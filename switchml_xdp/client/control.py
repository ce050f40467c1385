"""The worker's side of the control protocol (docs/protocol.md): join with the
barrier, a heartbeat thread that keeps the lease, and the switch's events
(another rank failed, the switch is going down) turned into a reason the
datapath checks between packets."""
from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from dataclasses import dataclass

from .. import wire
from .abort import AbortSignal, JobAborted

__all__ = ["ControlClient", "ControlError", "JobAborted", "JobInfo"]



WEIGHT_ENV = "SWML_JOB_WEIGHT"
# The control connection's DSCP: CS6, network control (RFC 4594). Where a
# box marks jobs (`--dscp`) and the fabric serves marks by priority, a
# waiting job's DATA fill the lower classes; its heartbeats must not wait
# behind them (docs/operations.md, "Shares between jobs").
CONTROL_DSCP = 48


def mark_control(sock: socket.socket) -> None:
    """Mark a control connection's packets CS6 (where the kernel lets us)."""
    try:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, CONTROL_DSCP << 2)
    except OSError:
        pass


def job_weight_from_env() -> float | None:
    """$SWML_JOB_WEIGHT: a number above zero, or None where unset; a
    ValueError in one line otherwise (before anything is sent)."""
    text = os.environ.get(WEIGHT_ENV, "").strip()
    if not text:
        return None
    try:
        w = float(text)
    except ValueError:
        w = float("nan")
    if not math.isfinite(w) or w <= 0:
        raise ValueError(f"{WEIGHT_ENV} must be a number above zero, not {text!r}")
    return w

class ControlError(RuntimeError):
    """The switch refused a request, or could not be reached; says why."""


@dataclass(frozen=True)
class JobInfo:
    """What a join returns: everything the datapath needs."""
    name: str
    job_id: int
    world: int
    rank: int
    k: int
    slots: int
    switch_ip: str
    switch_mac: str
    switch_port: int
    group_ip: str
    group_mac: str
    port: int          # this worker's UDP port, where RESULTs arrive
    heartbeat_s: float
    key: int           # the job's data key: every DATA packet carries it
    seq_base: int      # the seq of the job's first packet
    # How RESULTs come: "multicast" (to the group) or "unicast" (to `port` on
    # this worker's own address, like shadow replies). Both are accepted either
    # way; this says which to expect. A switch older than the choice: multicast.
    fanout: str = "multicast"
    # RESULTs count only with the authenticator of this key (wire.result_checker),
    # covering what `auth` says (wire.AUTH_HEADER or AUTH_FULL).
    result_key: bytes = bytes(wire.RESULT_KEY_LEN)
    auth: int = wire.AUTH_HEADER
    # What the box's port carries, bits/s (None: it does not say): a job over
    # several boxes splits every tensor in proportion (client/boxes.py).
    capacity_bps: int | None = None
    # The box is a rack box under this parent box (docs/scale-out.md, "A tree
    # of boxes"): 16-bit rounds cannot go up the tree.
    parent: str | None = None
    # The job's lanes (docs/performance.md, "Several queues per worker"):
    # this worker sends and receives lane q on port + q.
    lanes: int = 1


def _capacity(value) -> int | None:
    """The join reply's capacity: a positive int, or None (unknown, or not an int)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _result_auth(reply: dict) -> tuple[bytes, int]:
    """The join reply's RESULT authentication: (result key, wire.AUTH_*)."""
    try:
        key, auth = bytes.fromhex(reply["result_key"]), wire.AUTH_MODES[reply["auth"]]
    except (KeyError, TypeError, ValueError):
        raise ControlError("the switch did not give a valid result key: it does not "
                           "authenticate its RESULTs (an older switch?); upgrade it") from None
    if len(key) != wire.RESULT_KEY_LEN:
        raise ControlError(f"the switch's result key is {len(key)} bytes, not {wire.RESULT_KEY_LEN}")
    return key, auth


class ControlClient:
    def __init__(self, switch: str, port: int = wire.DEFAULT_CONTROL_PORT, connect_timeout: float = 5.0):
        self.switch, self.port = switch, port
        try:
            self.sock = socket.create_connection((switch, port), timeout=connect_timeout)
        except OSError as e:
            raise ControlError(f"cannot reach the switch's control server at {switch}:{port}: "
                               f"{e.strerror or e}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        mark_control(self.sock)
        self._rfile = self.sock.makefile("rb")
        self._send_lock = threading.Lock()
        self._replies: list[dict] = []
        self._reply_ready = threading.Condition()
        self.abort = AbortSignal()  # what the Worker and its backend read
        self.resume_window_s = 30.0  # how long to try to reconnect after losing the switch
        self.resumed = 0
        self._resume_msg: dict = {}
        self._token: dict = {}   # {"token": ...} on every request of a job that has one
        self.left_ranks: set[int] = set()
        self.pongs = 0   # answers to heartbeats (ping)
        self._closed = threading.Event()
        self._reader: threading.Thread | None = None
        self._heartbeat: threading.Thread | None = None

    # --- plumbing ------------------------------------------------------------
    @property
    def abort_reason(self) -> str | None:
        """Why the job was aborted under this client, or None."""
        return self.abort.reason

    def _send(self, obj: dict) -> None:
        data = (json.dumps(obj) + "\n").encode()
        with self._send_lock:
            self.sock.sendall(data)

    def _read_line(self) -> dict | None:
        line = self._rfile.readline()
        if not line:
            return None
        return json.loads(line)

    def _reader_loop(self) -> None:
        """After the join: route replies to callers and events to flags. A
        broken connection is re-established with `resume` (the switch daemon
        may have been restarted; its data plane keeps aggregating meanwhile)."""
        while True:
            try:
                while True:
                    msg = self._read_line()
                    if msg is None:
                        break
                    self._route(msg)
            except (OSError, ValueError):
                pass
            if self._closed.is_set() or self.abort_reason is not None:
                break
            if not self._reconnect():
                self.abort.set(f"lost the control connection to the switch at {self.switch}:{self.port} "
                               f"and could not resume within {self.resume_window_s:g} s")
                break
        with self._reply_ready:
            self._reply_ready.notify_all()

    def _route(self, msg: dict) -> None:
        if "event" in msg:
            if msg["event"] == "abort":
                self.abort.set(msg.get("reason", "aborted by the switch"))
            elif msg["event"] == "left":
                self.left_ranks.add(msg.get("rank"))
            return
        if msg.get("op") == "heartbeat":
            if not msg.get("ok"):
                self.abort.set(f"the switch refused a heartbeat: {msg.get('error')}")
            self.pongs += 1     # the box answers: box_watch.py tells a live box by it
            return
        with self._reply_ready:
            self._replies.append(msg)
            self._reply_ready.notify_all()

    def _reconnect(self) -> bool:
        """Connect again and resume this rank's membership, until the window ends."""
        deadline = time.monotonic() + self.resume_window_s
        while time.monotonic() < deadline and not self._closed.is_set():
            try:
                sock = socket.create_connection((self.switch, self.port), timeout=1.0)
                mark_control(sock)
                sock.settimeout(5.0)
                rfile = sock.makefile("rb")
                sock.sendall((json.dumps(self._resume_msg) + "\n").encode())
                reply = json.loads(rfile.readline() or b"{}")
                if not reply.get("ok"):
                    sock.close()
                    self.abort.set(f"the switch refused to resume the job: {reply.get('error')}")
                    return True  # a definite answer: stop trying
                sock.settimeout(None)
                with self._send_lock:
                    old, self.sock, self._rfile = self.sock, sock, rfile
                old.close()
                self.resumed += 1
                return True
            except (OSError, ValueError):
                time.sleep(0.2)
        return False

    def request(self, obj: dict, timeout: float = 10.0) -> dict:
        """A request on a joined connection (replies come through the reader)."""
        self._send(obj)
        with self._reply_ready:
            if not self._reply_ready.wait_for(lambda: self._replies or self.abort_reason, timeout):
                raise ControlError(f"no reply from the switch to {obj.get('op')} within {timeout:g} s")
            if not self._replies:
                raise JobAborted(self.abort_reason)
            reply = self._replies.pop(0)
        if not reply.get("ok"):
            raise ControlError(reply.get("error", "request refused"))
        return reply

    # --- the protocol ------------------------------------------------------------
    def join(self, job: str, world: int, rank: int, ip: str, port: int, mac: str = "",
             timeout: float = 60.0, k: int | None = None, token: str | None = None,
             boxes: str | None = None, weight: float | None = None, lanes: int = 1) -> JobInfo:
        """token: the job's secret (every rank the same); None: an open job.
        lanes: the job's lanes, every rank the same (1: one stream).
        boxes: a job over several boxes, every box it joins (client/boxes.py).
        weight: what the job asks for under a box's `--share weighted`
        (capped there); None: $SWML_JOB_WEIGHT where set (docs/operations.md)."""
        self._token = {"token": token} if token is not None else {}
        msg = {"op": "join", "job": job, "world": world, "rank": rank, "ip": ip, "port": port,
               "mac": mac, "timeout": timeout, **self._token}
        weight = weight if weight is not None else job_weight_from_env()
        if weight is not None:
            msg["weight"] = weight
        if k is not None:
            msg["k"] = k
        if boxes is not None:
            msg["boxes"] = boxes
        if lanes != 1:   # unsaid, a switch that predates lanes takes the join too
            msg["lanes"] = lanes
        self._send(msg)
        self.sock.settimeout(timeout + 10.0)  # the switch answers at the barrier or its timeout
        try:
            reply = self._read_line()
        except TimeoutError:
            raise ControlError(f"the switch did not answer the join within {timeout + 10:g} s") from None
        finally:
            self.sock.settimeout(None)
        if reply is None:
            raise ControlError("the switch closed the connection during the join")
        if reply.get("event") == "abort":  # the job ended at the barrier (the switch shut down)
            raise ControlError(f"join refused: {reply.get('reason') or 'the switch aborted the job'}")
        if not reply.get("ok"):
            raise ControlError(f"join refused: {reply.get('error')}")
        sw, grp = reply["switch"], reply["group"]
        info = JobInfo(reply["job"], reply["job_id"], reply["world"], reply["rank"], reply["k"],
                       reply["slots"], sw["ip"], sw["mac"], sw["port"], grp["ip"], grp["mac"],
                       grp["port"], reply["heartbeat_s"], int(reply["key"], 16), reply["seq_base"],
                       sw.get("fanout", "multicast"), *_result_auth(reply),
                       _capacity(sw.get("capacity_bps")),
                       sw["parent"] if isinstance(sw.get("parent"), str) else None,
                       reply.get("lanes", 1))
        self._resume_msg = {"op": "resume", "job": info.name, "job_id": info.job_id, "rank": info.rank,
                            **self._token}
        self._reader = threading.Thread(target=self._reader_loop, name="swml-control", daemon=True)
        self._reader.start()
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, args=(info.heartbeat_s,),
                                           name="swml-heartbeat", daemon=True)
        self._heartbeat.start()
        return info

    def _heartbeat_loop(self, period: float) -> None:
        while not self._closed.wait(period):
            if self.abort_reason:
                return
            self.ping()  # unsent: the reader notices the broken connection and resumes on a new one

    def ping(self) -> bool:
        """Ask the box for a sign of life now: a heartbeat, whose answer
        counts in `pongs`; False if it could not be sent."""
        try:
            self._send({"op": "heartbeat", **self._token})
        except OSError:
            return False
        return True

    def status(self) -> dict:
        return self.ask({"op": "status"})

    def set_job_share(self, operator: str, job: str, weight: float | None = None,
                      dscp: int | None = None) -> dict:
        """The operator's `job` op (`swml-switch job`): set a running job's
        weight and/or pinned DSCP mark; ControlError with the box's one line
        where it refuses."""
        return self.ask({"op": "job", "operator": operator, "job": job, "weight": weight,
                         "dscp": dscp})

    def ask(self, obj: dict) -> dict:
        """One request, its reply (ControlError with the box's reason where
        it refuses)."""
        if self._reader is not None:  # joined: the reader thread owns the connection's input
            return self.request(obj)
        self._send(obj)
        reply = self._read_line()
        if reply is None or not reply.get("ok"):
            raise ControlError((reply or {}).get("error", f"no reply from the switch to "
                                                          f"{obj.get('op')}"))
        return reply

    def leave(self) -> None:
        if self.abort_reason is None and self._reader is not None:
            try:
                self.request({"op": "leave", **self._token}, timeout=5.0)
            except (ControlError, JobAborted, OSError):
                pass

    def close(self) -> None:
        self._closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
