"""The one interface of the worker's datapaths (`udp`, `afxdp`).

The Worker builds a backend once it has joined its job, with

    Backend(info, local, abort, policy=None, stall_timeout=STALL_TIMEOUT_S,
            window=None, verbose=True)

where `info` is the join's JobInfo, `local` this end of the data path
(LocalEnd: IPv4, interface, MAC, looked up once by the Worker), `abort` the
AbortSignal the control client sets (abort.py), `policy` the retransmission
policy (retransmit.py; None: the backend's `default_policy`), `window` the
congestion window's (window.py; None: the default). It then calls
`allreduce` one call at a time, `stats()` whenever, and `close()` once.
Both backends speak the same wire protocol and streaming rules (plans.py,
calls.py: seq, tag, resync after a failed call), so the ranks of a job may use
either. Both hold the worker's UDP port for their life (port.py).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .abort import AbortSignal
from .calls import Call
from .control import JobInfo
from .retransmit import STALL_TIMEOUT_S, RetransmitPolicy
from .window import WindowPolicy, window_policy

# The counters every backend's stats() has (a backend may add its own).
STAT_KEYS = ("packets_sent", "retransmissions", "results", "duplicates", "shadow_replies",
             "ignored", "forged", "spurious_timeouts", "rack_resends",
             "tail_probes", "timeout_copies")


@dataclass(frozen=True)
class LocalEnd:
    """This worker's end of the data path: where the switch's RESULTs arrive."""
    ip: str
    iface: str
    mac: str


class Backend(ABC):
    """A datapath that streams tensors through the job's slots on the switch."""

    name: ClassVar[str]
    # What streams: "engine" (the C engine, worker/) or "python" (a loop in Python).
    loop: ClassVar[str]
    # Precisions of a float32 sum it streams (calls.PRECISIONS): "16" is the
    # 16-bit block format, where the backend packs int16 payloads.
    precisions: ClassVar[tuple[str, ...]] = ("32",)
    default_policy: ClassVar[RetransmitPolicy]
    # <env_prefix>RTO_INITIAL=... in the environment overrides the policy: knobs
    # for experiments (RetransmitPolicy.with_env).
    env_prefix: ClassVar[str]
    # Whether it streams a job's lanes, a socket and thread each (docs/performance.md,
    # "Several queues per worker"); one that does not refuses a job with lanes.
    streams_lanes: ClassVar[bool] = False

    def __init__(self, info: JobInfo, local: LocalEnd, abort: AbortSignal,
                 policy: RetransmitPolicy | None = None, stall_timeout: float = STALL_TIMEOUT_S, *,
                 window: WindowPolicy | None = None, verbose: bool = True):
        """Set up the datapath for a joined job; raise RuntimeError or OSError
        with a one-line reason if it cannot be set up (nothing is left behind).
        A backend's constructor takes these arguments (and may add keywords
        of its own), and calls this first: it keeps what every backend uses."""
        if info.lanes > 1 and not self.streams_lanes:
            raise RuntimeError(f"the {self.name} backend ({self.loop} loop) streams one lane, and "
                               f"job {info.name!r} has {info.lanes}: use backend udp on the engine")
        self.info, self.local, self.abort_signal = info, local, abort
        self.stall_timeout, self.verbose = stall_timeout, verbose
        self.policy = (policy or self.default_policy).with_env(self.env_prefix)
        self.window_policy = window_policy(window)

    @abstractmethod
    def allreduce(self, flat: np.ndarray, call: Call) -> None:
        """Reduce a 1-D C-contiguous float32/int32 array in place over the job
        with call.op; every DATA packet carries the job's key, call.op and
        call.tag, and only RESULTs of this call from the switch are taken.

        Raises JobAborted ("job '<name>' aborted: <reason>") if `abort` is set
        before or during the call, TimeoutError if no result arrives for
        `stall_timeout` seconds (naming the slots it waited for), CallMismatch
        (call.mismatch()) as soon as a RESULT of this call says the ranks'
        contributions disagreed, ValueError (before sending) for a call longer
        than SWML_SEQ_RESYNC_STRIDE packets, RuntimeError if the backend is
        closed. After any failure the stream resyncs (calls.resync_index)."""

    @abstractmethod
    def stats(self) -> dict:
        """Counters since set-up: at least STAT_KEYS."""

    def misroute_check(self) -> Callable[[], str | None]:
        """For a call about to begin: a check that says why, once this
        datapath has seen the call's RESULTs reach the host but not itself
        (afxdp: on another lane's receive queue, and not through the
        stack either), else None. The box watch
        fails a call that stalls on it at once (box_watch.py), where the
        stall timeout would wait for nothing."""
        return lambda: None

    @abstractmethod
    def close(self) -> None:
        """Release the datapath; idempotent. A call in progress ends promptly."""
