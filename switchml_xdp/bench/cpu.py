"""CPU accounting for the benchmarks (psutil): the whole machine's CPU times
and their shares, the CPU of one process, and watching for other people's
work on the machine while a lab measurement runs."""
from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import threading
import time
from collections.abc import Sequence

import psutil

# The machine's CPU times that the shares are made of (psutil.cpu_times() names).
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine_cpu_times() -> list[float]:
    """Seconds every core together spent in each of CPU_FIELDS since boot."""
    t = psutil.cpu_times()
    return [getattr(t, name) for name in CPU_FIELDS]


def cpu_delta(before: Sequence[float], after: Sequence[float]) -> list[float]:
    return [b - a for a, b in zip(before, after)]


def cpu_shares(times: Sequence[float]) -> dict[str, float]:
    """Each of CPU_FIELDS in % of the machine, from a delta of machine_cpu_times()."""
    total = sum(times) or 1
    return {name: round(100.0 * v / total, 1) for name, v in zip(CPU_FIELDS, times)}


def cpu_summary(times: Sequence[float]) -> dict:
    """Shares of the machine (100 % = every core busy) from summed deltas of
    machine_cpu_times()."""
    d = dict(zip(CPU_FIELDS, times))
    total = sum(times) or 1

    def pct(v: float) -> float:
        return round(100.0 * v / total, 1)

    return {"busy_pct": pct(total - d["idle"] - d["iowait"]),
            "user_pct": pct(d["user"] + d["nice"]), "system_pct": pct(d["system"]),
            "softirq_pct": pct(d["irq"] + d["softirq"]), "steal_pct": pct(d["steal"]),
            "cores": os.cpu_count()}


def self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def proc_cpu_s(pid: int) -> float:
    """user + system time of a process (all threads), in seconds."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return t.user + t.system


def proc_run_s(pid: int) -> float:
    """A process's time on a CPU to the nanosecond: its live threads'
    scheduler run time (/proc/PID/task/*/schedstat), where proc_cpu_s counts
    10 ms ticks, too coarse for one short call of a quiet process (threads that
    have exited are not in it: a difference over a call of long-lived threads).
    proc_cpu_s where the scheduler's figures cannot be read."""
    total, tasks = 0, f"/proc/{pid}/task"
    try:
        for tid in os.listdir(tasks):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                with open(f"{tasks}/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return proc_cpu_s(pid)
    return total / 1e9


def foreign_cpu(ours: set[int]) -> dict[int, float]:
    """CPU seconds of every user process outside the lab and this bench, by
    pid: user + system, plus the children it has reaped, so that a test
    runner's short-lived children count too. `ours`: inodes of the lab's
    network namespaces. Kernel threads (kthreadd and its children) are left
    out (softirq work for the lab runs in ksoftirqd too)."""
    me, out = os.getpid(), {}
    for p in psutil.process_iter(["ppid", "cpu_times"]):
        if p.pid in (me, 2) or p.info["ppid"] == 2 or p.info["cpu_times"] is None:
            continue
        try:
            if os.stat(f"/proc/{p.pid}/ns/net").st_ino in ours:
                continue
        except OSError:
            continue
        t = p.info["cpu_times"]
        out[p.pid] = t.user + t.system + t.children_user + t.children_system
    return out


class Disturbance:
    """Watches, while a measurement runs, for other people's work on the
    machine: CPU of processes outside the lab (sampled every half second, so
    that short-lived ones are seen too), and network namespaces other than the
    lab's (another lab is up: its traffic costs softirq time no process
    accounting shows)."""

    def __init__(self, lab):
        from ..lab import netns

        self._netns = netns
        self.mine = set(lab.namespaces)
        self.ours = {os.stat(netns.ns_path(ns)).st_ino for ns in lab.namespaces}
        self._stop = None

    def __enter__(self) -> Disturbance:
        self.cpu_s, self.others = 0.0, set()
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._last = foreign_cpu(self.ours)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        now = foreign_cpu(self.ours)
        self.cpu_s += sum(max(0.0, v - self._last.get(pid, 0.0)) for pid, v in now.items())
        self._last = now
        with contextlib.suppress(OSError):
            self.others |= set(self._netns.list_netns()) - self.mine

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            self._sample()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.wall = time.monotonic() - self._t0

    def report(self) -> dict:
        return {"foreign_cpu_pct": round(100 * self.cpu_s / self.wall / (os.cpu_count() or 1), 1),
                "other_netns": sorted(self.others)}


def busy_pct_over(seconds: float) -> float:
    """How busy the machine is (100 % = every core), measured over `seconds`."""
    t0 = machine_cpu_times()
    time.sleep(seconds)
    return cpu_summary(cpu_delta(t0, machine_cpu_times()))["busy_pct"]


def wait_quiet(lab, max_s: float, busy_pct: float = 8.0, out=None) -> float:
    """Wait (at most max_s) until no other network namespace is up and the
    machine has been under busy_pct busy for three 1-second samples in a row
    (the lab's own processes are idle between measurements). Returns the
    seconds waited."""
    from ..lab import netns

    t0 = time.monotonic()
    mine, calm, told = set(lab.namespaces), 0, False
    while calm < 3 and time.monotonic() - t0 < max_s:
        busy = busy_pct_over(1.0)
        others = set(netns.list_netns()) - mine
        calm = calm + 1 if busy < busy_pct and not others else 0
        if not calm and not told and out:
            out(f"  (waiting for a quiet machine: {busy:.0f}% busy, "
                f"{len(others)} other namespaces)")
            told = True
    return time.monotonic() - t0


def quietness() -> dict:
    """Load and the busiest other processes, to record how quiet the machine was."""
    load = os.getloadavg()
    busy = busy_pct_over(1.0)
    r = subprocess.run(["ps", "-eo", "pcpu,comm", "--sort=-pcpu", "--no-headers"],
                       capture_output=True, text=True)
    top = [" ".join(line.split()) for line in r.stdout.splitlines()[:5]]
    return {"loadavg": [round(x, 2) for x in load], "busy_pct_1s": busy, "top": top}
