"""One log line per kind of trouble and interval, however often it happens.

A client that misbehaves in bulk (a thousand half-open connections, a flood
of connects) must not flood the daemon's log: the first occurrence of each
kind is logged at once, the rest of the interval only counted, and the next
line says how many were left out.
"""
from __future__ import annotations

import logging
import time

DEFAULT_INTERVAL_S = 10.0


class QuietLog:
    """log.warning, at most once per `key` and interval."""

    def __init__(self, log: logging.Logger, interval_s: float = DEFAULT_INTERVAL_S,
                 clock=time.monotonic):
        self.log, self.interval_s, self.clock = log, interval_s, clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warning(self, key: str, msg: str, *args) -> bool:
        """Log `msg % args` unless `key` was logged less than the interval ago;
        returns whether it was logged."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            msg += f" ({held} more like it since the last such line)"
        self.log.warning(msg, *args)
        return True
