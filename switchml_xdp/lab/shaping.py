"""Rate limits on the lab's links with tc (TBF and HTB qdiscs through pyroute2).

Optional shaping (`Lab(rate_mbit=...)`) gives every worker link the same rate
in each direction, for every kind of traffic; `shape_links` says how, and
docs/design-decisions.md ("Lab") why.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence

from pyroute2 import IPRoute

from .. import net
from .addressing import Host
from .errors import LabError

MAX_RATE_MBIT = 34_000       # TBF's rate is a u32 in bytes/s (pyroute2 has no rate64)
HTB_HANDLE = 0x10000         # 1:
HTB_CLASS_BASE = 0x10        # class 1:(10+i) for source i
TBF_CLASS = 0x10001          # 1:1, where TBF attaches its inner qdisc
QUEUE_HANDLE_BASE = 0x200000 # 20:, 21:, ... for the pfifo children
MAX_QUEUE_PACKETS = 100_000


def check_rate(rate_mbit: float | None) -> None:
    if rate_mbit is not None and not 0 < rate_mbit <= MAX_RATE_MBIT:
        raise LabError(f"rate must be in (0, {MAX_RATE_MBIT}] Mbit/s, not {rate_mbit!r}")


def check_queue(queue_packets: int | None) -> None:
    if queue_packets is not None and not 1 <= queue_packets <= MAX_QUEUE_PACKETS:
        raise LabError(f"queue must be 1..{MAX_QUEUE_PACKETS} packets, not {queue_packets!r}")


def _queue(ipr: IPRoute, index: int, parent: int, n: int, queue_packets: int | None) -> None:
    """A switch port's buffer depth: a pfifo of queue_packets packets under
    `parent` replaces the shaper's own byte/latency limited queue (tail drop)."""
    if queue_packets is not None:
        ipr.tc("add", "pfifo", index, QUEUE_HANDLE_BASE + (n << 16), parent=parent,
               limit=queue_packets)


def _bytes_per_s(rate_mbit: float) -> int:
    return int(rate_mbit * 1_000_000 / 8)


def _burst(rate: int) -> int:
    """Bucket size for `rate` bytes/s: at least 1 ms of traffic, at least 32 KiB."""
    return max(32 * 1024, rate // 1000)


def shape(ipr: IPRoute, index: int, rate_mbit: float, queue_packets: int | None = None) -> None:
    """Limit what interface `index` sends to rate_mbit with a TBF root qdisc.

    A qdisc only sees frames that go through the stack's transmit path
    (dev_queue_xmit): kernel sockets, and everything a bridge forwards. Frames
    an AF_XDP socket sends in copy mode (__dev_direct_xmit) and frames an XDP
    program sends with XDP_TX skip the qdisc of the interface they leave by.
    """
    rate = _bytes_per_s(rate_mbit)
    ipr.tc("add", "tbf", index, 0x10000, rate=rate, burst=_burst(rate), latency="20ms")
    _queue(ipr, index, TBF_CLASS, 0, queue_packets)


def shape_per_source(ipr: IPRoute, index: int, rate_mbit: float, sources: Sequence[str],
                     queue_packets: int | None = None) -> None:
    """Limit what interface `index` sends from each IPv4 source in `sources`
    to rate_mbit, independently: an HTB root qdisc with one class per source
    (1:10, 1:11, ...; rate = ceil, no borrowing), chosen by a u32 filter on the
    IPv4 source address. Anything else (ARP, other sources) matches no class and
    goes through HTB's direct queue, unshaped, so the port is never a
    bottleneck of its own."""
    rate = _bytes_per_s(rate_mbit)
    ipr.tc("add", "htb", index, HTB_HANDLE, default=0)   # 0: unclassified -> direct queue
    quantum = max(1600, min(200_000, rate // 10))
    for i, ip in enumerate(sources):
        classid = HTB_HANDLE | (HTB_CLASS_BASE + i)
        ipr.tc("add-class", "htb", index, classid, parent=HTB_HANDLE, rate=rate, ceil=rate,
               burst=_burst(rate), cburst=_burst(rate), quantum=quantum)
        _queue(ipr, index, classid, i, queue_packets)
        ipr.tc("add-filter", "u32", index, parent=HTB_HANDLE, prio=1, protocol=0x0800,
               target=classid, keys=[f"0x{ipaddress.IPv4Address(ip).packed.hex()}/0xffffffff+12"])


def shape_links(ipr_in: Callable[[str], IPRoute], bridge_ns: str, switch: Host,
                workers: Sequence[Host], rate_mbit: float,
                queue_packets: int | None = None) -> None:
    """Every worker gets rate_mbit up and rate_mbit down, whatever sends.
    `ipr_in(ns)` gives a netlink socket in namespace ns.

        downstream to worker i   TBF on the egress of its bridge port b{i}:
                                 all it receives was forwarded by the bridge
                                 (dev_queue_xmit), the switch's XDP_TX'd
                                 RESULTs and Gloo's TCP from other workers too
        upstream, worker i ->    HTB on the egress of the switch's bridge port
        switch                   bs, one class per worker (by source IP) at
                                 the rate: shapes AF_XDP frames, which skip
                                 the worker's own qdisc, each worker on its
                                 own, and the port is not a shared bottleneck
        upstream, kernel         TBF on the worker's own interface: covers
        sockets                  worker -> worker traffic (Gloo), which never
                                 crosses bs; to the switch it is shaped twice
                                 at the same rate, which changes nothing

    The switch's own interface stays unshaped: a real switch's ports are as
    fast as the workers' and the workers' links are the bottleneck. The
    loss injector's clsact hooks on the bridge ports run before these qdiscs
    and are independent of them. queue_packets, if given, is every shaped
    queue's depth in packets (a switch port's buffer), else TBF's 20 ms."""
    br = ipr_in(bridge_ns)
    for w in workers:
        shape(ipr_in(w.ns), net.link_index(w.iface, w.ns), rate_mbit, queue_packets)
        shape(br, net.link_index(w.peer, bridge_ns), rate_mbit, queue_packets)
    shape_per_source(br, net.link_index(switch.peer, bridge_ns), rate_mbit,
                     [w.ip for w in workers], queue_packets)
