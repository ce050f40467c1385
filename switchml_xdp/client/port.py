"""The worker's UDP port, held by a kernel socket for the Worker's life.

Both backends bind ("0.0.0.0", port) WITHOUT SO_REUSEADDR / SO_REUSEPORT: while
a worker runs, no other socket on the host (a local user's, another rank's)
can bind its port, so nobody else can send from it as that rank or read its
RESULTs through the stack (docs/security.md). The socket joins the job's
multicast group on the worker's address, so that IGMP reports go out and a
network with IGMP snooping forwards the group's RESULTs to this host. The udp
backend reads it; the afxdp backend only holds it (its frames arrive through
AF_XDP).
"""
from __future__ import annotations

import errno
import socket


class PortInUse(OSError):
    """Another socket on this host holds the worker's UDP port."""


def reserve_port(port: int, group_ip: str, local_ip: str, rcvbuf: int | None = None) -> socket.socket:
    """A UDP socket bound to ("0.0.0.0", port), member of group_ip on the
    interface of local_ip; raises PortInUse (one line, naming the port) if the
    port is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            err = PortInUse(f"UDP port {port} is in use on this host (by another rank or "
                            "program): give each rank on one host its own port "
                            "(Worker(port=...), --port)")
            err.errno = errno.EADDRINUSE
            raise err from None
        mreq = socket.inet_aton(group_ip) + socket.inet_aton(local_ip)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
    except BaseException:
        sock.close()
        raise
    return sock
