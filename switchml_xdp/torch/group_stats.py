"""What a `swml` process group did, and where its calls went
(docs/pytorch.md, "What a rank did"); `switchml_xdp.torch.stats()` reports it
(group_report.py).

Every group counts its calls through the switch (and their bytes), its calls
through Gloo (the fallbacks, by reason, and Gloo's own collectives) and, on
a host's leader, the datapath's packets and retransmissions. SWML_DEBUG=1 in
the environment adds one stderr line per call saying where it went.
"""
from __future__ import annotations

import os
import sys
import threading
from collections import Counter

import torch


def debug_enabled() -> bool:
    """SWML_DEBUG set to anything but "" or "0": one line per call."""
    return os.environ.get("SWML_DEBUG", "") not in ("", "0")


class CallLog:
    """One group's counters of calls through the switch and through Gloo."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.switch_bytes = 0
        self.gloo_calls: Counter = Counter()   # Gloo's own collective -> calls
        self.debug = debug_enabled()
        self._lock = threading.Lock()

    def through_switch(self, what: str, flat: torch.Tensor) -> None:
        nbytes = flat.numel() * flat.element_size()
        with self._lock:
            self.switch_bytes += nbytes
        if self.debug:
            self.say(f"{what} {flat.dtype} x{flat.numel()} ({nbytes} B) -> switch")

    def through_gloo(self, collective: str) -> bool:
        """Count a call that Gloo does by design; True for the group's first."""
        with self._lock:
            first = not self.gloo_calls
            self.gloo_calls[collective] += 1
        if self.debug:
            self.say(f"{collective} -> gloo (Gloo's by design)")
        return first

    def say(self, line: str) -> None:
        print(f"switchml_xdp[rank {self.rank}]: {line}", file=sys.stderr, flush=True)
