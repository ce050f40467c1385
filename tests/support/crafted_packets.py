"""Packets crafted by hand for the reliability tests (test_tenants.py,
test_fuzz.py): the sockets that send them, a pacer that keeps the switch's
veth ring from overflowing, and the frames the switch receives (what
xdp_tester.SwitchOracle predicts the switch's verdict from)."""
from __future__ import annotations

import errno
import socket
import time

from frames import Endpoint, endpoint, udp_frame
from reliability_helpers import PORT, K
from switchml_xdp import wire
from switchml_xdp.switch.maps import SwitchMaps

PAYLOAD_LEN = wire.HDR_LEN + 4 * K                 # a whole DATA datagram's UDP payload
IP_RECVERR = 11                                    # <linux/in.h>: local drops become ENOBUFS


def udp_socket(lab, host, port: int) -> socket.socket:
    """A UDP socket in host's namespace, bound to `port`, that reports a frame its
    own interface dropped (ENOBUFS, thanks to IP_RECVERR) instead of losing it
    silently, so that a sender can count exactly what left."""
    with lab.enter(host):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
    s.bind(("0.0.0.0", port))
    return s


def raw_socket(lab, host) -> socket.socket:
    with lab.enter(host):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((host.iface, 0))
    return s


SOL_PACKET, PACKET_QDISC_BYPASS = 263, 20


def qdisc_bypass_socket(lab, host) -> socket.socket:
    """A raw socket on `host`'s lab interface whose frames go to the driver past
    the qdisc and tc egress, as an AF_XDP socket in copy mode sends them."""
    s = raw_socket(lab, host)
    s.setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS, 1)
    return s


class Pacer:
    """Keeps at most `window` frames to the switch's data port in flight
    between our senders and the switch program. Under load the kernel defers
    softirq work to ksoftirqd, and a sender that outruns it fills the
    256-frame NAPI ring of the switch's veth, which then drops (tx_dropped of
    the bridge's port; seen once on this 2-core machine with benchmarks
    running next to the tests, 1537 frames). In flight = our frames to the
    port + the other senders' (`others()`, live) - the switch's rx since;
    nothing else sends to the port meanwhile, so the estimate is exact but
    for frames the senders have not counted yet. A wait gives up after 0.5 s
    (frames a veth did drop never arrive); the drop then shows in the link
    counters the tests check."""

    def __init__(self, sw, others=lambda: 0, window: int = 64, every: int = 16):
        self.maps = SwitchMaps(sw.iface)
        self.others, self.window, self.every = others, window, every
        self.base, self.others0 = self._rx(), others()
        self.waits = self.gave_up = self.peak = 0

    def _rx(self) -> int:
        return sum(v.value for v in self.maps.counters.lookup(wire.CNT_RX))

    def __call__(self, sent: int) -> None:
        """sent: our frames to the data port so far."""
        if sent % self.every:
            return
        deadline = time.monotonic() + 0.5
        while (inflight := sent + self.others() - self.others0 - (self._rx() - self.base)) > self.window:
            self.peak = max(self.peak, inflight)
            self.waits += 1
            if time.monotonic() > deadline:
                self.gave_up += 1
                return
            time.sleep(0.0002)

    def close(self) -> None:
        self.maps.close()


def send_all(sends, dest, pace=lambda sent: None) -> dict[str, int]:
    """sends: (socket, [buffers], raw?, counts as rx?) in order; pace(frames
    sent so far that count as rx at the switch) is called before each send.
    A send that did not leave is repeated: ENOBUFS (the local veth's ring was
    full), EAGAIN (a non-blocking
    socket's buffer was full) and ECONNREFUSED (with IP_RECVERR, an ICMP port
    unreachable that came back for an earlier datagram, e.g. one the fuzzer
    forged with this socket's address, is reported by the next send, which
    then sends nothing). Returns how many of each were repeated."""
    repeated = {}
    rx = 0
    for sock, bufs, raw, is_rx in sends:
        if is_rx:
            pace(rx)
            rx += 1
        while True:
            try:
                if raw:
                    sock.sendmsg(bufs)
                else:
                    sock.sendmsg(bufs, [], 0, dest)
                break
            except OSError as e:
                if e.errno not in (errno.ENOBUFS, errno.EAGAIN, errno.ECONNREFUSED):
                    raise
                name = errno.errorcode[e.errno]
                repeated[name] = repeated.get(name, 0) + 1
                if e.errno != errno.ECONNREFUSED:
                    time.sleep(0.0005)
    return repeated


def send_paced(sw, sends, dest, others) -> tuple[dict[str, int], float, Pacer]:
    """send_all(sends, dest) paced by a Pacer (others: the other senders' live
    count); returns what was repeated, the seconds it took, and the pacer."""
    pacer = Pacer(sw, others)
    t0 = time.monotonic()
    try:
        repeated = send_all(sends, dest, pacer)
    finally:
        pacer.close()
    return repeated, time.monotonic() - t0, pacer


def ip_bytes(ip: str) -> bytes:
    return socket.inet_aton(ip)


def to_switch(lab, src: Endpoint, payload: bytes) -> bytes:
    """The frame of a datagram from src to the switch's data port, as the
    kernel would write it (DF, checksum over the IP header)."""
    return udp_frame(src, endpoint(lab.switch, PORT), payload)


def eth_ip_udp(lab, src_host, src_ip: str, sport: int, payload_len: int) -> bytearray:
    """The 42 bytes of Ethernet | IPv4 | UDP of such a datagram from src_host's MAC."""
    frame = to_switch(lab, Endpoint(src_host.mac, src_ip, sport), bytes(payload_len))
    return bytearray(frame[:wire.ETH_LEN + wire.IP_LEN + wire.UDP_LEN])
