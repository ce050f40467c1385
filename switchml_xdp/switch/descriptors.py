"""The daemon's file descriptors: every listener stays within a share of them,
so that no client, however many addresses it connects from, can take the
ones the daemon needs for itself (its maps, state files, the data port, the
metrics endpoint's own budget: metrics_http.py).

- raise_limit(): servers use epoll, not select: the soft RLIMIT_NOFILE (1024
  under systemd) goes up to the hard limit at start.
- control_connection_cap(): how many control connections may be open at
  once: all the descriptors but RESERVED, at most MAX_CONTROL_CONNECTIONS.
- share_of_free_descriptors(want): the metrics endpoint's budget, less
  where the limit leaves little room: a quarter of those still free.
Where accept() fails anyway (the limit lowered under the daemon),
listener.py waits and says so in one line.
"""
from __future__ import annotations

import logging
import os
import resource

log = logging.getLogger("swml.descriptors")

MAX_CONTROL_CONNECTIONS = 4096
RESERVED = 64   # the daemon's own: maps, program, state and lock files, data port, metrics budget


def raise_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as e:
            log.warning("cannot raise the descriptor limit from %d to %d: %s", soft, hard, e)


def share_of_free_descriptors(want: int) -> int:
    """`want`, or less where the descriptor limit leaves little room: at most
    a quarter of the descriptors still free, so most stay the control port's."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return want
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        return want
    return max(1, min(want, (soft - used) // 4))


def control_connection_cap() -> int:
    """Read at every connection: the limit may change under the daemon (prlimit)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONTROL_CONNECTIONS
    return max(1, min(MAX_CONTROL_CONNECTIONS, soft - RESERVED))
