"""The door's errors: one line each, saying what failed and why."""
from __future__ import annotations


class BpfError(RuntimeError):
    """A BPF program could not be compiled, loaded, pinned or inspected.

    `log` keeps the whole compiler or verifier output when there was one; the
    message itself is one line (its useful part)."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


class XdpError(BpfError):
    """An XDP program could not be attached to, detached from or queried on an interface."""


class PinnedMapError(BpfError, OSError):
    """A pinned map could not be opened, read or written (`errno` says why)."""

    def __init__(self, errno: int, message: str):
        OSError.__init__(self, errno, message)
        self.log = ""

    def __str__(self) -> str:
        return self.strerror or ""
