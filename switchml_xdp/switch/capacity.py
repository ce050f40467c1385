"""What a box tells joiners of its capacity: the rate its port carries, in
bits per second. A job spread over several boxes gives each its share of
every tensor in proportion (docs/scale-out.md), the same on every rank
because every rank reads the same figures from the boxes.

By default the port's link speed as the kernel reports it (ethtool's
ETHTOOL_GSET, asked through a socket in the switch's network namespace, where
/sys/class/net may show another namespace's devices); `swml-switch up
--capacity 40G` overrides it, for a port shaped or shared below its speed.
None where neither says.
"""
from __future__ import annotations

import ctypes as ct
import fcntl
import re
import socket
import struct

SIOCETHTOOL = 0x8946            # include/uapi/linux/sockios.h
ETHTOOL_GSET = 0x00000001       # include/uapi/linux/ethtool.h
# struct ethtool_cmd (44 bytes): cmd, supported, advertising, speed, duplex, port,
# phy_address, transceiver, autoneg, mdio_support, maxtxpkt, maxrxpkt, speed_hi,
# eth_tp_mdix, eth_tp_mdix_ctrl, lp_advertising, reserved[2]
_ETHTOOL_CMD = struct.Struct("=IIIHBBBBBBIIHBBI8x")
_IFREQ = struct.Struct("16sP")                 # ifr_name, ifr_data
_SPEED_UNKNOWN = (0xFFFF, 0xFFFFFFFF, 0)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:bit|b|bps|bit/s)?\s*$", re.IGNORECASE)


def parse_rate(text: str) -> int:
    """Bits per second from "40G", "100M", "2.5g", "10000000": ValueError
    with a one-line reason for anything else (zero, negative, a unit typo)."""
    m = _RATE.match(str(text))
    if not m:
        raise ValueError(f"a rate is a number of bits/s with an optional K, M, G or T "
                         f"(e.g. 40G, 100M), not {text!r}")
    bps = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if bps <= 0:
        raise ValueError(f"a rate must be above zero, not {text!r}")
    return bps


def link_speed_bps(iface: str) -> int | None:
    """The link speed of `iface` in bits/s, or None where the driver does not
    say (or the interface is down)."""
    cmd = ct.create_string_buffer(_ETHTOOL_CMD.size)
    struct.pack_into("=I", cmd, 0, ETHTOOL_GSET)
    req = _IFREQ.pack(iface.encode()[:15], ct.addressof(cmd))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            fcntl.ioctl(s.fileno(), SIOCETHTOOL, req)
    except OSError:
        return None
    fields = _ETHTOOL_CMD.unpack_from(cmd.raw)
    speed = fields[3] | fields[12] << 16          # speed, speed_hi: Mb/s
    return None if speed in _SPEED_UNKNOWN else speed * 10**6


def capacity_bps(ports: list[str], configured: int | None) -> int | None:
    """The box's capacity: what the operator configured, else the sum of its
    ports' link speeds (None where the kernel does not know one of them)."""
    if configured is not None:
        return configured
    speeds = [link_speed_bps(p) for p in ports]
    return None if None in speeds else sum(speeds)
