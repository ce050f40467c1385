"""Calls that go around the switch: counted, and warned about once per kind.

The `swml` process group (gloo_side.py) and the DDP hook (hook.py) both hand
what the switch cannot carry to another process group; both count those
calls and warn the first time each kind comes by, not every step.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings
from collections import Counter

import torch
import torch._dynamo
import torch.distributed as dist

# Frames in these directories are this package's or torch's wrappers around a
# call: torch.distributed's, and torch._dynamo's (torch.compiler.disable wraps
# the group's collectives: compile_opaque.py).
_OWN_DIRS = (os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.abspath(dist.__file__)),
             os.path.dirname(os.path.abspath(torch._dynamo.__file__)))


class Fallbacks:
    """How many calls went around the switch, and a warning per new kind."""

    def __init__(self) -> None:
        self.count = 0
        self.by_kind: Counter = Counter()   # kind -> calls (group_report.stats's fallback_reasons)
        self._warned: set = set()
        self._lock = threading.Lock()

    def note(self, kind, message: str, stacklevel: int = 1) -> None:
        """Count one call of `kind` (hashable); the first of its kind warns
        `message` as a RuntimeWarning. stacklevel: as warnings.warn's, seen
        from the caller of note()."""
        with self._lock:
            self.count += 1
            self.by_kind[kind] += 1
            first = kind not in self._warned
            self._warned.add(kind)
        if first:
            warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)


def _is_ours(filename: str) -> bool:
    return os.path.dirname(os.path.abspath(filename)).startswith(_OWN_DIRS)


def caller_stacklevel() -> int:
    """warnings' stacklevel, seen from the caller of this function, of the
    first frame outside this package and torch.distributed: the user's call,
    not torch's wrappers."""
    frame, level = sys._getframe(1), 1
    while frame is not None and _is_ours(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level
