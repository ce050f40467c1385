"""CPU seconds per GiB reduced, the figure `swml-lab bench` puts beside every
result (docs/performance.md, "CPU per GiB reduced").

A GiB reduced is 2^30 bytes of one rank's tensor: a row's GiB are its tensor
bytes times its calls, whatever the number of ranks. Per row:
- ranks: the user + system time every rank process spent in its timed calls
  (getrusage(RUSAGE_SELF) read around each call in bench/rank.py: every
  thread, start-up and barriers left out), summed over the ranks. This
  kernel does no IRQ time accounting, so packet work that runs in softirq in
  a rank's own context (its sends, the veth hop, the XDP switch behind it)
  is in its system time; what ksoftirqd does is not.
- box: the switch's own cost over one more call of every rank, after the
  timed ones (BoxCpu.over_call): the XDP program's run time from the
  kernel's BPF statistics (run_time_ns, the program alone: not the veth
  hop or the redirect and clone that follow it), on for that call only
  (their two clock reads a packet cost the ranks ~4% on this VM), plus the
  switch daemon's process time; for the user-space data plane, its process
  time. In the lab the XDP part runs in the senders' softirq, so it is also
  inside `ranks`.
- machine: every core's busy time (/proc/stat) over rank 0's timed calls:
  everything, ksoftirqd and other people's work included.
Gloo has no box; its rows' ratio is the one every swml row of the same
worker count and loss is compared with.
"""
from __future__ import annotations

import contextlib

from .constants import GLOO_SYSTEMS
from .cpu import CPU_FIELDS, proc_run_s

GIB = 2**30
_IDLE = [CPU_FIELDS.index("idle"), CPU_FIELDS.index("iowait")]


def per_gib(ranks: list[dict], size_bytes: int, box_cpu_s: float | None,
            box_gib_calls: int) -> dict:
    """The row's figures (module docstring): ranks, box (None without one)
    and machine (None where rank 0 did not read the machine's times)."""
    calls = len(ranks[0]["times"])
    gib = size_bytes * calls / GIB
    ticks = ranks[0].get("cpu_times")
    machine = sum(ticks) - sum(ticks[i] for i in _IDLE) if ticks else None
    box_gib = size_bytes * box_gib_calls / GIB
    return {"ranks": round(sum(r["self_cpu_s"] for r in ranks) / gib, 4),
            "box": round(box_cpu_s / box_gib, 4) if box_cpu_s is not None else None,
            "machine": round(machine / gib, 4) if machine is not None else None}


class BoxCpu:
    """The boxes' CPU seconds so far: the XDP programs' BPF run time (while
    bpf.stats_enabled() holds) and the switch processes' time on a CPU (to the
    nanosecond: one short call of a user-space switch is under a 10 ms tick)."""

    def __init__(self, prog_ids=(), pids=()):
        self.prog_ids, self.pids = list(prog_ids), list(pids)

    @classmethod
    def of_switches(cls, switches) -> BoxCpu:
        """The XDP switches' (lab.cluster.SwitchProcess)."""
        from ..switch.state_files import read_state

        return cls([read_state(sw.iface)["prog_id"] for sw in switches], [sw.proc.pid for sw in switches])

    def seconds(self) -> float:
        from ..bpf import prog_stats

        ns = 0
        for prog in self.prog_ids:
            with contextlib.suppress(OSError, RuntimeError):
                ns += prog_stats(prog)["run_time_ns"]
        return ns / 1e9 + sum(map(proc_run_s, self.pids))


    def over_call(self, group, timeout: float) -> dict:
        """`box_cpu_s`, the boxes' CPU seconds over one untimed call of every
        rank of `group` (bench/rank_group.py), with the BPF statistics on for
        it alone, and `box_calls`: 1; a failed call: None and why."""
        from ..bpf import stats_enabled
        from .rank_group import RankError

        with stats_enabled() if self.prog_ids else contextlib.nullcontext():
            s0 = self.seconds()
            try:
                group.run(1, 0, timeout)
            except RankError as e:
                return {"box_cpu_s": None, "box_error": str(e)}
            return {"box_cpu_s": round(self.seconds() - s0, 6), "box_calls": 1}


def compare_to_gloo(results: list[dict], gloo: dict) -> str:
    """Each swml row of Gloo's worker count and loss: its ranks' CPU s/GiB
    over Gloo's, set as the row's `cpu_per_gib_vs_gloo`; the line the bench
    prints of them ("" where there are none)."""
    base = (gloo.get("cpu_s_per_gib") or {}).get("ranks")
    out: dict[str, float] = {}
    if not base:
        return ""
    for r in results:
        mine = (r.get("cpu_s_per_gib") or {}).get("ranks")
        if (r["system"] in GLOO_SYSTEMS or mine is None or r["workers"] != gloo["workers"]
                or r["loss"] != gloo["loss"]):
            continue
        r["cpu_per_gib_vs_gloo"] = round(mine / base, 3)
        where = f"{r['system']} k={r['k']}" + (f" boxes={r['boxes']}" if r.get("boxes", 1) > 1 else "")
        out[where] = r["cpu_per_gib_vs_gloo"]
    return ("    ranks' CPU s/GiB over Gloo's: " + ", ".join(f"{w} {v:.2f}x" for w, v in out.items())
            if out else "")
