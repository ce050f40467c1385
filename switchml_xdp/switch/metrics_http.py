"""The metrics endpoint's HTTP server, on the daemon's event loop, under the
control port's discipline (control.py; docs/security.md):

- a request's head must arrive whole within REQUEST_TIMEOUT_S (a half-open or
  trickling client gets 408 and is closed), and is at most MAX_HEAD bytes;
- connections are capped per source address (MAX_CONNECTIONS_PER_IP: beyond
  it a connection is answered 503 and closed at once) and in all
  (MAX_CONNECTIONS, less where the descriptor limit leaves little room): at
  the cap the endpoint stops accepting, and the connections beyond wait in the
  kernel's backlog, holding none of the daemon's descriptors. Whatever clients
  do, the endpoint holds at most its budget plus the listening socket, so the
  control port always has the descriptors it needs;
- a client that does not take its response within REQUEST_TIMEOUT_S is reset;
- one response a connection (`Connection: close`), rendered on the loop in
  a few milliseconds, so no scrape holds a join back longer than that;
- trouble (accept failing for want of descriptors, refused or timed-out
  clients) is logged as one line per kind and interval (quiet_log.py), never
  a traceback.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
from collections.abc import Callable
from http import HTTPStatus

from .control import LINGER_S
from .metrics_request import (
    MAX_HEAD,
    HttpError,
    check_request,
    error_response,
    parse_head,
    read_head,
    response,
)
from .quiet_log import QuietLog

log = logging.getLogger("swml.metrics")

REQUEST_TIMEOUT_S = 5.0        # to send a request's head, and to take its response
MAX_CONNECTIONS_PER_IP = 4     # a Prometheus server scrapes over one
MAX_CONNECTIONS = 32           # the endpoint's descriptor budget
ACCEPT_RETRY_S = 0.5           # after accept() fails (EMFILE, ENFILE, ENOBUFS, ENOMEM)
BACKLOG = 64


def connection_budget(want: int = MAX_CONNECTIONS) -> int:
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


def listening_socket(addr: str, port: int) -> socket.socket:
    """A non-blocking TCP socket listening on (addr, port); OSError if it cannot."""
    family, kind, proto, _, sockaddr = socket.getaddrinfo(
        addr.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
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


class HttpEndpoint:
    """GET/HEAD `path` -> render(), as `content_type`; one task accepts, one
    task a connection, all on the running loop."""

    def __init__(self, render: Callable[[], bytes], content_type: str, path: str = "/metrics",
                 request_timeout_s: float = REQUEST_TIMEOUT_S,
                 per_ip: int = MAX_CONNECTIONS_PER_IP, total: int = MAX_CONNECTIONS):
        self.render, self.content_type, self.path = render, content_type, path
        self.request_timeout_s, self.per_ip, self.total = request_timeout_s, per_ip, total
        self.quiet = QuietLog(log)
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._by_ip: dict[str, int] = {}
        self._room = asyncio.Event()   # set while fewer than `total` connections are open

    @property
    def connections(self) -> int:
        return len(self._tasks)

    async def start(self, addr: str, port: int) -> None:
        self.total = connection_budget(self.total)
        self._sock = listening_socket(addr, port)
        self._room.set()
        self._accepting = asyncio.create_task(self._accept_loop())

    async def close(self) -> None:
        tasks = [t for t in (self._accepting, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._sock is not None:
            self._sock.close()

    # --- accepting ---------------------------------------------------------------
    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._room.wait()
            try:
                conn, peer = await loop.sock_accept(self._sock)
            except OSError as e:   # out of descriptors or memory: the client waits in the backlog
                self.quiet.warning("accept", "metrics endpoint cannot accept a connection: %s; "
                                   "trying again in %g s", e.strerror or e, ACCEPT_RETRY_S)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            ip = peer[0]
            if self._by_ip.get(ip, 0) >= self.per_ip:
                self._refuse(conn, ip)
                continue
            self._by_ip[ip] = self._by_ip.get(ip, 0) + 1
            task = asyncio.create_task(self._serve(conn, ip))
            self._tasks.add(task)
            task.add_done_callback(lambda t, ip=ip: self._release(t, ip))
            if len(self._tasks) >= self.total:
                self._room.clear()
                self.quiet.warning("full", "metrics endpoint: %d connections open (its limit); "
                                   "new ones wait", self.total)

    def _release(self, task: asyncio.Task, ip: str) -> None:
        self._tasks.discard(task)
        self._by_ip[ip] -= 1
        if not self._by_ip[ip]:
            del self._by_ip[ip]
        self._room.set()

    def _refuse(self, conn: socket.socket, ip: str) -> None:
        """503 if the socket takes it at once, and close: nothing waits on it."""
        self.quiet.warning(f"refused {ip}", "metrics endpoint: too many connections from %s "
                           "(limit %d); refusing", ip, self.per_ip)
        try:
            conn.setblocking(False)
            conn.send(error_response(HttpError(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"too many connections from {ip} (limit {self.per_ip})")))
        except OSError:
            pass
        finally:
            conn.close()

    # --- one connection ----------------------------------------------------------
    async def _serve(self, conn: socket.socket, ip: str) -> None:
        try:
            reader, writer = await asyncio.open_connection(sock=conn, limit=MAX_HEAD)
        except OSError:
            conn.close()
            return
        writer.transport.set_write_buffer_limits(high=0)   # drain() waits for all of it
        try:
            writer.write(await self._answer(reader, ip))
            async with asyncio.timeout(self.request_timeout_s):
                await writer.drain()
            await self._linger(reader, writer)
        except TimeoutError:
            self.quiet.warning(f"slow {ip}", "metrics client %s did not take its response in "
                               "%g s; dropped", ip, self.request_timeout_s)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()

    async def _answer(self, reader: asyncio.StreamReader, ip: str) -> bytes:
        """The response to the request on `reader` (an error's included)."""
        try:
            async with asyncio.timeout(self.request_timeout_s):
                head = await read_head(reader)
            if head is None:
                return b""
            req = parse_head(head)
            check_request(req, self.path)
        except TimeoutError:
            self.quiet.warning(f"idle {ip}", "metrics client %s sent no whole request in %g s; "
                               "closing", ip, self.request_timeout_s)
            return error_response(HttpError(HTTPStatus.REQUEST_TIMEOUT,
                                            f"no whole request in {self.request_timeout_s:g} s"))
        except HttpError as e:
            self.quiet.warning(f"bad {ip}", "metrics client %s: %s", ip, e.reason)
            return error_response(e)
        try:
            body = self.render()
        except Exception as e:  # noqa: BLE001 - a bug must not take the daemon down: one line
            log.warning("metrics: cannot render the scrape: %s: %s", type(e).__name__, e)
            return error_response(HttpError(HTTPStatus.INTERNAL_SERVER_ERROR,
                                             "the switch could not render its metrics"))
        return response(HTTPStatus.OK, body, self.content_type, head_only=req.method == "HEAD")

    @staticmethod
    async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Half-close, and take what the client still sends for a moment:
        closing with unread input resets the connection, and the reset can
        destroy the response before the client has read it."""
        if writer.can_write_eof():
            writer.write_eof()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LINGER_S):
                while await reader.read(1 << 12):
                    pass
