"""Whether a network carries packets of k elements: the MTU a packet needs,
the largest k an MTU carries, and the check of an interface against a k, as
the switch (`swml-switch up -k`) and the workers (their join) make it. The
numbers are xdp/swml_wire.h's; docs/performance.md, "Larger frames", says
why k stops at SWML_MAX_K (one page a frame for native XDP).
"""
from __future__ import annotations

from . import net, wire


class MtuError(OSError):
    """A k the interface's MTU does not carry, in one line (an OSError, as the
    kernel's EMSGSIZE for a datagram too long for the link)."""


def mtu_needed(k: int) -> int:
    """The MTU a packet of k int32 elements needs: IPv4 + UDP + swml header + 4k."""
    return wire.IP_OVERHEAD + 4 * k


def largest_k(mtu: int) -> int:
    """The most int32 elements a packet carries over `mtu` (0: none), at most SWML_MAX_K."""
    return max(0, min(wire.MAX_K, (mtu - wire.IP_OVERHEAD) // 4))


def check_k(k: int, mtu: int, iface: str) -> None:
    """MtuError unless `iface`, whose MTU is `mtu`, carries packets of k elements."""
    if mtu_needed(k) > mtu:
        raise MtuError(f"k={k} needs an MTU of at least {mtu_needed(k)} on {iface}, whose MTU is "
                       f"{mtu} (it carries k <= {largest_k(mtu)}): raise the MTU of {iface} and "
                       f"of the network, or use a smaller k")


def check_iface(k: int, iface: str, netns: str | None = None) -> int:
    """check_k with the MTU of `iface` (in `netns`, else here); returns that MTU."""
    mtu = net.link_mtu(iface, netns)
    check_k(k, mtu, iface)
    return mtu
