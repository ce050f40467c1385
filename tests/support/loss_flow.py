"""UDP between two hosts of a lab, for the loss injector's tests
(tests/lab/test_loss.py, test_loss_bursts.py): numbered datagrams, and which
of them arrived."""
from __future__ import annotations

import socket
import time

from switchml_xdp import wire

PORT = wire.DEFAULT_PORT
N = 2000                    # datagrams a send, by default
SO_RCVBUFFORCE = 33         # Linux's; Python's socket module lacks the name


class Flow:
    """UDP from `src` (bound to sport) to `dst` (bound to dport)."""

    def __init__(self, lab, src, dst, dport=PORT, sport=40000):
        self.dst_ip, self.dport = lab.host(dst).ip, dport
        with lab.enter(dst):
            self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
            self.rx.bind(("0.0.0.0", dport))
        with lab.enter(src):
            self.tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.tx.bind(("0.0.0.0", sport))

    def send(self, n: int = N) -> int:
        """n datagrams in bursts of 100; returns how many arrived (copies included)."""
        return len(self.send_numbered(n))

    def send_numbered(self, n: int = N) -> list[int]:
        """n datagrams numbered 0..n-1, in bursts of 100; the numbers that
        arrived, in arrival order (copies included)."""
        for i in range(n):
            self.tx.sendto(i.to_bytes(4, "little") * 16, (self.dst_ip, self.dport))
            if i % 100 == 99:
                time.sleep(0.001)
        return self.drain()

    def drain(self, quiet: float = 0.2) -> list[int]:
        got = []
        self.rx.settimeout(quiet)
        try:
            while True:
                got.append(int.from_bytes(self.rx.recv(2048)[:4], "little"))
        except TimeoutError:
            return got

    def close(self) -> None:
        self.rx.close()
        self.tx.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
