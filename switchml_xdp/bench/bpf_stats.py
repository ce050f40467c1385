"""Kernel BPF run-time statistics: ns per packet of an XDP program."""
from __future__ import annotations

from ..bpf import prog_stats


class ProgCost:
    """Snapshot run_cnt/run_time_ns of a program; `since()` gives the delta."""

    def __init__(self, prog_id: int):
        self.prog_id = prog_id
        self.start = prog_stats(prog_id)

    def since(self) -> dict:
        now = prog_stats(self.prog_id)
        runs = now["run_cnt"] - self.start["run_cnt"]
        ns = now["run_time_ns"] - self.start["run_time_ns"]
        return {"packets": runs, "run_time_ns": ns, "ns_per_packet": ns / runs if runs else float("nan")}
