"""The `udp` backend: the wire protocol over kernel UDP sockets, no root needed.

One socket bound to the job's port receives both the multicast RESULTs (it
joins the job's group) and unicast shadow replies. Streaming follows
plans.py; each in-flight packet has a retransmission timer (retransmit.py:
the policy both backends share), and a tensor that makes no progress for
`stall_timeout` seconds fails with the slots it was waiting for.
"""
from __future__ import annotations

import select
import socket
import time

import numpy as np

from .. import wire
from .abort import AbortSignal
from .backend import Backend, LocalEnd
from .control import JobInfo
from .plans import make_plan
from .retransmit import PYTHON_POLICY, RetransmitPolicy, RetransmitTimers

HDR = wire.HDR_STRUCT  # struct swml_hdr, field by field

POLL_MAX_S = 0.05  # the longest wait between two reads of the abort signal


class UdpBackend(Backend):
    default_policy = PYTHON_POLICY
    name = "udp"

    def __init__(self, info: JobInfo, local: LocalEnd, abort: AbortSignal,
                 policy: RetransmitPolicy | None = None, stall_timeout: float = 30.0, *,
                 verbose: bool = True):
        self.info = info
        self.abort_signal = abort
        self.stall_timeout = stall_timeout
        # One set of timers per worker: what an adaptive policy learnt about round
        # trips carries over from tensor to tensor.
        self.timers = RetransmitTimers(policy or self.default_policy)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            self.sock.bind(("0.0.0.0", info.port))
            mreq = socket.inet_aton(info.group_ip) + socket.inet_aton(local.ip)
            self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
            self.sock.setblocking(False)
        except OSError:
            self.sock.close()
            raise
        self.dest = (info.switch_ip, info.switch_port)
        self.next_index = 0  # packets sent over the job's life: slot and version follow from it
        self._counters = {"packets_sent": 0, "retransmissions": 0, "results": 0, "duplicates": 0,
                          "shadow_replies": 0}
        k = info.k
        self._tx = bytearray(wire.HDR_LEN + 4 * k)
        self._rx = bytearray(2048)
        self._rx_vals = np.frombuffer(self._rx, dtype="<i4", count=k, offset=wire.HDR_LEN)

    def close(self) -> None:
        self.sock.close()

    def stats(self) -> dict:
        return {**self._counters, "rto_us": int(self.timers.estimator.rto * 1e6)}

    def _send(self, plan, p: int, base: int, retrans: bool) -> None:
        i = base + p
        S = self.info.slots
        values, exp, flags = plan.payload(p)
        flags |= ((i // S) & 1) * wire.FLAG_SLOT_VER | (wire.FLAG_RETRANS if retrans else 0)
        HDR.pack_into(self._tx, 0, wire.ver_type(wire.TYPE_DATA), flags, self.info.job_id,
                      self.info.rank, i % S, i & 0xFFFFFFFF, exp, 0, self.info.k)
        self._tx[wire.HDR_LEN:] = values.astype("<i4", copy=False).tobytes()
        self.sock.sendto(self._tx, self.dest)
        self._counters["packets_sent"] += 1

    def allreduce(self, flat: np.ndarray) -> None:
        """Reduce a 1-D float32/int32 array in place."""
        if self.sock.fileno() < 0:
            raise RuntimeError("the udp backend is closed")
        self.abort_signal.raise_if_set(self.info.name)
        self.run(make_plan(flat, self.info.k, self.info.slots, self.info.world))

    def run(self, plan) -> None:
        """Stream a whole plan through the job's slots; returns when every
        packet has its result."""
        S, N, lag = self.info.slots, plan.npackets, plan.lag
        base = self.next_index
        done = np.zeros(N, dtype=bool)
        sent = np.zeros(N, dtype=bool)
        timers = self.timers
        timers.start()
        remaining = N
        last_progress = time.monotonic()

        def ready(p: int) -> bool:
            return (p < S or done[p - S]) and (p < lag or done[p - lag])

        def send(p: int) -> None:
            self._send(plan, p, base, False)
            sent[p] = True
            timers.sent(p)

        for p in range(min(S, N)):
            if ready(p):
                send(p)
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        expected_vt = wire.ver_type(wire.TYPE_RESULT)
        while remaining:
            self.abort_signal.raise_if_set(self.info.name)
            next_deadline = timers.next_deadline()
            wait = POLL_MAX_S if next_deadline is None else next_deadline - time.monotonic()
            if not poller.poll(max(0, min(wait, POLL_MAX_S)) * 1000):
                if time.monotonic() - last_progress > self.stall_timeout:
                    raise TimeoutError(
                        f"no result from the switch for {self.stall_timeout:g} s; waiting for "
                        f"slot(s) {sorted((base + p) % S for p in timers.pending())[:8]} "
                        f"of job {self.info.name!r}")
                for p in timers.expired():
                    self._counters["retransmissions"] += 1
                    self._send(plan, p, base, True)
                continue
            while True:
                try:
                    nbytes = self.sock.recv_into(self._rx)
                except BlockingIOError:
                    break
                if nbytes < wire.HDR_LEN + 4 * self.info.k:
                    continue
                vt, flags, job, _rank, slot, seq, exp, _r, count = HDR.unpack_from(self._rx)
                if vt != expected_vt or job != self.info.job_id:
                    continue
                p = (seq - base) & 0xFFFFFFFF
                if p >= N or done[p] or not sent[p]:
                    self._counters["duplicates"] += 1
                    continue
                if flags & wire.FLAG_SHADOW:
                    self._counters["shadow_replies"] += 1
                timers.answered(p)
                plan.result(p, self._rx_vals, exp, flags)
                done[p] = True
                remaining -= 1
                self._counters["results"] += 1
                last_progress = time.monotonic()
                for q in (p + S, p + lag):
                    if q < N and not sent[q] and ready(q):
                        send(q)
        self.next_index = base + N
        plan.finish()
