"""Rate limits on the lab's links with tc (TBF and HTB qdiscs through pyroute2).

Optional shaping (`Lab(rate_mbit=...)`) gives every worker link the same rate
in each direction, for every kind of traffic, and `Lab(box_rate_mbit=...)`
every box's link, whose port can serve DSCP priority bands
(`Lab(dscp_bands=...)`); `shape_links` says how, and docs/design-decisions.md
("Lab") why.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence

from pyroute2 import IPRoute

from .. import net, wire
from ..client.control import CONTROL_DSCP
from .addressing import Host
from .errors import LabError
from .wiring import HOST_QUEUE_PACKETS

MAX_RATE_MBIT = 34_000       # TBF's rate is a u32 in bytes/s (pyroute2 has no rate64)
HTB_HANDLE = 0x10000         # 1:
HTB_CLASS_BASE = 0x10        # class 1:(10+i) for source i
HTB_PARENT_CLASS = 0x10001   # 1:1, the sources' parent where the port has a rate of its own
TBF_CLASS = 0x10001          # 1:1, where TBF attaches its inner qdisc
QUEUE_HANDLE_BASE = 0x200000 # 20:, 21:, ... for the pfifo children
MAX_QUEUE_PACKETS = 100_000
MAX_BANDS = 8                # HTB's priorities (TC_HTB_NUMPRIO)
MAX_DSCP = 63
BAND_CLASS_BASE = 0x1000     # 1:(1000 + 8i + b): source i's band b
# All the bands' guarantees together: 1/10 of the link. A lower band keeps
# that much (like a real switch's strict priority with minimum rates), at
# least the floor a waiting job sends at under srpt (switch/share_policy.py),
# so that its DATA do not queue for ever behind the first job's.
BAND_SHARE = 10
MIN_BAND_RATE = 1000         # bytes/s: a band's guarantee, at least
TOS_DSCP_MASK = "0x00fc0000" # the DSCP bits of the IPv4 header's first word (TOS byte)


def check_rate(rate_mbit: float | None, what: str = "rate") -> None:
    if rate_mbit is not None and not 0 < rate_mbit <= MAX_RATE_MBIT:
        raise LabError(f"{what} must be in (0, {MAX_RATE_MBIT}] Mbit/s, not {rate_mbit!r}")


def box_rates(box_rate_mbit: float | Sequence[float] | None, boxes: int) -> list[float | None]:
    """Each box's link rate: one for all, or one each (as many as boxes)."""
    if box_rate_mbit is None or isinstance(box_rate_mbit, (int, float)):
        for_each = [box_rate_mbit] * boxes
    else:
        for_each = list(box_rate_mbit)
        if len(for_each) != boxes:
            raise LabError(f"box rates: one for all boxes or one each ({boxes}), "
                           f"not {len(for_each)}")
    for r in for_each:
        check_rate(r, "box rate")
    return for_each


def check_queue(queue_packets: int | None) -> None:
    if queue_packets is not None and not 1 <= queue_packets <= MAX_QUEUE_PACKETS:
        raise LabError(f"queue must be 1..{MAX_QUEUE_PACKETS} packets, not {queue_packets!r}")


def host_queue(queue_packets: int | None) -> int | None:
    """The depth of a shaped host's own egress queue where the switch's ports
    hold queue_packets: a host's (HOST_QUEUE_PACKETS) once a depth is asked
    for, else the shaper's own 20 ms, as the ports have (shape_links)."""
    return None if queue_packets is None else HOST_QUEUE_PACKETS


def check_bands(bands: Sequence[int] | None, shaped: bool = True) -> tuple[int, ...] | None:
    """DSCP values for the box ports' priority bands, highest priority first
    (the last band also takes every other DSCP), or LabError in one line.
    shaped: the lab has both the workers' rate and the boxes' (the bands live
    in the workers' classes on a box's port, which its rate makes a bottleneck)."""
    if bands is None:
        return None
    if not shaped:
        raise LabError("dscp bands need a worker rate and a box rate (they order the "
                       "box's shaped port)")
    try:
        values = tuple(bands) if not isinstance(bands, (str, bytes)) else ()
    except TypeError:   # not a sequence
        values = ()
    if not (1 <= len(values) <= MAX_BANDS and len(set(values)) == len(values)
            and all(type(v) is int and 0 <= v <= MAX_DSCP for v in values)):
        raise LabError(f"dscp bands: 1 to {MAX_BANDS} distinct DSCP values 0..{MAX_DSCP}, "
                       f"highest priority first, not {bands!r}")
    return values


def dscp_key(dscp: int) -> str:
    """A u32 key that matches an IPv4 header whose DSCP is `dscp` (its TOS
    byte is the first word's second; the ECN bits below it are ignored)."""
    return f"0x{dscp << 18:08x}/{TOS_DSCP_MASK}+0"


def _source_key(ip: str) -> str:
    """A u32 key that matches an IPv4 header whose source is `ip`."""
    return f"0x{ipaddress.IPv4Address(ip).packed.hex()}/0xffffffff+12"


def _queue(ipr: IPRoute, index: int, parent: int, n: int, queue_packets: int | None) -> None:
    """A queue's depth (a switch port's buffer, a host's egress queue): a
    pfifo of queue_packets packets under `parent` replaces the shaper's own
    byte/latency limited queue (tail drop)."""
    if queue_packets is not None:
        ipr.tc("add", "pfifo", index, QUEUE_HANDLE_BASE + (n << 16), parent=parent,
               limit=queue_packets)


def _bytes_per_s(rate_mbit: float) -> int:
    return int(rate_mbit * 1_000_000 / 8)


def _burst(rate: int) -> int:
    """Bucket size for `rate` bytes/s: at least 1 ms of traffic, at least 32 KiB
    (many frames of the largest, wire.PAGE_FRAME_LEN: a lab's --mtu)."""
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
                     queue_packets: int | None = None, total_mbit: float | None = None,
                     bands: Sequence[int] | None = None) -> None:
    """Limit what interface `index` sends from each IPv4 source in `sources`
    to rate_mbit, independently: an HTB root qdisc with one class per source
    (1:10, 1:11, ...; rate = ceil, no borrowing), chosen by a u32 filter on the
    IPv4 source address. Anything else (ARP, other sources) matches no class and
    goes through HTB's direct queue, unshaped, so the port is never a
    bottleneck of its own. total_mbit: the sources' classes share one parent
    class (1:1) of that rate as well, the port's own rate: each is guaranteed
    its share of it and borrows up to rate_mbit (HTB lets a class within its
    own rate ignore its parent, so the shares sum to the total). bands: DSCP
    values, highest priority first, served in that order (_bands)."""
    rate = _bytes_per_s(rate_mbit)
    ipr.tc("add", "htb", index, HTB_HANDLE, default=0)   # 0: unclassified -> direct queue
    parent, guaranteed = HTB_HANDLE, rate
    if total_mbit is not None:
        total = _bytes_per_s(total_mbit)
        parent, rate = HTB_PARENT_CLASS, min(rate, total)
        guaranteed = min(rate, total // len(sources))
        ipr.tc("add-class", "htb", index, parent, parent=HTB_HANDLE, rate=total, ceil=total,
               burst=_burst(total), cburst=_burst(total), quantum=_quantum(total))
    quantum = _quantum(guaranteed)
    band_rate = max(MIN_BAND_RATE, guaranteed // (BAND_SHARE * len(bands))) if bands else 0
    if bands and total_mbit is not None:
        guaranteed = band_rate * len(bands)     # the rest of the link goes by priority
    for i, ip in enumerate(sources):
        classid = HTB_HANDLE | (HTB_CLASS_BASE + i)
        ipr.tc("add-class", "htb", index, classid, parent=parent, rate=guaranteed, ceil=rate,
               burst=_burst(rate), cburst=_burst(rate), quantum=quantum)
        if bands:
            _bands(ipr, index, classid, i, _source_key(ip), bands, band_rate, rate, quantum,
                   queue_packets)
            continue
        _queue(ipr, index, classid, i, queue_packets)
        ipr.tc("add-filter", "u32", index, parent=HTB_HANDLE, prio=1, protocol=0x0800,
               target=classid, keys=[_source_key(ip)])


def _bands(ipr: IPRoute, index: int, source_class: int, i: int, source_key: str,
           bands: Sequence[int], band_rate: int, ceil: int, quantum: int,
           queue_packets: int | None) -> None:
    """Source i's priority bands: a leaf class each under its class, with
    HTB prio = the band's place (0 first), a guarantee of band_rate and a
    ceil of `ceil`. HTB serves every class within its own rate first, then
    lends what is left of a parent's rate to the waiting classes of the
    lowest prio value first, so with small guarantees the link goes to the
    highest band that has frames and the others keep only band_rate (no
    sch_prio under the shaper: docs/design-decisions.md, "Lab"). A u32 filter
    on the source and the DSCP picks the band; anything else from the source
    goes to the last band."""
    last = len(bands) - 1
    for b, dscp in enumerate(bands):
        leaf = HTB_HANDLE | (BAND_CLASS_BASE + MAX_BANDS * i + b)
        ipr.tc("add-class", "htb", index, leaf, parent=source_class, rate=band_rate, ceil=ceil,
               burst=_burst(ceil), cburst=_burst(ceil), quantum=quantum, prio=b)
        _queue(ipr, index, leaf, MAX_BANDS * i + b, queue_packets)
        keys = [source_key] if b == last else [source_key, dscp_key(dscp)]
        ipr.tc("add-filter", "u32", index, parent=HTB_HANDLE, prio=2 if b == last else 1,
               protocol=0x0800, target=leaf, keys=keys)
        if b == 0 and CONTROL_DSCP not in bands:
            # Network control (the workers' control connections) rides the
            # first band: their heartbeats never wait behind a job's DATA.
            ipr.tc("add-filter", "u32", index, parent=HTB_HANDLE, prio=1, protocol=0x0800,
                   target=leaf, keys=[source_key, dscp_key(CONTROL_DSCP)])


def _quantum(rate: int) -> int:
    """HTB's quantum for a class of `rate` bytes/s: within what it accepts, and
    at least one frame of the largest a lab's links carry (--mtu), so that a
    class sends a whole frame a round."""
    return max(wire.PAGE_FRAME_LEN, min(200_000, rate // 10))


def shape_links(ipr_in: Callable[[str], IPRoute], bridge_ns: str, switches: Sequence[Host],
                workers: Sequence[Host], rate_mbit: float | None,
                queue_packets: int | None = None,
                box_rate_mbit: float | Sequence[float] | None = None,
                dscp_bands: Sequence[int] | None = None) -> None:
    """Every worker gets rate_mbit up and rate_mbit down, whatever sends;
    every box (switch host) box_rate_mbit both ways (or one rate each). Either may be None
    (that kind of link unshaped). `ipr_in(ns)` gives a netlink socket in
    namespace ns.

        downstream to worker i   TBF on the egress of its bridge port b{i}:
                                 all it receives was forwarded by the bridge
                                 (dev_queue_xmit), the switch's XDP_TX'd
                                 RESULTs and Gloo's TCP from other workers too
        upstream, worker i ->    HTB on the egress of every box's bridge port
        a box                    (bs, bs1, ...), one class per worker (by
                                 source IP) at the rate: shapes AF_XDP frames,
                                 which skip the worker's own qdisc, each
                                 worker on its own, and the port is not a
                                 shared bottleneck (but a worker's AF_XDP
                                 frames to M boxes get M times its rate)
        upstream, kernel         TBF on the worker's own interface: covers
        sockets                  worker -> worker traffic (Gloo), which never
                                 crosses bs; to the switch it is shaped twice
                                 at the same rate, which changes nothing
        downstream to box b      on the egress of its bridge port: TBF at
                                 box_rate_mbit, or with worker rates the HTB
                                 above under one parent class at box_rate_mbit
        upstream, box b          TBF on the box's own interface: what its
                                 stack sends (control replies, the unicast
                                 fan-out's copies); its XDP_TX'd RESULTs skip
                                 it (one frame a RESULT on the box's link for
                                 N on the workers', whose ports shape them)

    Without box_rate_mbit the boxes' own interfaces stay unshaped: a real
    switch's ports are as fast as the workers' and the workers' links are the
    bottleneck. The loss injector's clsact hooks on the bridge ports run before
    these qdiscs and are independent of them. queue_packets, if given, is
    the depth in packets of every shaped queue on the bridge's side (a switch
    port's buffer), else TBF's 20 ms. A host's own interface is not a switch
    port: with queue_packets, a worker's keeps a host's queue
    (HOST_QUEUE_PACKETS, lab/wiring.py), where a real host's qdisc and NIC
    ring hold a TSO burst; a 32-packet queue there dropped a third of Gloo's
    TCP segments, cut by TBF, before they reached the switch
    (docs/transport.md, "The port buffer"). A box's own interface always
    has a host's queue. dscp_bands: every
    worker's class on a box's port serves its frames in those priority bands
    (shape_per_source), so the marked job's DATA goes first."""
    br = ipr_in(bridge_ns)
    if rate_mbit is not None:
        for w in workers:
            shape(ipr_in(w.ns), net.link_index(w.iface, w.ns), rate_mbit,
                  host_queue(queue_packets))
            shape(br, net.link_index(w.peer, bridge_ns), rate_mbit, queue_packets)
    for box, box_rate in zip(switches, box_rates(box_rate_mbit, len(switches))):
        port = net.link_index(box.peer, bridge_ns)
        if rate_mbit is not None:
            shape_per_source(br, port, rate_mbit, [w.ip for w in workers], queue_packets,
                             total_mbit=box_rate, bands=dscp_bands)
        elif box_rate is not None:
            shape(br, port, box_rate, queue_packets)
        if box_rate is not None:
            shape(ipr_in(box.ns), net.link_index(box.iface, box.ns), box_rate,
                  HOST_QUEUE_PACKETS)
