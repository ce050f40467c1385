"""CPU seconds per GiB reduced in `swml-lab bench` (bench/cpu_per_gib.py):
the arithmetic, the box's accounting over a phase, the comparison with
Gloo, and where the report shows them."""
from __future__ import annotations

import pytest

from switchml_xdp.bench import cpu_per_gib, report
from switchml_xdp.bench.cpu import CPU_FIELDS

MIB = 2**20


def _rank(cpu_s: float, calls: int = 4, ticks=None) -> dict:
    return {"times": [0.1] * calls, "self_cpu_s": cpu_s, "cpu_times": ticks}


def test_per_gib_divides_the_ranks_summed_time_by_one_ranks_bytes():
    ticks = [0.0] * len(CPU_FIELDS)
    ticks[CPU_FIELDS.index("user")] = 0.5
    ticks[CPU_FIELDS.index("softirq")] = 0.25
    ticks[CPU_FIELDS.index("idle")] = 9.0       # idle time is no CPU spent
    ranks = [_rank(0.75, ticks=ticks), _rank(0.25)]
    # 4 calls of 256 MiB: one GiB reduced, whatever the number of ranks
    g = cpu_per_gib.per_gib(ranks, 256 * MIB, box_cpu_s=0.1, box_gib_calls=5)
    assert g == {"ranks": 1.0, "box": pytest.approx(0.1 / 1.25), "machine": 0.75}
    assert cpu_per_gib.per_gib(ranks[1:], 256 * MIB, None, 5)["box"] is None
    assert cpu_per_gib.per_gib(ranks[1:], 256 * MIB, None, 5)["machine"] is None


class _Group:
    """A rank group whose call makes the box spend 2.5 s; `fail`: a rank dies."""

    def __init__(self, box, fail: bool = False):
        self.box, self.fail, self.calls = box, fail, []

    def run(self, iterations, warmup, timeout):
        from switchml_xdp.bench.rank_group import RankError

        self.calls.append((iterations, warmup))
        if self.fail:
            raise RankError("rank 1 exited (1): boom")
        self.box.s += 2.5
        return []


class _Box(cpu_per_gib.BoxCpu):
    s = 1.0

    def seconds(self) -> float:
        return self.s


def test_the_boxs_cpu_is_its_delta_over_one_untimed_call():
    box = _Box(pids=[1])             # no program: no statistics to turn on
    group = _Group(box)
    assert box.over_call(group, 10) == {"box_cpu_s": 2.5, "box_calls": 1}
    assert group.calls == [(1, 0)]   # one call, no warm-up
    assert box.over_call(_Group(box, fail=True), 10) == {"box_cpu_s": None,
                                                         "box_error": "rank 1 exited (1): boom"}


def test_box_cpu_counts_a_process_and_skips_a_vanished_program():
    import os

    box = cpu_per_gib.BoxCpu(prog_ids=(), pids=[os.getpid()])
    assert box.seconds() > 0


def test_a_process_time_counts_below_a_clock_tick():
    """A user-space switch's share of one tiny call is a few ms: under the
    10 ms tick that /proc/PID/stat counts in (CI once read 0.0 for it)."""
    import os
    import time

    from switchml_xdp.bench.cpu import proc_run_s

    before, t0 = proc_run_s(os.getpid()), time.process_time()
    while time.process_time() - t0 < 0.002:
        pass
    spent = proc_run_s(os.getpid()) - before
    assert 0.0015 < spent < 0.5, spent
    assert proc_run_s(2**22 + 7) == 0.0         # no such process


def _row(system: str, ranks_s: float, workers: int = 2, k=256, loss: float = 0.0) -> dict:
    return {"system": system, "workers": workers, "k": k, "loss": loss, "status": "ok",
            "tat_median_s": 0.1, "tat_min_s": 0.1, "tat_max_s": 0.1, "goodput_mbps": 1.0,
            "bound_fraction": 0.5, "counters": {}, "workers_cpu_pct": 50.0,
            "cpu": {"busy_pct": 90.0, "softirq_pct": 10.0},
            "cpu_s_per_gib": {"ranks": ranks_s, "box": 0.5 if system != "gloo" else None,
                              "machine": None}}


def test_every_swml_row_of_the_same_workers_and_loss_as_gloo_gets_its_ratio():
    rows = [_row("swml-afxdp", 3.0), _row("swml-udp", 6.0), _row("swml-afxdp", 9.0, workers=4),
            _row("swml-afxdp", 9.0, loss=0.01)]
    gloo = _row("gloo", 2.0)
    line = cpu_per_gib.compare_to_gloo([*rows, gloo], gloo)
    assert [r.get("cpu_per_gib_vs_gloo") for r in rows] == [1.5, 3.0, None, None]
    assert "swml-afxdp k=256 1.50x" in line and "swml-udp k=256 3.00x" in line
    assert "cpu_per_gib_vs_gloo" not in gloo
    assert cpu_per_gib.compare_to_gloo(rows, {**gloo, "cpu_s_per_gib": None}) == ""


def test_the_report_shows_the_figures_and_the_ratio():
    sw, gl = _row("swml-afxdp", 3.0), _row("gloo", 2.0, k=None)
    assert "3.00 s/GiB (box 0.50)" in report.row_line(sw)
    assert "2.00 s/GiB" in report.row_line(gl) and "box" not in report.row_line(gl)
    assert report.cpu_ratio(sw, gl) == 1.5
    assert report.cpu_ratio(sw, None) is None
    assert report.cpu_ratio({**sw, "cpu_s_per_gib": None}, gl) is None
    meta = {"workers": [2], "losses": [0.0], "ks": [256], "systems": ["swml-afxdp", "gloo"],
            "command": "swml-lab bench", "started": "now", "duration_s": 1, "size_bytes": MIB,
            "rate_mbit": 100, "warmup": 1, "iterations": 4, "definitions": {},
            "machine": {"cores": 2, "kernel": "k", "quiet_before": {"loadavg": [0, 0, 0]}}}
    doc = {"meta": meta, "results": [sw, gl]}
    md = report.markdown(doc)
    assert "| swml/gloo | CPU swml/gloo |" in md
    assert "· 3.00 s/GiB (box 0.50)" in md and "| 1.00 | 1.50 |" in md
    assert "CPU s/GiB reduced, swml/gloo: N=2: 1.50" in md
    assert report.summary(doc)[256]["cpu_per_gib_swml_gloo"] == {2: 1.5}
