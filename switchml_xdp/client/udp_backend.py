"""The `udp` backend: the wire protocol over kernel UDP sockets, no root needed.

`udp_backend()` makes it: on the C engine where it is built
(udp_engine_backend.py: batched syscalls, the afxdp backend's stream), else
(or with SWML_UDP_ENGINE=0) the Python loop below, UdpBackend, which is also
the reference the engine's rules are written after.

One socket bound to the job's port (port.py: no SO_REUSEADDR, so no other
socket on the host can share it) receives both the multicast RESULTs (it
joins the job's group) and unicast shadow replies. Streaming follows
plans.py and calls.py; new packets go in order, as many in flight as the
congestion window allows and paced (window.py: the rules both backends
share); each in-flight packet has a retransmission timer (retransmit.py: the
policy both backends share), and a tensor that makes no progress for
`stall_timeout` seconds fails with the slots it was waiting for.

A datagram counts as a RESULT of the call only if it comes from the switch's
address and port, is a RESULT of this job with k elements, carries the seq
of one of the call's packets in flight on its slot, and the call's tag and op
(`accept`). One such RESULT flagged DISAGREE ends the call with CallMismatch.

The box's word on shares (pace.py): every DATA says the call's bytes left,
every authentic RESULT's rate caps the window's pace and its DSCP marks our
DATA from then on. The TOS is read with recvmsg (IP_RECVTOS) from the first
datagram of each batch only, the others with recvfrom: recvmsg and its
ancillary data cost ~0.5 us more a datagram (docs/transport.md, "The box's
rate"), and a job's mark changes seldom.
"""
from __future__ import annotations

import os
import select
import socket
import time

import numpy as np

from .. import wire
from .backend import Backend
from .calls import SEQ_MASK, Call, CallSpan, check_length, resync_index
from .pace import TOS_CMSG_SPACE, BoxPace, bytes_left, tos_of
from .plans import make_plan, packets_needed, shard_owners
from .port import reserve_port
from .retransmit import PYTHON_POLICY, RetransmitTimers
from .window import CongestionWindow

HDR = wire.HDR_STRUCT  # struct swml_hdr, field by field
ENV_PREFIX = "SWML_UDP_"  # SWML_UDP_RTO_MIN=...: knobs for experiments (RetransmitPolicy.with_env)

POLL_MAX_S = 0.05  # the longest wait between two reads of the abort signal
RX_BATCH = 256     # datagrams read between two looks at the timers

# What `accept` makes of a datagram. HEADER_ONLY: a RESULT without its payload,
# for a packet of another rank's shard (a reduce_scatter through a switch with
# --fanout unicast): the round is done, nothing of it to keep.
FOREIGN, DUPLICATE, RESULT, DISAGREED, FORGED, HEADER_ONLY = range(6)
#: Payload bytes an element, by format (a RESULT's payload as its authenticator covers it).
FMT_BYTES = {wire.FMT_INT32: 4, wire.FMT_OFFSET32: 4, wire.FMT_INT16: 2}


def udp_backend(*args, engine: bool | None = None, **kwargs) -> Backend:
    """Backend "udp" (backend.py's arguments): on the C engine where it is
    built, else the Python loop; engine=True insists on the engine
    (RuntimeError without it), engine=False on the loop; None: the engine
    unless SWML_UDP_ENGINE=0."""
    from .engine_backend import engine_missing
    from .udp_engine_backend import UdpEngineBackend

    if engine is None:
        engine = os.environ.get(f"{ENV_PREFIX}ENGINE", "1") != "0" and engine_missing() is None
    return UdpEngineBackend(*args, **kwargs) if engine else UdpBackend(*args, **kwargs)


class UdpBackend(Backend):
    default_policy = PYTHON_POLICY
    name = "udp"
    loop = "python"   # which loop runs the stream (Worker.stats' "loop"; the engine's: "engine")
    precisions = ("32", "16")
    env_prefix = ENV_PREFIX

    def __init__(self, *args, **kwargs):
        """Backend's arguments (backend.py)."""
        super().__init__(*args, **kwargs)
        info = self.info
        # One set of timers per worker: what an adaptive policy learnt about round
        # trips carries over from tensor to tensor.
        self.timers = RetransmitTimers(self.policy)
        self.window = CongestionWindow(info.slots, self.window_policy)
        self.sock = reserve_port(info.port, info.group_ip, self.local.ip, rcvbuf=8 << 20)
        self.sock.setblocking(False)
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        self.box = BoxPace(self.window, self.sock)
        self.dest = (info.switch_ip, info.switch_port)
        self.next_index = 0  # p_job: packets of the job's life; slot and version follow from it
        self._counters = {"packets_sent": 0, "retransmissions": 0, "results": 0, "duplicates": 0,
                          "shadow_replies": 0, "ignored": 0, "forged": 0, "header_only": 0,
                          "pace_waits": 0, "rate_waits": 0}
        k = info.k
        # One transmit buffer and one view of the received values per payload
        # format (SWML_FMT_*: int32, int32 in offset binary, int16), chosen per
        # call. The plans (plans.py) apply and take off the offset.
        self._elem_by_fmt = {wire.FMT_INT32: "<i4", wire.FMT_OFFSET32: "<i4",
                             wire.FMT_INT16: "<i2"}
        self._tx_by_fmt = {f: bytearray(wire.HDR_LEN + np.dtype(e).itemsize * k)
                           for f, e in self._elem_by_fmt.items()}
        self._rx = bytearray(wire.PAGE_FRAME_LEN)  # more than any datagram (swml_wire.h)
        self._rx_bufs = [self._rx]
        self._rx_tos = -1  # the datagram's TOS where it was read (-1: not)
        self._rx_vals_by_fmt = {f: np.frombuffer(self._rx, dtype=e, count=k, offset=wire.HDR_LEN)
                                for f, e in self._elem_by_fmt.items()}
        self._select_fmt(wire.FMT_INT32)
        # Per packet, in Python: what does not change is looked up once.
        self._data_vt = wire.ver_type(wire.TYPE_DATA)
        self._result_vt = wire.ver_type(wire.TYPE_RESULT)
        self._call_fields = (0, 0, 0, 0)  # the current call's op, tag, first seq, first packet
        # The current call's DATA `owner` byte of each packet (plans.shard_owners),
        # as bytes: indexed per packet sent, an int without numpy's scalar cost.
        self._owners = b""
        self._authentic = wire.result_checker(info.result_key, info.auth)
        # A header-only RESULT's authenticator covers its header alone, whatever `auth`.
        self._authentic_header = wire.result_checker(info.result_key, wire.AUTH_HEADER)

    def _select_fmt(self, fmt: int) -> None:
        """The current call's payload format: its buffers, element type, length."""
        self._fmt, self._tx = fmt, self._tx_by_fmt[fmt]
        self._elem, self._rx_vals = self._elem_by_fmt[fmt], self._rx_vals_by_fmt[fmt]
        self._min_len = len(self._tx)
        self._payload_bytes = len(self._tx) - wire.HDR_LEN
        self.box.frame(8.0 * (wire.HEADERS_LEN + self._payload_bytes))

    def close(self) -> None:
        self.sock.close()

    def stats(self) -> dict:
        return {**self._counters, "spurious_timeouts": self.timers.spurious,
                "rack_resends": self.timers.evidence_resends,
                "reorder_seen": self.timers.reorder_seen, "reo_mult": self.timers.reo_mult,
                "tail_probes": self.timers.tail_probes,
                "timeout_copies": self.timers.timeout_copies,
                "rto_us": int(self.timers.estimator.rto * 1e6),
                "cwnd": int(self.window.cwnd), "rate_kbps": self.box.rate_kbps,
                "dscp": self.box.dscp}

    def _send(self, plan, p: int, retrans: bool, first_unsent: int) -> None:
        """Packet p of the current call (run() set _call_fields); first_unsent:
        the first packet not yet sent once (pace.bytes_left)."""
        op, tag, seq0, start = self._call_fields
        info = self.info
        i, S = start + p, info.slots
        values, exp, flags = plan.payload(p)
        flags |= ((i // S) & 1) * wire.FLAG_SLOT_VER | (wire.FLAG_RETRANS if retrans else 0)
        HDR.pack_into(self._tx, 0, self._data_vt, flags, op, self._fmt, info.job_id,
                      info.rank, i % S, info.k, (seq0 + p) & SEQ_MASK, tag, exp,
                      self._owners[p],
                      wire.pace_encode(bytes_left(plan.npackets, first_unsent, p, retrans,
                                                  self._payload_bytes)), info.key)
        self._tx[wire.HDR_LEN:] = values.astype(self._elem, copy=False).tobytes()
        self.sock.sendto(self._tx, self.dest)
        self._counters["packets_sent"] += 1

    def allreduce(self, flat: np.ndarray, call: Call) -> None:
        """Reduce a 1-D float32/int32 array in place with call.op."""
        if self.sock.fileno() < 0:
            raise RuntimeError("the udp backend is closed")
        self.abort_signal.raise_if_set(self.info.name)
        check_length(call, packets_needed(flat.size, flat.dtype, self.info.k, self.info.slots,
                                          call.op_code), self.info.k)
        plan = make_plan(flat, self.info.k, self.info.slots, self.info.world, call.op_code,
                         call.fmt)
        self._select_fmt(call.fmt)
        self._owners = shard_owners(plan, flat.size, self.info.k, call.shard,
                                    self.info.world).tobytes()
        start = self.next_index
        try:
            self.run(plan, call)
        except BaseException:
            # Every rank that failed this call goes on from the same packet,
            # past anything the call sent: the job stays usable.
            self.next_index = resync_index(start, self.info.slots)
            raise

    def accept(self, nbytes: int, source, call: Call, span: CallSpan,
               in_flight) -> tuple[int, int, int, int, int]:
        """What the datagram in the receive buffer is to the call:
        (verdict, packet, flags, exp, rank), rank being whose packet completed
        the round. FOREIGN: not a RESULT of this call from the switch;
        FORGED: not with the authenticator of the job's result key;
        HEADER_ONLY: the round of packet `packet` is done, its sum went to
        the rank whose shard it is (only taken for another rank's packet);
        DUPLICATE: a RESULT of a packet not in flight; RESULT or DISAGREED:
        the answer to packet `packet`. in_flight(p): packet p is sent and
        unanswered."""
        if source != self.dest or nbytes < wire.HDR_LEN:
            return FOREIGN, -1, 0, 0, -1
        vt, flags, op, fmt, job, rank, slot, count, seq, tag, exp, _owner, pace, _key = \
            HDR.unpack_from(self._rx)
        info = self.info
        if vt != self._result_vt or job != info.job_id or count != info.k:
            return FOREIGN, -1, 0, 0, -1
        # Nothing in it is believed before its authenticator is checked: over its
        # payload too under AUTH_FULL, as long as k elements of its own format.
        header_only = flags & wire.FLAG_HEADER_ONLY
        if not (self._authentic_header(self._rx, nbytes, 0) if header_only else
                self._authentic(self._rx, nbytes, FMT_BYTES.get(fmt, 4) * count)):
            return FORGED, -1, 0, 0, -1
        self.box.heard(pace, self._rx_tos)
        p = (seq - span.seq_base - span.start) & SEQ_MASK  # CallSpan.packet_of, inline
        if p >= span.npackets or slot != (span.start + p) % info.slots:
            return FOREIGN, -1, 0, 0, -1
        if not in_flight(p):
            return DUPLICATE, p, flags, exp, rank
        if flags & wire.FLAG_DISAGREE:
            # The round's tag and op are another rank's: the mismatch itself.
            return DISAGREED, p, flags, exp, rank
        # A DISAGREE round may answer in another rank's payload format (16
        # against 32 bits): only a result to be read must be in ours, whole.
        if tag != call.tag or op != call.op_code or fmt != self._fmt:
            return FOREIGN, p, flags, exp, rank
        if header_only:  # taken only where the sum is another rank's to keep
            mine = self._owners[p] in (0, info.rank + 1)
            return (FOREIGN if mine else HEADER_ONLY), p, flags, exp, rank
        if nbytes < self._min_len:
            return FOREIGN, p, flags, exp, rank
        return RESULT, p, flags, exp, rank

    def run(self, plan, call: Call) -> None:
        """Stream a whole plan through the job's slots; returns when every
        packet has its result."""
        S, N, lag = self.info.slots, plan.npackets, plan.lag
        base = self.next_index
        span = CallSpan(base, N, self.info.seq_base)
        self._call_fields = (call.op_code, call.tag, span.seq(0), base)
        done = np.zeros(N, dtype=bool)
        sent = np.zeros(N, dtype=bool)
        timers, window = self.timers, self.window
        timers.start()
        remaining = N
        next_new = 0       # new packets go in order: the first never sent
        in_flight_count = 0
        pace_until = None  # a ready packet waits for its paced send time
        waiting = -1       # the packet last counted as waiting for its pace
        last_progress = time.monotonic()

        def ready(p: int) -> bool:
            return (p < S or done[p - S]) and (p < lag or done[p - lag])

        def pump(now: float) -> float | None:
            """New packets while the window has room and the pace allows;
            returns when the next one may go if the pace holds it back."""
            nonlocal next_new, in_flight_count, waiting
            limit = window.limit()
            while next_new < N and ready(next_new):
                if in_flight_count >= limit:
                    return None
                if window.send_at() > now:
                    if waiting != next_new:  # each waiting packet counts once
                        waiting = next_new
                        self._counters["pace_waits"] += 1
                        self._counters["rate_waits"] += window.rate_bound()
                    return window.send_at()
                window.sent(now)
                self._send(plan, next_new, False, next_new)
                sent[next_new] = True
                timers.sent(next_new)
                next_new += 1
                in_flight_count += 1
            return None

        pace_until = pump(time.monotonic())
        timers.pacing = pace_until is not None
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)

        def in_flight(p: int) -> bool:
            return bool(sent[p]) and not done[p]

        while remaining:
            self.abort_signal.raise_if_set(self.info.name)
            next_deadline = timers.next_deadline()
            wake = min((t for t in (next_deadline, pace_until) if t is not None), default=None)
            wait = POLL_MAX_S if wake is None else wake - time.monotonic()
            progress = False
            if poller.poll(max(0, min(wait, POLL_MAX_S)) * 1000):
                for i in range(RX_BATCH):
                    try:
                        if i:
                            nbytes, source = self.sock.recvfrom_into(self._rx)
                            self._rx_tos = -1
                        else:
                            nbytes, anc, _, source = self.sock.recvmsg_into(self._rx_bufs,
                                                                            TOS_CMSG_SPACE)
                            self._rx_tos = tos_of(anc)
                    except BlockingIOError:
                        break
                    verdict, p, flags, exp, rank = self.accept(nbytes, source, call, span,
                                                               in_flight)
                    if verdict == FORGED:
                        self._counters["forged"] += 1
                        continue
                    if verdict == FOREIGN:
                        self._counters["ignored"] += 1
                        continue
                    if verdict == DUPLICATE:
                        self._counters["duplicates"] += 1
                        timers.duplicate(p)
                        continue
                    if verdict == DISAGREED:
                        raise call.mismatch()
                    if flags & wire.FLAG_SHADOW:
                        self._counters["shadow_replies"] += 1
                    # A loss, if this answers a resend: ours completed the
                    # round, or the round was complete before (retransmit.py)
                    lost = rank == self.info.rank or bool(flags & wire.FLAG_SHADOW)
                    rtt = timers.answered(p, lost)
                    if rtt is not None:
                        window.on_ack(rtt, time.monotonic())
                    if verdict == HEADER_ONLY:
                        self._counters["header_only"] += 1
                    plan.result(p, None if verdict == HEADER_ONLY else self._rx_vals, exp, flags)
                    done[p] = True
                    in_flight_count -= 1
                    remaining -= 1
                    self._counters["results"] += 1
                    progress = True
            now = time.monotonic()
            evidence = timers.lost_by_evidence() if progress else ()
            for p in evidence:  # a packet sent later has its result (retransmit.py)
                self._counters["retransmissions"] += 1
                self._send(plan, p, True, next_new)
            if evidence:
                window.on_loss(now, timeout=False)
            pace_until = pump(now)
            timers.pacing = pace_until is not None
            if progress:
                last_progress = now
                continue
            # Idle, or only datagrams that were no results (a stream of
            # foreign ones must not hold off retransmissions or the stall).
            if now - last_progress > self.stall_timeout:
                raise TimeoutError(
                    f"no result from the switch for {self.stall_timeout:g} s; waiting for "
                    f"slot(s) {sorted((base + p) % S for p in timers.pending())[:8]} "
                    f"of job {self.info.name!r}")
            if (tail := timers.tail_probe()) is not None:
                self._counters["retransmissions"] += 1
                self._send(plan, tail, True, next_new)
            if next_deadline is not None and now >= next_deadline:
                lost = False
                for p in timers.expired():
                    self._counters["retransmissions"] += 1
                    self._send(plan, p, True, next_new)
                    lost = True
                if lost:
                    window.on_loss(now)
        self.next_index = base + N
        plan.finish()
