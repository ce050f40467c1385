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
import socket
from collections.abc import Callable
from http import HTTPStatus

from .control import LINGER_S
from .descriptors import share_of_free_descriptors
from .listener import Listener
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


class HttpEndpoint:
    """GET/HEAD `path` -> render(), as `content_type`; one task accepts, one
    task a connection, all on the running loop."""

    def __init__(self, render: Callable[[], bytes], content_type: str, path: str = "/metrics",
                 request_timeout_s: float = REQUEST_TIMEOUT_S,
                 per_ip: int = MAX_CONNECTIONS_PER_IP, total: int = MAX_CONNECTIONS):
        self.render, self.content_type, self.path = render, content_type, path
        self.request_timeout_s, self.per_ip, self.total = request_timeout_s, per_ip, total
        self.quiet = QuietLog(log)
        self._listener = Listener("metrics endpoint", self._serve, self._refuse, per_ip,
                                  lambda: self.total, self.quiet)

    @property
    def connections(self) -> int:
        return self._listener.connections

    @property
    def port(self) -> int:
        """The TCP port it listens on (the one given, or the kernel's pick for 0)."""
        return self._listener.sock.getsockname()[1]

    async def start(self, addr: str, port: int) -> None:
        self.total = share_of_free_descriptors(self.total)
        self._listener.start(addr, port)

    async def close(self) -> None:
        await self._listener.close()

    def _refuse(self, conn: socket.socket, ip: str) -> None:
        """503, if the socket takes it at once (the listener closes it)."""
        conn.send(error_response(HttpError(HTTPStatus.SERVICE_UNAVAILABLE,
                                           f"too many connections from {ip} (limit {self.per_ip})")))

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
