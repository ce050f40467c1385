"""A lost box noticed within `box_timeout` (2 s by default), whatever the
stall timeout (docs/scale-out.md, "Failures").

A data-path stall alone cannot tell a dead box from a slow peer rank: the
box gives nothing back for a slot until every rank sent it, so a rank that
waits for a slow peer sees exactly what a rank behind a dead box sees. The
box's control connection tells them apart: a live box answers it whatever
the ranks do. So a box whose part of the call made no progress (no new
result) for 40% of `box_timeout` is asked (a heartbeat, which the daemon
answers at once); a box that has not answered by 80% of `box_timeout`
after its last result -- its link down, its host off, its daemon gone and
not back -- is lost: its part of the call is interrupted and fails as
BoxLost (the last 20% leave room for the watch's tick and the call's
unwinding on a loaded host, so the call fails within `box_timeout` of the
box's silence).
A box that answers is alive and waited for as long as the stall timeout
says, unless its datapath has seen the call's RESULTs reach the host and go
astray (afxdp: on another lane's receive queue, and not at the port's
socket through the stack either, Backend.misroute_check):
then waiting cannot help, and the part fails at the ask's time (40% of
`box_timeout` without a result) as a TimeoutError that says why.

Interrupting a part is for that call only (BoxSignal): the box's stream
resyncs as after any failed call, and the next call asks it again, so a box
whose link comes back serves the next call (if its daemon kept the job:
its lease is 3 s by default). A daemon restarted while its data plane keeps
aggregating is not lost: its part keeps making progress.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .abort import AbortSignal

BOX_TIMEOUT_S = 2.0
TICK_S = 0.05   # how often the watch looks at the parts in progress


class BoxSignal(AbortSignal):
    """What one box's backend reads as its abort signal: the job's abort on
    that box (its control client's, for good), or an interrupt of the
    current call (cleared when the next call begins)."""

    def __init__(self, job_abort: AbortSignal) -> None:
        super().__init__()
        self._for_good = False
        job_abort.on_abort(self._abort_for_good)

    def _abort_for_good(self, reason: str) -> None:
        with self._lock:
            self._for_good = True
            interrupted = self._reason is not None
            if interrupted:       # the listeners heard the interrupt; the job's reason wins
                self._reason = reason
        if not interrupted:
            self.set(reason)

    def interrupt(self, reason: str) -> None:
        """Stop the call in progress (if any) with `reason`."""
        self.set(reason)

    def clear(self) -> None:
        """A new call begins: forget an interrupt, not the job's abort."""
        with self._lock:
            if not self._for_good:
                self._reason = None

    @property
    def for_good(self) -> bool:
        return self._for_good


class PartWatch:
    """One box's part of the call in progress, as the watch sees it."""

    def __init__(self, results: Callable[[], int], ping: Callable[[], bool],
                 pongs: Callable[[], int], now: float,
                 misrouted: Callable[[], str | None] = lambda: None) -> None:
        self.results, self.ping, self.pongs, self.misrouted = results, ping, pongs, misrouted
        self.seen = results()
        self.last_progress = now
        self.probe: tuple[float, int] | None = None     # (when asked, pongs then)
        self.done = False

    def verdict(self, now: float, probe_after: float, lost_after: float) -> str | None:
        """None while the part is fine, else why the box is lost."""
        seen = self.results()
        if seen != self.seen:
            self.seen, self.last_progress, self.probe = seen, now, None
            return None
        if self.probe is not None and self.pongs() > self.probe[1]:
            self.last_progress, self.probe = now, None      # it answered: a slow peer
            return None
        if self.probe is None:
            if now - self.last_progress >= probe_after:
                self.probe = (now, self.pongs())
                self.ping()
            return None
        if now - self.last_progress >= lost_after:
            return (f"no result for {now - self.last_progress:.1f} s and no answer on its "
                    f"control connection for {now - self.probe[0]:.1f} s: the box is lost")
        return None

    def astray(self, now: float, after: float) -> str | None:
        """Why the part, `after` s without a result, cannot progress
        however long it waits (its RESULTs go astray), else None."""
        if now - self.last_progress < after:
            return None
        why = self.misrouted()
        return None if why is None else f"no result for {now - self.last_progress:.1f} s, and {why}"


class BoxWatch:
    """Watches the parts of each call on their own thread and interrupts
    the part of a box that is lost (BoxSignal.interrupt)."""

    def __init__(self, box_timeout: float = BOX_TIMEOUT_S) -> None:
        if not box_timeout > 0:
            raise ValueError(f"box_timeout must be a positive number of seconds, not {box_timeout!r}")
        self.box_timeout = float(box_timeout)
        self.probe_after = self.box_timeout * 0.4
        self.lost_after = self.box_timeout * 0.8
        self._lock = threading.Lock()
        self._parts: dict[str, tuple[PartWatch, BoxSignal]] = {}
        self.lost: dict[str, str] = {}    # this call's lost boxes: address -> why
        self.astray: dict[str, str] = {}  # this call's parts whose RESULTs go astray: address -> why
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="swml-box-watch", daemon=True)
        self._thread.start()

    def begin(self, parts: dict[str, tuple[PartWatch, BoxSignal]]) -> None:
        """A call begins with these parts (address -> its watch and signal)."""
        with self._lock:
            self.lost, self.astray = {}, {}
            self._parts = parts

    def done(self, address: str) -> None:
        """Box `address` finished its part (well or not)."""
        with self._lock:
            if address in self._parts:
                self._parts[address][0].done = True

    def end(self) -> tuple[dict[str, str], dict[str, str]]:
        """The call ended: the boxes found lost during it, and those whose
        RESULTs went astray (address -> why, each)."""
        with self._lock:
            self._parts = {}
            return dict(self.lost), dict(self.astray)

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            with self._lock:
                now = time.monotonic()
                for address, (part, signal) in self._parts.items():
                    if part.done or address in self.lost or address in self.astray:
                        continue
                    why = part.verdict(now, self.probe_after, self.lost_after)
                    if why is not None:
                        self.lost[address] = why
                        signal.interrupt(f"box {address} lost: {why}")
                        continue
                    why = part.astray(now, self.probe_after)
                    if why is not None:
                        self.astray[address] = why
                        signal.interrupt(why)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
