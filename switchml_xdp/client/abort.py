"""The one abort contract of the worker: an AbortSignal says why the job was
aborted, or None.

The control client sets it when it learns that the job ended under this worker
(another rank failed, the switch went down, the lease could not be renewed);
the Worker and every backend read it, and a backend that is inside an allreduce
when it is set raises `JobAborted` with its reason (`raise_if_set`). A
datapath that polls (udp) reads `reason` between packets; one that must not
run Python per packet (afxdp's C loop) registers `on_abort` and raises a flag.
"""
from __future__ import annotations

import threading
from collections.abc import Callable


class JobAborted(RuntimeError):
    """The job ended under this worker: another rank failed, or the switch went down."""


class AbortSignal:
    """Set once, by whoever learns first; the first reason is the one kept."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._listeners: list[Callable[[str], None]] = []

    @property
    def reason(self) -> str | None:
        """Why the job was aborted, or None while it runs."""
        return self._reason

    def set(self, reason: str) -> bool:
        """Abort with `reason`; False (and nothing happens) if already aborted."""
        with self._lock:
            if self._reason is not None:
                return False
            self._reason = reason
            listeners = list(self._listeners)
        for fn in listeners:
            fn(reason)
        return True

    def on_abort(self, fn: Callable[[str], None]) -> None:
        """Call fn(reason) once when the signal is set: now, if it already is."""
        with self._lock:
            reason = self._reason
            if reason is None:
                self._listeners.append(fn)
        if reason is not None:
            fn(reason)

    def raise_if_set(self, job: str) -> None:
        """Raise JobAborted naming the job and the reason, if aborted."""
        reason = self._reason
        if reason is not None:
            raise JobAborted(f"job {job!r} aborted: {reason}")
