"""A worker's side of a box's shares between jobs (docs/transport.md, "The
box's rate"), for the udp backend; worker/stream.c does the same in the
afxdp engine (bytes_left, box_pace).

What a rank tells the box: every DATA packet's `pace` is the pace code of the
payload bytes it has yet to send once in its current call, this packet's
included (a resend counts itself on top of those), which a box's `srpt`
policy serves least first. What it takes from the box: every authentic
RESULT's `pace` is the rate this rank may send to the box (kbit/s of
Ethernet frames, headers included; 0: no cap), which caps the window's pace
(window.py, set_rate), and its IPv4 DSCP is the job's mark, which the rank's
DATA to that box carry from then on.
"""
from __future__ import annotations

import socket

from .. import wire
from .window import CongestionWindow

#: recvmsg's room for the one-byte TOS it reports.
TOS_CMSG_SPACE = socket.CMSG_SPACE(1)


def bytes_left(npackets: int, first_unsent: int, p: int, retrans: bool,
               payload_bytes: int) -> int:
    """What packet p of a call of npackets says in `pace` (before encoding):
    the payload bytes not yet sent once, its own included. first_unsent: the
    first packet not yet sent once, other than p (a new packet is p itself)."""
    left = npackets - first_unsent + 1 if retrans else npackets - p
    return left * payload_bytes


def tos_of(ancdata) -> int:
    """The IPv4 TOS in recvmsg's ancillary data (IP_RECVTOS), or -1 if none."""
    for level, kind, data in ancdata:
        if level == socket.IPPROTO_IP and kind == socket.IP_TOS and data:
            return data[0]
    return -1


class BoxPace:
    """What one box's last authentic RESULT said, applied to this rank's
    stream to it: the window's rate cap and the socket's DSCP."""

    def __init__(self, window: CongestionWindow, sock: socket.socket):
        self.window, self.sock = window, sock
        self.code = 0         # the last pace code (0: no cap)
        self.rate_kbps = 0
        self.dscp = 0         # what our DATA carry (0 until the box marks)
        self.frame_bits = 0.0

    def frame(self, frame_bits: float) -> None:
        """The current call's DATA frames are frame_bits each."""
        self.frame_bits = frame_bits
        self.window.set_rate(self.rate_kbps * 1e3, frame_bits)

    def heard(self, code: int, tos: int) -> None:
        """An authentic RESULT's pace code and IPv4 TOS (-1: not read)."""
        if code != self.code:
            self.code, self.rate_kbps = code, wire.pace_decode(code)
            self.window.set_rate(self.rate_kbps * 1e3, self.frame_bits)
        if tos >= 0 and tos >> 2 != self.dscp:
            self.dscp = tos >> 2
            self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, self.dscp << 2)
