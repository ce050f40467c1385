"""What a `swml` process group did, and where its calls went
(docs/pytorch.md, "What a rank did").

    import switchml_xdp.torch as swt
    swt.stats()                  # the default group's; stats(group) for another

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
import torch.distributed as dist


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


def swml_group(group=None):
    """The ProcessGroupSwml of `group` (None: the default group), or a
    ValueError saying what the group is instead."""
    from .process_group import ProcessGroupSwml

    if group is None:
        if not dist.is_initialized():
            raise ValueError("no default process group: call init_process_group first, "
                             "or pass the swml group")
        group = dist.distributed_c10d._get_default_group()
    if isinstance(group, ProcessGroupSwml):
        return group
    try:
        backend = dist.get_backend(group)
    except (ValueError, RuntimeError):
        backend = type(group).__name__
    raise ValueError(f"this is not a swml group (its backend is {backend}): pass a group made "
                     "with backend='swml'")


def stats(group=None) -> dict:
    """The counters of a swml group (None: the default group), as a dict:

    rank, size, job, switch, datapath (udp/afxdp: the datapath of this rank's
    host), datapath_note (why a rank asked for auto got udp, else None), k,
    slots, hosts, ranks_per_host, leader (whether this rank streams for its
    host), switch_calls, switch_bytes (bytes this rank handed to the switch
    path), gloo_calls (Gloo's own collectives: name -> calls), fallbacks and
    fallback_reasons (calls the switch could be asked for but not carry:
    reason -> calls), packets and retransmissions (of the datapath, on a
    host's leader; None on the host's other ranks, whose data the leader
    streams)."""
    pg = swml_group(group)
    layout = pg.layout
    worker = pg.worker.stats() if pg.worker is not None else {}
    path = getattr(pg, "datapath", {}) or {}
    return {"rank": pg.rank(), "size": pg.size(),
            "job": path.get("job"), "switch": pg.options.switch,
            "datapath": path.get("datapath"), "datapath_note": path.get("note"),
            "k": pg.k, "slots": path.get("slots"),
            "hosts": layout.n_hosts, "ranks_per_host": len(layout.local_ranks),
            "leader": layout.is_leader,
            "switch_calls": pg.switch_calls, "switch_bytes": pg.calls.switch_bytes,
            "gloo_calls": dict(pg.calls.gloo_calls),
            "fallbacks": pg.fallbacks, "fallback_reasons": dict(pg._fallbacks.by_kind),
            "packets": worker.get("packets_sent"), "retransmissions": worker.get("retransmissions")}
