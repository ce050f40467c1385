"""A box lost in the middle of a lab run, and when each rank noticed.

The driver side: BoxKiller powers one of the lab's boxes off after a delay
(its link down, so nothing reaches its data plane, then its daemon killed),
as a box that loses power: an XDP program outlives a killed daemon, so a
kill alone would leave the box aggregating. The rank side: every warning a
rank issues is also printed on its stdout as a `WARNING {json}` line with
its wall-clock time, so the driver can tell how long after the kill each
rank warned (docs/scale-out.md, "Failures").
"""
from __future__ import annotations

import json
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence

from .addressing import Host

WARNING_MARK = "WARNING "
# A path the driver gives the ranks: rank 0 creates it as its training begins.
BEGAN_ENV = "SWML_LAB_TRAINING_BEGAN"


def report_warnings(rank: int) -> None:
    """Rank side: print every warning as a WARNING line too (time.time(), so
    the driver on the same machine compares it with the kill's)."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        record = {"rank": rank, "t": time.time(), "category": category.__name__,
                  "message": str(message)}
        print(WARNING_MARK + json.dumps(record), file=sys.stdout, flush=True)
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def warning_records(stdout: str) -> list[dict]:
    """The WARNING lines of one rank's stdout."""
    return [json.loads(ln[len(WARNING_MARK):]) for ln in stdout.splitlines()
            if ln.startswith(WARNING_MARK)]


class BoxKiller:
    """Powers box `box` of the lab off `after` seconds from when `began()`
    first holds (polled from start(); by default at once): e.g. from the
    training's first step rather than from its processes' start, which
    imports and rendezvous make uneven."""

    def __init__(self, lab, box: int, after: float, kill_daemon: Callable[[], object],
                 out: Callable[[str], None] = print, began: Callable[[], bool] = lambda: True,
                 links: Sequence[Host] | None = None,
                 what: str = "its link down, its daemon killed"):
        """links: the hosts whose links go down before kill_daemon (default
        the box's own); what: how the kill is told."""
        if not 0 <= box < len(lab.switches):
            raise ValueError(f"the lab has boxes 0..{len(lab.switches) - 1}, not {box}")
        self.lab, self.host, self.after = lab, lab.switches[box], after
        self.kill_daemon, self.out, self.began = kill_daemon, out, began
        self.links = [self.host] if links is None else list(links)
        self.what = what
        self.killed_at: float | None = None      # time.time() of the link going down
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="box-killer")
        self._started = 0.0

    def start(self) -> BoxKiller:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self.began():
            if self._cancel.wait(0.05):
                return
        self._started = time.time()
        if not self._cancel.wait(self.after):
            self._kill()

    def _kill(self) -> None:
        self.killed_at = time.time()   # (a moment early: the ranks' delays are not flattered)
        for host in self.links:
            self.lab.run(host, ["ip", "link", "set", "dev", host.iface, "down"])
        self.kill_daemon()
        self.out(f"  {self.describe()}: {self.what}")

    def describe(self) -> str:
        return (f"box {self.host.name} ({self.host.ip}) {'powered off' if self.links else 'killed'} "
                f"{self.killed_at - self._started:.1f} s into the training")

    def cancel(self) -> None:
        """No kill from now on (one under way finishes first)."""
        self._cancel.set()
        if self._thread.is_alive():
            self._thread.join()

    def report(self, records: Sequence[dict], ranks: int) -> dict:
        """When each rank first warned after the kill (None: it did not)."""
        if self.killed_at is None:
            return {"box": self.host.ip, "killed": False}
        first: dict[int, float | None] = dict.fromkeys(range(ranks))
        for r in sorted(records, key=lambda r: r["t"]):
            if r["t"] >= self.killed_at and first.get(r["rank"]) is None:
                first[r["rank"]] = round(r["t"] - self.killed_at, 3)
        return {"box": self.host.ip, "killed": True, "killed_at": self.killed_at,
                "after_s": round(self.killed_at - self._started, 3), "warned_after_s": first,
                "warnings": [r for r in records if r["t"] >= self.killed_at]}


def report_lines(report: dict) -> list[str]:
    """What the driver prints about a lost box."""
    if not report.get("killed"):
        return [f"box {report['box']} was not killed: the run ended first"]
    waits = report["warned_after_s"]
    said = ", ".join(f"rank {r} after {s:.2f} s" if s is not None else f"rank {r} never"
                     for r, s in sorted(waits.items()))
    epoch = f" (epoch {report['epoch']})" if "epoch" in report else ""
    lines = [f"box {report['box']} lost {report['after_s']:.1f} s into the swml training{epoch}; "
             f"the ranks warned: {said}"]
    seen = set()
    for w in report["warnings"]:
        if w["message"] not in seen:
            seen.add(w["message"])
            lines.append(f"  rank {w['rank']}: {w['category']}: {w['message']}")
    return lines
