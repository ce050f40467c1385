"""Attacks on the switch's listeners that hold connections open: what they
take of the daemon's descriptors."""
from __future__ import annotations

import os
import resource
import selectors
import socket
import time


def half_open(lab, host, port: int, count: int, settle_s: float = 3.0) -> list[socket.socket]:
    """`count` TCP connections from `host` to the switch's `port` (metrics or
    control) that never finish a request: every other one sends half a line."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 1024), hard))
    socks = []
    with lab.enter(host):
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex((lab.switch.ip, port))
            socks.append(s)
    # epoll, not select(): in a long test session the descriptors pass 1024.
    with selectors.DefaultSelector() as sel:
        for s in socks:
            sel.register(s, selectors.EVENT_WRITE)
        pending, deadline = len(socks), time.monotonic() + settle_s
        while pending and time.monotonic() < deadline:
            for key, _ in sel.select(0.2):
                s = key.fileobj
                sel.unregister(s)
                pending -= 1
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 and s.fileno() % 2:
                    try:
                        s.send(b"GET /metr")
                    except OSError:
                        pass
    return socks


def settled_descriptors(pid: int, limit: int, quiet_s: float = 3.0, limit_s: float = 30.0) -> int:
    """The daemon's open descriptors once the attack has taken all it can:
    its `limit` reached, or no change for `quiet_s`."""
    count, since, deadline = -1, time.monotonic(), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        now = len(os.listdir(f"/proc/{pid}/fd"))
        if now >= limit - 1:
            return now
        if now != count:
            count, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
        time.sleep(0.2)
    return count
