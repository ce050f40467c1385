"""One control connection as the server sees it (control.py): its streams,
the job and rank it speaks for, and how it is answered or dropped; and the
idle timeout the server applies to connections that are not members."""
from __future__ import annotations

import asyncio
import json
import logging
import os

from .jobs import Job

log = logging.getLogger("swml.control")

IDLE_TIMEOUT_S = 30.0
IDLE_TIMEOUT_ENV = "SWML_CONTROL_IDLE_S"  # overrides IDLE_TIMEOUT_S at server start (tests)
MAX_BUFFERED_OUTPUT = 1 << 20    # bytes of replies/events queued for a client that does not read


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        peer = writer.get_extra_info("peername") or ("?", 0)
        self.peer_ip = peer[0]
        self.peer = f"{peer[0]}:{peer[1]}"
        self.job: Job | None = None
        self.rank: int | None = None
        self.op: str | None = None  # the request being answered, echoed in replies
        self.closing = False        # the switch ends this connection after its reply

    def send(self, obj: dict) -> None:
        if self.writer.is_closing():
            return
        if "event" not in obj and self.op:
            obj = {"op": self.op, **obj}
        self.writer.write((json.dumps(obj, separators=(",", ":")) + "\n").encode())
        if self.writer.transport.get_write_buffer_size() > MAX_BUFFERED_OUTPUT:
            self.drop(f"{MAX_BUFFERED_OUTPUT} bytes unread")

    def drop(self, why: str) -> None:
        """End a connection that does not read: reset it, nothing more is queued."""
        log.warning("control connection %s dropped: %s", self.peer, why)
        self.writer.transport.abort()

    def error(self, reason: str) -> None:
        self.send({"ok": False, "error": reason})


def idle_timeout_from_env() -> float:
    """IDLE_TIMEOUT_S, or the positive number of seconds in $SWML_CONTROL_IDLE_S."""
    raw = os.environ.get(IDLE_TIMEOUT_ENV)
    if raw is None:
        return IDLE_TIMEOUT_S
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not 0 < v < float("inf"):
        log.warning("ignoring %s=%r: not a positive number of seconds; using %g s",
                    IDLE_TIMEOUT_ENV, raw, IDLE_TIMEOUT_S)
        return IDLE_TIMEOUT_S
    return v
