"""`swml-lab demo`, `bench` and `train` over several boxes, before anything is
built: their options, the bound of a job over boxes (one definition, shared
with boxes_bench), the bench's rows and table, each box's share as printed,
and the lost-box plumbing of `train --kill-box`. The runs themselves:
tests/lab/test_lab_boxes_runs.py."""
from __future__ import annotations

import json
import threading
import warnings
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from switchml_xdp import wire
from switchml_xdp.bench import boxes_bench, constants, lab_bench, report
from switchml_xdp.bench.allreduce_bench import run as bench_run
from switchml_xdp.cli import lab as lab_cli
from switchml_xdp.lab import box_runs, lost_box

S = 16 << 20
K = 256
WIRE_BITS = S / 4 / K * (wire.HEADERS_LEN + 4 * K) * 8     # one worker's tensor on the wire


# -- the bound ------------------------------------------------------------------

@pytest.mark.parametrize("boxes, rates, bound_s", [
    (1, [100], 4 * WIRE_BITS / 100e6),            # one box: N S through its port
    (2, [100, 100], 2 * WIRE_BITS / 100e6),
    (4, [100] * 4, WIRE_BITS / 100e6),            # M = N: the workers' links again
    (8, [100] * 8, WIRE_BITS / 100e6),            # past it, more boxes buy nothing
    (3, [100, 100, 200], WIRE_BITS / 100e6),
    (2, [50, 100], 4 * WIRE_BITS / 150e6),        # rates summed, not the slowest x M
    (2, [None, None], WIRE_BITS / 100e6),         # unshaped ports: the workers' links
])
def test_a_job_over_boxes_is_bound_by_its_links_or_the_boxes_ports(boxes, rates, bound_s):
    got = constants.boxes_bound_s(S, 4, 100, rates, K)
    assert got == pytest.approx(bound_s, rel=1e-12)
    # One definition: boxes_bench's rows and the lab bench's bound say the same.
    if None not in rates:
        assert boxes_bench.bound_s(S, 4, 100, rates) == got
    assert S * 8 / (constants.bound_mbps("swml-afxdp", 100, K, 4, box_rates=rates) * 1e6) \
        == pytest.approx(got, rel=1e-12)


def test_the_16_bit_format_and_gloo_keep_their_bounds_over_boxes():
    assert constants.boxes_bound_s(S, 4, 100, [100], K, wire_bytes=2) == pytest.approx(
        4 * S / 4 / K * (wire.HEADERS_LEN + 2 * K) * 8 / 100e6)
    assert constants.bound_mbps("gloo", 100, None, 4, box_rates=[10]) == \
        constants.gloo_bound_mbps(100, 4)


# -- the command lines ------------------------------------------------------------

@pytest.mark.parametrize("args, says", [
    (["bench", "--boxes", "0"], "box counts must be in 1..8"),
    (["bench", "--boxes", "1,9"], "box counts must be in 1..8"),
    (["bench", "--boxes", "2,2"], "each once"),
    (["bench", "--boxes", "two"], "--boxes"),
    (["bench", "--box-rate", "0"], "--box-rate"),
    (["demo", "--boxes", "9"], "--boxes"),
    (["demo", "--box-rate", "-1"], "--box-rate"),
    (["train", "--kill-box", "1"], "--kill-box and --kill-after go together"),
    (["train", "--kill-after", "3"], "--kill-box and --kill-after go together"),
    (["train", "--boxes", "2", "--kill-box", "2", "--kill-after", "3"], "boxes 0..1"),
    (["train", "--kill-box", "0", "--kill-after", "0"], "--kill-after"),
    (["bench", "--ports", "2", "--boxes", "1,2"], "a switch of several ports is one box"),
    (["bench", "--ports", "9"], "--ports"),
    (["demo", "--ports", "0"], "--ports"),
    (["up", "--ports", "9"], "--ports"),
])
def test_bad_box_arguments_fail_before_anything_is_built(args, says):
    r = CliRunner().invoke(lab_cli.main, args)
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output, r.output


def test_bench_boxes_reach_the_run(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(lab_bench, "run_bench", lambda cfg, out: seen.append(cfg))
    r = CliRunner().invoke(lab_cli.main, ["bench", "--boxes", "1,2,3", "--box-rate", "100",
                                          "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert tuple(seen[0].boxes) == (1, 2, 3) and seen[0].box_rate_mbit == 100
    assert CliRunner().invoke(lab_cli.main, ["bench", "--out", str(tmp_path)]).exit_code == 0
    assert tuple(seen[1].boxes) == (1,) and seen[1].box_rate_mbit is None
    r = CliRunner().invoke(lab_cli.main, ["bench", "--ports", "4", "--out", str(tmp_path)])
    assert r.exit_code == 0 and seen[2].ports == 4 and seen[1].ports == 1, r.output


def test_demo_boxes_reach_the_run(monkeypatch):
    from switchml_xdp.bench import lab_demo

    seen = {}
    monkeypatch.setattr(lab_demo, "run_demo", lambda *a, **kw: seen.update(kw))
    r = CliRunner().invoke(lab_cli.main, ["demo", "--boxes", "2", "--box-rate", "50"])
    assert r.exit_code == 0, r.output
    assert seen["boxes"] == 2 and seen["box_rate"] == 50 and seen["ports"] == 1
    r = CliRunner().invoke(lab_cli.main, ["demo", "--ports", "3", "--box-rate", "50"])
    assert r.exit_code == 0 and seen["ports"] == 3, r.output


def test_train_boxes_and_the_kill_reach_the_run(monkeypatch):
    pytest.importorskip("sklearn", reason="swml-lab train needs scikit-learn")
    pytest.importorskip("matplotlib", reason="swml-lab train needs matplotlib")
    from switchml_xdp.lab import train_runs

    seen = {}
    monkeypatch.setattr(train_runs, "run_lab_training",
                        lambda workers, cfg, *a, **kw: seen.update(cfg=cfg, **kw))
    r = CliRunner().invoke(lab_cli.main, ["train", "--boxes", "3", "--box-rate", "100",
                                          "--kill-box", "1", "--kill-after", "4.5"])
    assert r.exit_code == 0, r.output
    assert seen["cfg"].boxes == 3 and seen["box_rate"] == 100 and seen["kill"] == (1, 4.5)
    r = CliRunner().invoke(lab_cli.main, ["train", "--ports", "2"])
    assert r.exit_code == 0 and seen["ports"] == 2, r.output


def test_a_shaped_box_tells_its_ports_rate():
    assert box_runs.capacity_args(100) == ["--capacity", "100M"]
    assert box_runs.capacity_args(2.5) == ["--capacity", "2.5M"]
    assert box_runs.capacity_args(None) == []


# -- the bench's rows, table and plots ----------------------------------------------

def _swml_row(boxes: int, tat: float, bench: lab_bench.Bench) -> dict:
    bench.boxes = boxes
    row = bench._record("swml-afxdp", 4, K, 0.0, None, status="unavailable: (a stand-in)")
    row.update(status="ok", tat_median_s=tat, tat_min_s=tat, tat_max_s=tat, cpu=None,
               counters={}, workers_cpu_pct=0.0, goodput_mbps=S * 8 / tat / 1e6,
               bound_fraction=row["ideal_tat_s"] / tat)
    return row


def _doc(boxes=(1, 2, 4)) -> dict:
    cfg = lab_bench.BenchConfig(workers=(4,), rate_mbit=100, size=S, ks=(K,), losses=(0.0,),
                                systems=("swml-afxdp", "gloo"), boxes=boxes, box_rate_mbit=100)
    bench = lab_bench.Bench(cfg, out=lambda line: None)
    rows = [_swml_row(m, 5.8 / m, bench) for m in boxes]
    gloo = {"system": "gloo", "workers": 4, "k": None, "loss": 0.0, "status": "ok",
            "tat_median_s": 2.2, "tat_min_s": 2.2, "tat_max_s": 2.2, "cpu": None,
            "bound_fraction": 0.96, "goodput_mbps": 61.0, "counters": {}}
    meta = {"command": "test", "started": "now", "duration_s": 1, "size_bytes": S,
            "rate_mbit": 100, "warmup": 1, "iterations": 5, "workers": [4], "losses": [0.0],
            "ks": [K], "systems": ["swml-afxdp", "gloo"], "boxes": list(boxes),
            "box_rate_mbit": 100, "definitions": constants.DEFINITIONS,
            "machine": {"cores": 2, "kernel": "x", "quiet_before": {"loadavg": [0]}}}
    return {"meta": meta, "results": [*rows, gloo]}


def test_each_box_count_is_a_row_with_its_own_bound():
    doc = _doc()
    rows = {r["boxes"]: r for r in doc["results"] if r["system"] != "gloo"}
    for m, r in rows.items():
        assert r["box_rate_mbit"] == 100
        assert r["ideal_tat_s"] == pytest.approx(constants.boxes_bound_s(S, 4, 100, [100] * m, K))
        assert report.find_row(doc["results"], "swml-afxdp", 4, K, 0.0, m) is r
    assert "boxes=2" in report.row_line(rows[2]) and "boxes" not in report.row_line(rows[1])
    assert report.find_row(doc["results"], "swml-afxdp", 4, K, 0.0, 3) is None
    # Gloo uses no box: its one row is the peer of every box count.
    assert report.find_row(doc["results"], "gloo", 4, None, 0.0, 4)["tat_median_s"] == 2.2


def test_the_table_has_a_row_a_box_count_and_gloo_beside_each():
    md = report.markdown(_doc())
    for m, bound_ms in ((1, 5757), (2, 2878), (4, 1439)):
        label = report.boxes_label(m, 100)
        line = next(ln for ln in md.splitlines() if ln.startswith(f"| 4 | {label}, "))
        assert f"bound {bound_ms} ms" in line and "| 2200 ms" in line, line
    assert "| N | boxes | loss |" in md
    assert "swml TAT with 1 box / with more: N=4: 2 boxes 2.00x, 4 boxes 4.00x" in md
    assert "bound_boxes" in md
    # A run of one unshaped box keeps the table it always had.
    one = _doc(boxes=(1,))
    one["meta"]["box_rate_mbit"] = None
    assert "| N | loss |" in report.markdown(one)


def test_a_run_of_several_box_counts_plots_time_against_boxes(tmp_path):
    pytest.importorskip("matplotlib", reason="the bench plots with matplotlib")
    from switchml_xdp.bench.lab_plots import plot_all

    paths = plot_all(_doc(), tmp_path)
    assert paths["tat_vs_boxes"].stat().st_size > 0
    (tmp_path / "one").mkdir()
    assert "tat_vs_boxes" not in plot_all(_doc(boxes=(2,)), tmp_path / "one")


# -- each box's share, as printed --------------------------------------------------------

class _TwoBoxWorker:
    """What allreduce_bench.run sees of a Worker over two boxes: box 1 sends twice box 0's."""

    def __init__(self):
        self.info = SimpleNamespace(rank=0, world=1, k=K, slots=64, lanes=1)
        self.calls = 0

    def allreduce(self, array, op="sum", precision="32"):
        self.calls += 1

    def stats(self):
        boxes = [{"box": f"10.0.0.{b + 1}", "backend": "udp", "capacity_bps": 10**8,
                  "packets_sent": (b + 1) * 100 * self.calls, "retransmissions": b * self.calls}
                 for b in range(2)]
        return {"backend": "udp", "packets_sent": 300 * self.calls, "retransmissions": self.calls,
                "forged": 0, "boxes": boxes}


def test_the_bench_row_carries_each_boxes_part_of_the_timed_calls():
    row = bench_run(_TwoBoxWorker(), 1 << 12, iterations=3, warmup=2, progress=False)
    assert [b["packets_sent"] for b in row["boxes"]] == [300, 600]    # the 3 timed calls only
    assert [b["retransmissions"] for b in row["boxes"]] == [0, 3]
    assert row["boxes"][1] == {"box": "10.0.0.2", "backend": "udp", "capacity_bps": 10**8,
                               "packets_sent": 600, "retransmissions": 3}
    assert json.loads(json.dumps(row))["boxes"] == row["boxes"]       # what --json prints


def test_box_lines_sum_the_ranks_and_give_each_boxes_share():
    rank = [{"box": "10.0.0.1", "backend": "afxdp", "capacity_bps": 10**8, "packets_sent": 100,
             "retransmissions": 1},
            {"box": "10.0.0.2", "backend": "udp", "capacity_bps": None, "packets_sent": 300,
             "retransmissions": 0}]
    lines = box_runs.box_lines([rank, rank, None], "all ranks' timed calls")
    assert lines[0] == "per box, all ranks' timed calls:"
    assert "10.0.0.1" in lines[1] and "capacity 100 Mbit/s: 200 packets (25.0%), 2 retransmissions" \
        in lines[1]
    assert "capacity not told: 600 packets (75.0%), 0 retransmissions" in lines[2]
    assert box_runs.box_lines([None, None], "x") == []    # one box: nothing to split


# -- a lost box -----------------------------------------------------------------------------

def test_a_ranks_warnings_are_printed_with_their_time(capsys):
    shown = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *rest: shown.append(str(message))
        lost_box.report_warnings(3)
        warnings.warn("box 10.0.0.2 lost: the job goes on over 10.0.0.1", RuntimeWarning, stacklevel=1)
    out = capsys.readouterr()
    records = lost_box.warning_records(out.out + "RESULT {}\n")
    assert len(records) == 1 and records[0]["rank"] == 3
    assert records[0]["category"] == "RuntimeWarning" and "10.0.0.2 lost" in records[0]["message"]
    assert shown and "10.0.0.2 lost" in shown[0]        # still shown as a warning too


class _FakeLab:
    def __init__(self):
        self.switches = [SimpleNamespace(name=n, ip=f"10.0.0.{i + 1}", iface=f"x-{n}")
                         for i, n in enumerate(("sw", "sw1"))]
        self.ran = []

    def run(self, host, argv):
        self.ran.append((host.name, argv))


def test_the_killer_takes_the_boxes_link_down_kills_its_daemon_and_times_the_warnings():
    lab, killed, said = _FakeLab(), threading.Event(), []
    killer = lost_box.BoxKiller(lab, 1, 0.05, killed.set, said.append).start()
    assert killed.wait(5)
    killer.cancel()
    assert lab.ran == [("sw1", ["ip", "link", "set", "dev", "x-sw1", "down"])]
    assert said and said[0].startswith("  box sw1 (10.0.0.2) powered off")
    t = killer.killed_at
    records = [{"rank": 0, "t": t - 1, "category": "UserWarning", "message": "before"},
               {"rank": 1, "t": t + 1.5, "category": "RuntimeWarning", "message": "lost"},
               {"rank": 0, "t": t + 0.4, "category": "RuntimeWarning", "message": "lost"},
               {"rank": 1, "t": t + 3.0, "category": "RuntimeWarning", "message": "again"}]
    rep = killer.report(records, ranks=3)
    assert rep["warned_after_s"] == {0: 0.4, 1: 1.5, 2: None}
    lines = lost_box.report_lines({**rep, "epoch": 7})
    assert "rank 0 after 0.40 s, rank 1 after 1.50 s, rank 2 never" in lines[0]
    assert "into the swml training (epoch 7); the ranks warned" in lines[0]
    assert [ln.split(": ", 2)[-1] for ln in lines[1:]] == ["lost", "again"]


def test_a_kill_that_never_came_says_so():
    lab = _FakeLab()
    killer = lost_box.BoxKiller(lab, 0, 60, lambda: None, lambda line: None).start()
    killer.cancel()
    assert lab.ran == []
    assert "was not killed" in lost_box.report_lines(killer.report([], 2))[0]
    with pytest.raises(ValueError, match="boxes 0..1"):
        lost_box.BoxKiller(lab, 2, 1, lambda: None)



def test_the_kill_counts_from_when_the_training_began():
    lab, killed, began = _FakeLab(), threading.Event(), threading.Event()
    killer = lost_box.BoxKiller(lab, 0, 0.05, killed.set, lambda line: None,
                                began=began.is_set).start()
    assert not killed.wait(0.5)          # its processes may take long to start training
    began.set()
    assert killed.wait(5)
    killer.cancel()
    assert killer.report([], 1)["after_s"] == pytest.approx(0.05, abs=0.2)
