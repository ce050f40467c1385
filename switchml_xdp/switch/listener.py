"""Accepting connections within a budget, for every TCP listener of the daemon
(the control port, control.py; the metrics endpoint, metrics_http.py):

- at most `total()` connections open at once: at the cap the listener stops
  accepting, and the connections beyond wait in the kernel's backlog,
  holding none of the daemon's descriptors (descriptors.py says how many
  each listener may have);
- at most `per_ip` from one source address: beyond it, `refuse(sock, ip)`
  says why on the new socket, which is then closed at once;
- accept() failing for want of descriptors or memory is one log line per
  interval (quiet_log.py), never a traceback; the client waits in the
  backlog and accepting resumes a moment later.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable

from .quiet_log import QuietLog

ACCEPT_RETRY_S = 0.5   # after accept() fails (EMFILE, ENFILE, ENOBUFS, ENOMEM)
BACKLOG = 128


def listening_socket(addr: str | None, port: int) -> socket.socket:
    """A non-blocking TCP socket listening on (addr, port); OSError if it cannot."""
    family, kind, proto, _, sockaddr = socket.getaddrinfo(
        (addr or "").strip("[]") or None, port, type=socket.SOCK_STREAM,
        flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class Listener:
    """One task accepts on `sock`; one task a connection runs serve(sock, ip)."""

    def __init__(self, name: str, serve: Callable[[socket.socket, str], Awaitable[None]],
                 refuse: Callable[[socket.socket, str], None], per_ip: int,
                 total: Callable[[], int], quiet: QuietLog):
        self.name, self.serve, self.refuse = name, serve, refuse
        self.per_ip, self.total, self.quiet = per_ip, total, quiet
        self.sock: socket.socket | None = None
        self._accepting: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._by_ip: dict[str, int] = {}
        self._room = asyncio.Event()   # set while fewer than total() connections are open

    @property
    def connections(self) -> int:
        return len(self._tasks)

    def start(self, addr: str | None, port: int) -> None:
        self.sock = listening_socket(addr, port)
        self._room.set()
        self._accepting = asyncio.create_task(self._accept_loop())

    async def stop_accepting(self) -> None:
        """No new connections; those open go on."""
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
            self._accepting = None
        if self.sock is not None:
            self.sock.close()

    async def close(self) -> None:
        """No new connections, and every open one's task cancelled."""
        await self.stop_accepting()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._room.wait()
            if len(self._tasks) >= self.total():   # the budget shrank under us
                self._full()
                continue
            try:
                conn, peer = await loop.sock_accept(self.sock)
            except OSError as e:   # out of descriptors or memory: the client waits in the backlog
                self.quiet.warning("accept", "%s cannot accept a connection: %s; trying again "
                                   "in %g s", self.name, e.strerror or e, ACCEPT_RETRY_S)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            ip = peer[0]
            if self._by_ip.get(ip, 0) >= self.per_ip:
                self.quiet.warning(f"refused {ip}", "%s: too many connections from %s (limit "
                                   "%d); refusing", self.name, ip, self.per_ip)
                try:
                    conn.setblocking(False)
                    self.refuse(conn, ip)
                except OSError:
                    pass
                finally:
                    conn.close()
                continue
            self._by_ip[ip] = self._by_ip.get(ip, 0) + 1
            task = asyncio.create_task(self.serve(conn, ip))
            self._tasks.add(task)
            task.add_done_callback(lambda t, ip=ip: self._release(t, ip))
            if len(self._tasks) >= self.total():
                self._full()

    def _full(self) -> None:
        self._room.clear()
        self.quiet.warning("full", "%s: %d connections open (its limit); new ones wait",
                           self.name, self.total())

    def _release(self, task: asyncio.Task, ip: str) -> None:
        self._tasks.discard(task)
        self._by_ip[ip] -= 1
        if not self._by_ip[ip]:
            del self._by_ip[ip]
        self._room.set()
