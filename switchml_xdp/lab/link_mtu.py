"""Lab(mtu=N): every link of the lab at one MTU, as a jumbo-frame cluster
has it: both ends of every veth (hosts and the bridge side), the bridges,
and a box's own bridge (lab/box_ports.py). Set once every link exists and
before any XDP program is attached: veth refuses native XDP on a link whose
peer's MTU is above one page's frame, and an MTU above it once XDP is on.
Larger frames carry larger k (docs/performance.md, "Larger frames"); the
Gloo baseline's TCP uses the same MTU, so the comparison stays fair.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import wire
from .errors import LabError

if TYPE_CHECKING:
    from pyroute2 import IPRoute

DEFAULT_MTU = wire.MTU1500   # the kernel's for Ethernet and veth
MIN_MTU = 576   # what every IPv4 host takes (RFC 791): smaller gains nothing here


def check_mtu(mtu: int | None) -> int | None:
    """An MTU Lab() can build (None: the kernel's 1500), or LabError in one line."""
    if mtu is None:
        return None
    if isinstance(mtu, bool) or not isinstance(mtu, int) or not MIN_MTU <= mtu <= wire.MAX_MTU:
        raise LabError(f"mtu must be an integer from {MIN_MTU} to {wire.MAX_MTU} (the largest MTU "
                       f"whose frames native XDP takes in one page, SWML_MAX_MTU), not {mtu!r}")
    return mtu


def apply(ipr_in: Callable[[str], IPRoute], namespaces: list[str], mtu: int | None) -> None:
    """Every link but loopback in `namespaces` to `mtu` (None: left as made):
    the veths first, then the bridges, whose MTU follows their ports'."""
    if mtu is None:
        return
    for ns in namespaces:
        ipr = ipr_in(ns)
        links = [(link["index"], _kind(link)) for link in ipr.get_links()
                 if link.get_attr("IFLA_IFNAME") != "lo"]
        for index, _ in sorted(links, key=lambda x: x[1] == "bridge"):
            ipr.link("set", index=index, mtu=mtu)


def effective(mtu: int | None) -> int:
    """The lab links' MTU: `mtu`, or the kernel's default."""
    return DEFAULT_MTU if mtu is None else mtu


def _kind(link) -> str | None:
    info = link.get_attr("IFLA_LINKINFO")
    return info.get_attr("IFLA_INFO_KIND") if info else None
