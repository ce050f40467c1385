"""The worker's UDP port, held by a kernel socket for the Worker's life.

Both backends bind ("0.0.0.0", port) WITHOUT SO_REUSEADDR / SO_REUSEPORT: while
a worker runs, no other socket on the host (a local user's, another rank's)
can bind its port, so nobody else can send from it as that rank or read its
RESULTs through the stack (docs/security.md). The socket joins the job's
multicast group on the worker's address, so that IGMP reports go out and a
network with IGMP snooping forwards the group's RESULTs to this host. The udp
backend reads it; the afxdp backend only holds it (its frames arrive through
AF_XDP).

The join is what a snooping network learns the membership from: the kernel
sends its unsolicited reports at the join (IGMPv3: robustness-count reports
within a second) and never again until the querier asks, every 125 s on a
real network. A report sent while the link cannot carry it (a NIC that resets
its queues, or its link, when an XDP program or an AF_XDP socket is attached)
is lost, and the switch sends the group elsewhere until the next query. So
the afxdp backend binds first and joins last (join_when_up), once its datapath
is attached and the link has its carrier (docs/real-network.md, "Multicast
and IGMP").
"""
from __future__ import annotations

import errno
import socket
import threading
import time

from .. import net

# How long join_when_up waits for a link that a datapath's attachment took down
# (NICs renegotiate in 1 to 5 s): past it, the worker joins anyway and the
# querier's next query repairs a lost report.
CARRIER_WAIT_S = 10.0
CARRIER_POLL_S = 0.05


class PortInUse(OSError):
    """Another socket on this host holds the worker's UDP port."""


# Ports this process holds, bound, for a Worker about to be made (the torch
# backend picks a group's port before the group joins: torch/group_setup.py):
# reserve_port takes the held socket, so that nobody can bind the port between
# the pick and the Worker's start.
_held: dict[int, socket.socket] = {}
_held_lock = threading.Lock()


def hold(sock: socket.socket) -> int:
    """Keep `sock` (a bound UDP socket) for the next reserve_port of its port
    in this process; its port."""
    port = sock.getsockname()[1]
    with _held_lock:
        _held[port] = sock
    return port


def release_held(port: int | None, count: int = 1) -> None:
    """Close the held sockets of ports port..port+count-1 that no Worker
    took (a Worker that failed first)."""
    if port is None:
        return
    with _held_lock:
        socks = [_held.pop(p, None) for p in range(port, port + count)]
    for sock in socks:
        if sock is not None:
            sock.close()


def _bound(port: int) -> socket.socket:
    with _held_lock:
        sock = _held.pop(port, None)
    if sock is not None:
        return sock
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind(("0.0.0.0", port))
    except OSError as e:
        sock.close()
        if e.errno != errno.EADDRINUSE:
            raise
        err = PortInUse(f"UDP port {port} is in use on this host (by another rank or "
                        "program): give each rank on one host its own port "
                        "(Worker(port=...), --port)")
        err.errno = errno.EADDRINUSE
        raise err from None
    return sock


def reserve_port(port: int, group_ip: str | None, local_ip: str,
                 rcvbuf: int | None = None) -> socket.socket:
    """A UDP socket bound to ("0.0.0.0", port) (the one held for it, if
    any: hold), member of group_ip on the interface of local_ip (no member
    yet with group_ip None: join_when_up later); raises PortInUse (one line,
    naming the port) if the port is taken."""
    sock = _bound(port)
    try:
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if group_ip is not None:
            join_group(sock, group_ip, local_ip)
    except BaseException:
        sock.close()
        raise
    return sock


def join_group(sock: socket.socket, group_ip: str, local_ip: str) -> None:
    """Make `sock` a member of group_ip on the interface of local_ip: the
    kernel reports the membership at once."""
    mreq = socket.inet_aton(group_ip) + socket.inet_aton(local_ip)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)


def join_when_up(sock: socket.socket, group_ip: str, local_ip: str, iface: str,
                 wait_s: float = CARRIER_WAIT_S) -> bool:
    """join_group once `iface` has its carrier (at most wait_s seconds from
    now), so the kernel's reports go out on a link that carries them; whether
    the link was up at the join."""
    deadline = time.monotonic() + wait_s
    up = net.link_has_carrier(iface)
    while not up and time.monotonic() < deadline:
        time.sleep(CARRIER_POLL_S)
        up = net.link_has_carrier(iface)
    join_group(sock, group_ip, local_ip)
    return up
