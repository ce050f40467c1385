"""The little of HTTP/1.x the metrics endpoint speaks (metrics_http.py): read
a request's head (request line and headers) under a size limit, parse it,
and write the one response a connection gets (always `Connection: close`).

Only GET and HEAD of one path are served; anything else gets its status code
and a one-line text body, never a traceback.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from http import HTTPStatus

MAX_HEAD = 8 * 1024      # bytes of request line and headers
MAX_HEADER_LINES = 64
VERSIONS = ("HTTP/1.0", "HTTP/1.1")
METHODS = ("GET", "HEAD")


class HttpError(Exception):
    """A request that gets an error status: `status` and a one-line reason."""

    def __init__(self, status: HTTPStatus, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass(frozen=True)
class Request:
    method: str
    path: str        # the target without its query
    version: str


async def read_head(reader: asyncio.StreamReader) -> bytes | None:
    """The request line and headers, up to and with the blank line that ends
    them; None if the client closed first. HttpError(431) beyond MAX_HEAD
    bytes or MAX_HEADER_LINES lines. The caller bounds the time it may take."""
    head, lines = b"", 0
    while True:
        try:
            line = await reader.readline()
        except ValueError:   # a line longer than the reader's limit
            raise HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                            f"request head longer than {MAX_HEAD} bytes") from None
        if not line.endswith(b"\n"):
            return None
        if line in (b"\r\n", b"\n") and not head:
            continue   # blank lines before the request line are ignored (RFC 9112 2.2)
        head += line
        lines += 1
        if len(head) > MAX_HEAD or lines > MAX_HEADER_LINES + 1:
            raise HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                            f"request head longer than {MAX_HEAD} bytes or {MAX_HEADER_LINES} headers")
        if line in (b"\r\n", b"\n"):
            return head


def parse_head(head: bytes) -> Request:
    """The request of a head read by read_head; HttpError(400) if malformed."""
    def bad(why: str) -> HttpError:
        return HttpError(HTTPStatus.BAD_REQUEST, why)

    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise bad("the request head is not ASCII") from None
    lines = text.replace("\r\n", "\n").split("\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not all(parts):
        raise bad("malformed request line (want: METHOD TARGET HTTP/1.x)")
    method, target, version = parts
    if version not in VERSIONS:
        raise bad(f"unsupported protocol {version[:16]!r} (HTTP/1.0 or HTTP/1.1)")
    if not method.isalpha() or not method.isupper() or len(method) > 16:
        raise bad("malformed method")
    if not target.startswith("/") or not target.isprintable():
        raise bad("malformed request target")
    for line in lines[1:]:
        if line and (line[0] in " \t" or ":" not in line or not line.isprintable()):
            raise bad("malformed header line")
    return Request(method, target.partition("?")[0], version)


def check_request(req: Request, path: str) -> None:
    """HttpError unless `req` asks for `path` with GET or HEAD."""
    if req.method not in METHODS:
        raise HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"method {req.method} not allowed (GET, HEAD)")
    if req.path != path:
        raise HttpError(HTTPStatus.NOT_FOUND, f"not found; the metrics are at {path}")


def response(status: HTTPStatus, body: bytes, content_type: str = "text/plain; charset=utf-8",
             head_only: bool = False) -> bytes:
    """A whole response that ends its connection."""
    headers = [f"HTTP/1.1 {status.value} {status.phrase}", f"Content-Type: {content_type}",
               f"Content-Length: {len(body)}", "Connection: close"]
    if status == HTTPStatus.METHOD_NOT_ALLOWED:
        headers.append(f"Allow: {', '.join(METHODS)}")
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + (b"" if head_only else body)


def error_response(e: HttpError) -> bytes:
    return response(e.status, (e.reason + "\n").encode())
