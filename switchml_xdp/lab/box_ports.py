"""Lab(ports=P): the lab's switch as a box with P ports, each on its own
bridge segment of workers (docs/scale-out.md, "A box with several ports").

    segment 0: {p}-br0 ── w0, w2, ...  ── bs   ── {p}-s   ┐
    segment 1: {p}-br1 ── w1, w3, ...  ── bsp1 ── {p}-sp1 ┼─ {p}-sb 10.0.0.1 (in ns {p}-sw)
    ...                                                    ┘

Worker i sits on segment i mod P. The switch's ports are members of a
bridge in its namespace ({p}-sb), which holds the switch's address and MAC,
as `swml-switch up PORT PORT ...` wants (switch/ports.py): the XDP program
on every port takes the frames to that address, and the box's bridge carries
the rest (ARP, the control port's TCP, Gloo between workers of different
segments) from segment to segment. So all of the lab stays one subnet.
"""
from __future__ import annotations

from collections.abc import Callable

from pyroute2 import IPRoute

from .. import net
from . import wiring
from .addressing import SUBNET_PREFIXLEN, Host, port_host, segment_bridge
from .errors import LabError

MAX_PORTS = 8   # as the switch serves (switch/ports.py)


def check_ports(ports: int, boxes: int, igmp: bool) -> None:
    """A port count Lab() can build, or LabError in one line."""
    if isinstance(ports, bool) or not isinstance(ports, int) or not 1 <= ports <= MAX_PORTS:
        raise LabError(f"ports must be an integer from 1 to {MAX_PORTS}, not {ports!r}")
    if ports > 1 and boxes > 1:
        raise LabError("a lab has several boxes or a box with several ports, not both")
    if ports > 1 and igmp:
        raise LabError("a box with several ports has no snooping lab (igmp) yet")


def extra_ports(prefix: str, ports: int) -> list[Host]:
    """The switch's ports after its first (which is lab.switch itself)."""
    return [port_host(prefix, j) for j in range(1, ports)]


def segment_of(worker: int, ports: int) -> int:
    """The segment (bridge) worker `worker` is on."""
    return worker % ports


def make_segments(br: IPRoute, bridge_ns: str, prefix: str, ports: int) -> None:
    """The bridges of segments 1..ports-1, beside the lab's (segment 0)."""
    for j in range(1, ports):
        wiring.make_bridge(br, bridge_ns, segment_bridge(prefix, j), querier_ip=None)


def bridge_the_box(ipr: IPRoute, switch: Host, ports: list[Host], prefix: str) -> str:
    """Make the switch's ports members of one bridge in its namespace and move
    its address and MAC there (`ipr`: a netlink socket in that namespace);
    the ports get MACs of their own. Returns the ports' names, in order."""
    bridge = f"{prefix}-sb"
    wiring.make_bridge(ipr, switch.ns, bridge, querier_ip=None)
    b = net.link_index(bridge, switch.ns)
    first = net.link_index(switch.iface, switch.ns)
    ipr.addr("del", index=first, address=switch.ip, prefixlen=SUBNET_PREFIXLEN)
    ipr.link("set", index=first, address=port_host(prefix, 0).mac, master=b)
    for port in ports:
        ipr.link("set", index=net.link_index(port.iface, switch.ns), master=b)
    ipr.link("set", index=b, address=switch.mac)
    ipr.addr("add", index=b, address=switch.ip, prefixlen=SUBNET_PREFIXLEN)
    return [switch.iface, *(p.iface for p in ports)]


def build(ipr_in: Callable[[str], IPRoute], lab) -> None:
    """Wire lab.box_ports (Lab(ports=P)) once every host's link is made;
    a switch of one port stays as it is."""
    if not lab.box_ports:
        return
    for port in lab.box_ports:
        wiring.make_link(ipr_in(lab.bridge_ns), ipr_in(port.ns), lab.bridge_ns,
                         segment_bridge(lab.prefix, int(port.name[3:])), port,
                         box_qdisc=lab.box_rate_mbit is None, address=False)
    bridge_the_box(ipr_in(lab.switch.ns), lab.switch, lab.box_ports, lab.prefix)
