"""Packets crafted by hand for the reliability tests (test_tenants.py,
test_fuzz.py): a model of the switch program's checks that predicts what
it does with each, the sockets that send them, a pacer that keeps the
switch's veth ring from overflowing, and the Ethernet/IPv4/UDP bytes of a
raw frame."""
from __future__ import annotations

import errno
import socket
import time
from contextlib import closing

from frames import Endpoint, endpoint, udp_frame
from reliability_helpers import K, PORT
from switchml_xdp import wire
from switchml_xdp.switch.maps import SwitchMaps

PAYLOAD_LEN = wire.HDR_LEN + 4 * K                 # a whole DATA datagram's UDP payload
IP_RECVERR = 11                                    # <linux/in.h>: local drops become ENOBUFS


class SwitchModel:
    """What xdp/swml_switch.c does with a frame, in its order of checks, given a
    snapshot of the jobs and members maps: "passed", a drop reason, or
    "accepted" (the packet reaches its slot, and ends as aggregated, completed,
    shadow_reply or dup_dropped depending on the slot's state)."""

    def __init__(self, sw):
        self.port_b = PORT.to_bytes(2, "big")
        self.jobs = self.snapshot(sw)

    @staticmethod
    def snapshot(sw) -> dict[int, tuple]:
        jobs = {}
        with closing(SwitchMaps(sw.iface)) as maps:
            for j in range(wire.MAX_JOBS):
                e = maps.read_job(j)
                if e.active:
                    members = []
                    for r in range(min(e.world, wire.MAX_WORLD)):
                        m = maps.members.lookup(j * wire.MAX_WORLD + r)
                        members.append((m.ip.to_bytes(4, "little"), m.port.to_bytes(2, "little")))
                    jobs[j] = (e.world, e.slot_count, members)
        return jobs

    def udp(self, payload: bytes, length: int, src_ip: bytes, sport: bytes) -> str:
        """A datagram a kernel UDP socket sent to the switch's port (`payload`:
        at least its first 16 bytes, `length` its real length)."""
        return self.swml(payload, length, (28 + length).to_bytes(2, "big"),
                         (8 + length).to_bytes(2, "big"), src_ip, sport)

    def frame(self, f: bytes, n: int) -> str:
        """A whole Ethernet frame of length n (f: at least its first 96 bytes)."""
        if n < 14 or f[12:14] != b"\x08\x00" or n < 34:
            return "passed"
        ihl = f[14] & 0xF
        if f[14] >> 4 != 4 or f[23] != socket.IPPROTO_UDP or ihl < 5:
            return "passed"
        if ihl != 5:
            u = 14 + 4 * ihl
            return "bad_ip" if n >= u + 8 and f[u + 2:u + 4] == self.port_b else "passed"
        if n < 42 or f[36:38] != self.port_b:
            return "passed"
        if int.from_bytes(f[20:22], "big") & 0x3FFF:
            return "bad_ip"
        return self.swml(f[42:58], n - 42, f[16:18], f[38:40], f[26:30], f[34:36])

    def swml(self, h: bytes, plen: int, ip_len: bytes, udp_len: bytes, saddr: bytes,
             sport: bytes) -> str:
        if plen < wire.HDR_LEN:
            return "truncated"
        if h[0] >> 4 != wire.VERSION:
            return "bad_version"
        if h[0] & 0xF != wire.TYPE_DATA:
            return "bad_type"
        if int.from_bytes(h[14:16], "big") != K:
            return "bad_count"
        if plen < PAYLOAD_LEN:
            return "truncated"
        if (int.from_bytes(ip_len, "big") != 28 + PAYLOAD_LEN or
                int.from_bytes(udp_len, "big") != 8 + PAYLOAD_LEN):
            return "bad_ip"
        job = self.jobs.get(int.from_bytes(h[2:4], "big"))
        if job is None:
            return "unknown_job"
        world, slot_count, members = job
        rank = int.from_bytes(h[4:6], "big")
        if rank >= world or rank >= wire.MAX_WORLD:
            return "bad_rank"
        if members[rank] != (saddr, sport):
            return "bad_source"
        if int.from_bytes(h[6:8], "big") >= slot_count:
            return "bad_slot"
        return "accepted"


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
    sent so far that count as rx at the switch) is called before each send. A send that did not leave is repeated: ENOBUFS (the local veth's ring was full), EAGAIN (a non-blocking
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


def eth_ip_udp(lab, src_host, src_ip: str, sport: int, payload_len: int) -> bytearray:
    """The 42 bytes of Ethernet | IPv4 | UDP of a datagram to the switch's data
    port, as the kernel would write them (DF, checksum over the IP header)."""
    frame = udp_frame(Endpoint(src_host.mac, src_ip, sport), endpoint(lab.switch, PORT),
                      bytes(payload_len))
    return bytearray(frame[:wire.ETH_LEN + wire.IP_LEN + wire.UDP_LEN])
