"""A fake switch on the loopback that plays a box with shares: its RESULTs
carry a rate in `pace` and a DSCP in their IPv4 TOS, and it records each
DATA's arrival time, header and TOS (docs/transport.md, "The box's rate")."""
from __future__ import annotations

import socket
import time

import numpy as np

from fake_switch import FakeSwitch, result_of, signed
from switchml_xdp import wire

PACE_AT = wire.HDR_DTYPE.fields["pace"][1]   # where `pace` sits in the swml header
SO_RCVBUFFORCE = 33                          # Linux's; Python's socket module lacks the name


def stamped(h, values, rate_kbps: int, key: bytes | None = None) -> bytes:
    """The honest RESULT for DATA header h with `pace` the code of rate_kbps,
    signed with the job's result key (key=None) or left unsigned (key=b"")."""
    buf = bytearray(result_of(h, values, key=None))
    buf[PACE_AT:PACE_AT + 2] = wire.pace_encode(rate_kbps).to_bytes(2, "big")
    return bytes(buf) if key == b"" else signed(bytes(buf))


class PacedSwitch(FakeSwitch):
    """answer(h, values) as FakeSwitch's, whose items may name a DSCP of
    their own, (from_forger, payload, dscp); else RESULTs leave with `dscp`.
    `arrivals` lists (monotonic time, header, TOS) per DATA datagram."""

    def __init__(self, answer, dscp: int = 0, bind: tuple[str, int] = ("127.0.0.1", 0)):
        self.arrivals: list = []
        self._dscp = dscp
        super().__init__(answer, bind)

    def _loop(self) -> None:
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        try:   # a lagging box queues DATA rather than drop them (root: past rmem_max)
            self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 4 << 20)
        except PermissionError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        while not self._stop.is_set():
            try:
                data, anc, _, addr = self.sock.recvmsg(4096, socket.CMSG_SPACE(1))
            except TimeoutError:
                continue
            tos = next((d[0] for lvl, kind, d in anc if kind == socket.IP_TOS and d), -1)
            h = wire.unpack_header(data)
            self.headers.append(h)
            self.arrivals.append((time.monotonic(), h, tos))
            for forged, payload, *dscp in self.answer(h, np.frombuffer(data, "<i4",
                                                                      offset=wire.HDR_LEN)):
                sock = self.forger if forged else self.sock
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, (dscp or [self._dscp])[0] << 2)
                sock.sendto(payload, addr)


def send_rates_bps(arrivals, frame_bytes: int, skip: int,
                   bin_s: float = 0.05) -> tuple[float, float]:
    """The DATA's rate in bits/s of frames of frame_bytes, over the first
    sends from the skip-th on (resends left out): (the mean, from the first
    to the last; the paced, the median over bins of bin_s). A worker that
    keeps to the rate has both at it; one starved of CPU for a while (a
    loaded machine) falls behind on the mean, never above it, while most
    bins still show its pacer's rate."""
    times = [t for t, h, _ in arrivals if not int(h["flags"]) & wire.FLAG_RETRANS][skip:]
    bits, t0 = frame_bytes * 8, times[0]
    counts = [0] * int((times[-1] - t0) / bin_s)
    for t in times:
        if int((t - t0) / bin_s) < len(counts):
            counts[int((t - t0) / bin_s)] += 1
    assert len(counts) >= 5, f"{len(times)} sends in {times[-1] - t0:.3f} s: too few bins"
    return (len(times) - 1) * bits / (times[-1] - t0), sorted(counts)[len(counts) // 2] * bits / bin_s
