"""The ports of one box: `swml-switch up eth1 eth2 ...` (docs/scale-out.md,
"A box with several ports").

A box with several ports is one switch with one address, as a hardware
switch is: its ports are members of one Linux bridge, which holds the box's
IPv4 address (and the control port); the XDP program on every port takes
the frames to that address before the bridge sees them, and the bridge
carries everything else between the ports' segments. With one port, the
address is the port's own, as it always was. What the data plane compiles
in about the ports (their count and places) is `port_defines`.
"""
from __future__ import annotations

from collections.abc import Sequence

from .. import layout, net
from .dataplane import DataplaneError

#: The most ports one box serves (struct swml_port_stats, xdp/swml_maps.h).
MAX_PORTS: int = layout.DEFINES["swml_maps.h"]["SWML_MAX_PORTS"]


def check_ports(ports: Sequence[str]) -> list[str]:
    """The port list as given, or DataplaneError naming what is wrong."""
    ports = list(ports)
    if not ports:
        raise DataplaneError("give the box's port(s): swml-switch up IFACE [IFACE ...]")
    twice = sorted({p for p in ports if ports.count(p) > 1})
    if twice:
        raise DataplaneError(f"port {', '.join(twice)} given twice")
    if len(ports) > MAX_PORTS:
        raise DataplaneError(f"a box serves at most {MAX_PORTS} ports, not {len(ports)}")
    return ports


def box_address(ports: Sequence[str]) -> tuple[str, str, str]:
    """(IPv4, MAC, the interface that holds them) of the box: one port's own,
    or the bridge every port of several is a member of."""
    if len(ports) == 1:
        return _own_address(ports[0])
    try:
        masters = {p: net.link_master(p) for p in ports}
    except net.NetError as e:
        raise DataplaneError(str(e)) from None
    bridges = set(masters.values())
    if len(bridges) != 1 or None in bridges:
        where = ", ".join(f"{p} in {m or 'no bridge'}" for p, m in masters.items())
        raise DataplaneError(f"the ports of one box must be members of one bridge, which holds "
                             f"the box's address ({where}; docs/scale-out.md)")
    bridge = bridges.pop()
    try:
        return net.link_ipv4(bridge), net.link_mac(bridge), bridge
    except net.NetError as e:
        raise DataplaneError(f"{e}: the bridge of the box's ports holds its address") from None


def _own_address(port: str) -> tuple[str, str, str]:
    """box_address of a box of one port: the port's own."""
    try:
        mac = net.link_mac(port)
    except net.NetError as e:   # "no interface named ...": as it is
        raise DataplaneError(str(e)) from None
    try:
        return net.link_ipv4(port), mac, port
    except net.NetError as e:
        raise DataplaneError(f"{e}; the switch answers on its address") from None


def port_defines(ifindexes: Sequence[int]) -> dict[str, object]:
    """What swml_tables.h compiles in about the box's ports: their count
    (nothing for one port: its default). Their places are a map the control
    plane fills (xdp_dataplane.fill_ports)."""
    return {"SWML_PORTS": len(ifindexes)} if len(ifindexes) > 1 else {}
