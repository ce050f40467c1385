"""A worker played by hand in the lab: a UDP socket in a worker namespace that
sends crafted DATA datagrams to the switch and reads what comes back."""
from __future__ import annotations

import socket

import numpy as np

from switchml_xdp import wire


class Peer:
    """A hand-driven worker: a UDP socket in a worker namespace, bound to the
    job's port and joined to its group, sending whatever the test says."""

    def __init__(self, lab, host, port):
        with lab.enter(host):
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(("0.0.0.0", port))
        self.host, self.port = host, port
        self.dest = (lab.switch.ip, wire.DEFAULT_PORT)

    def join_group(self, group_ip):
        mreq = socket.inet_aton(group_ip) + socket.inet_aton(self.host.ip)
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)

    def send(self, payload: bytes):
        self.sock.sendto(payload, self.dest)

    def recv(self, timeout=1.0):
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096)
        except TimeoutError:
            return None
        return wire.unpack_header(data), np.frombuffer(data, "<i4", offset=wire.HDR_LEN)

    def close(self):
        self.sock.close()


def data(info, rank: int, slot: int, seq: int, values, **kw) -> bytes:
    """A DATA datagram of the joined job `info` (its data key included)."""
    return wire.datagram(wire.TYPE_DATA, info.job_id, rank, slot, seq, values, key=info.key, **kw)
