"""A forger of RESULTs with the switch's own source address: root on a lab host
that is no member of the attacked job (docs/security.md, "RESULT
authenticators").

It hears the job's RESULTs (the lab's bridge floods multicast to it) and, for
each, sends raw frames from the switch's IPv4 address and data port (from its
own MAC: a frame from the switch's MAC would move the switch's entry in the
bridge's table to this host, ARP/MAC spoofing, the fabric attack that
docs/security.md leaves out of scope), to the group and to every member's own
address:
- RESULTs for the next `ahead` packets (same call, tag, op and job: the ones
  the ranks have in flight), values changed, with the authenticator of the
  RESULT it heard, which cannot be right for another seq;
- the RESULT it heard, values changed and authenticator kept: what takes the
  place of a RESULT a member lost, unless the payload is authenticated too.
Nothing here knows the job's result key: that is the point.
"""
from __future__ import annotations

import socket
import struct
import threading

from crafted_packets import raw_socket
from frames import Endpoint, udp_frame
from switchml_xdp import wire

SEQ_AT = wire.HDR_DTYPE.fields["seq"][1]
SLOT_AT = wire.HDR_DTYPE.fields["slot"][1]


class SpoofedResults:
    """Runs on `host` of `lab` from start() to stop(); counts what it heard and sent."""

    def __init__(self, lab, host, info, members, ahead: int, race: bool = True):
        """race: also send the heard RESULT itself with changed values (which
        only an authenticator over the payload refuses)."""
        self.info, self.ahead, self.race = info, ahead, race
        with lab.enter(host):
            self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.rx.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.rx.bind(("0.0.0.0", info.port))
            self.rx.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                               socket.inet_aton(info.group_ip) + socket.inet_aton(host.ip))
        self.rx.settimeout(0.05)
        self.tx = raw_socket(lab, host)
        self.switch = Endpoint(host.mac, info.switch_ip, info.switch_port)
        self.dests = [Endpoint(info.group_mac, info.group_ip, info.port),
                      *(Endpoint(m.mac, m.ip, info.port) for m in members)]
        self.heard = self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> SpoofedResults:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.rx.close()
        self.tx.close()

    def _send(self, payload: bytes) -> None:
        for dst in self.dests:
            self.tx.send(udp_frame(self.switch, dst, payload))
            self.sent += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                real = self.rx.recv(4096)
            except TimeoutError:
                continue
            if len(real) <= wire.HDR_LEN:
                continue
            self.heard += 1
            values = bytes((b + 1) & 0xFF for b in real[wire.HDR_LEN:])
            if self.race:
                self._send(real[:wire.HDR_LEN] + values)  # the race against a lost RESULT
            (seq,) = struct.unpack_from("!I", real, SEQ_AT)
            (slot,) = struct.unpack_from("!H", real, SLOT_AT)
            for i in range(1, self.ahead + 1):
                fake = bytearray(real[:wire.HDR_LEN] + values)
                struct.pack_into("!I", fake, SEQ_AT, (seq + i) & 0xFFFFFFFF)
                struct.pack_into("!H", fake, SLOT_AT, (slot + i) % self.info.slots)
                self._send(bytes(fake))
