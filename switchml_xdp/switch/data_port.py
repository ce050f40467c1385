"""The switch's data address and port, held by a kernel UDP socket for the
daemon's life (docs/security.md).

As the workers hold theirs (client/port.py): the socket is bound to (ip, port)
WITHOUT SO_REUSEADDR / SO_REUSEPORT, so no other socket on the host, a local
user's included, can bind that address and port (nor the port on every
address) and send datagrams from it as the switch. The user-space data plane
reads and sends through this very socket; the XDP one takes the switch's
packets before the stack, so its socket only holds the port and reads
nothing: what the program passes up fills its small buffer and is dropped.
"""
from __future__ import annotations

import errno
import socket

from .dataplane import DataplaneError

HOLD_RCVBUF = 4096   # a holder that reads nothing keeps little


def hold_data_port(ip: str, port: int, rcvbuf: int | None = HOLD_RCVBUF) -> socket.socket:
    """A UDP socket bound to (ip, port); DataplaneError (one line) if it cannot be."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.bind((ip, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise DataplaneError(f"UDP port {port} on {ip} is in use by another program: the "
                                 f"switch holds its data address and port for its life; stop "
                                 f"that program or give the switch another --port") from None
        raise DataplaneError(f"cannot hold the data port {ip}:{port}: {e.strerror or e}") from None
    return sock
