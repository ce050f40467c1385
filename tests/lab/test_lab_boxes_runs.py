"""`swml-lab demo --boxes`, `bench --boxes` and `train --boxes` end to end,
small: the job goes over every box (each box carries its part), each box's
share is printed, the bench has a row a box count with its own bound and
Gloo once beside them, and a box powered off in the middle of `train` is
timed against every rank's warning (docs/scale-out.md). Their options and
tables alone: tests/unit/test_lab_boxes_runs.py."""
from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from requires import NO_LAB

if NO_LAB:
    pytest.skip(NO_LAB, allow_module_level=True)

from switchml_xdp.bench import lab_bench
from switchml_xdp.bench.constants import bound_mbps
from switchml_xdp.cli import lab as lab_cli

BOX_RATE = 200.0


def _torch_missing() -> str | None:
    try:
        import torch  # noqa: F401 - imported only to learn whether it is there
    except ImportError as e:
        return f"torch is not installed ({e})"
    return None


def test_demo_over_two_boxes_splits_the_job_and_prints_each_boxes_share():
    r = CliRunner().invoke(lab_cli.main, [
        "demo", "-n", "2", "--boxes", "2", "--box-rate", f"{BOX_RATE:g}", "--size", "1MiB",
        "--iterations", "2", "--warmup", "1", "--backend", "udp"])
    assert r.exit_code == 0, r.output
    assert "boxes 10.0.0.1,10.0.0.2 + 2 workers" in r.output, r.output
    assert "per box, all ranks' timed calls:" in r.output, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("  box 10.0.0.")]
    assert len(lines) == 2, r.output
    for ln in lines:
        # Each box told the rate its port is shaped to, and carried about half (equal capacities).
        assert f"capacity {BOX_RATE:g} Mbit/s" in ln, ln
        share = float(re.search(r"\(([\d.]+)%\)", ln)[1])
        assert 40 <= share <= 60, ln
    table = r.output.split("per box")[0]
    assert table.count(" ok") >= 2, table       # every result checked, both ranks


def test_bench_over_one_and_two_boxes_has_a_row_each_with_its_bound(tmp_path):
    missing = _torch_missing()
    systems = ["swml-udp"] + ([] if missing else ["gloo"])
    lines: list[str] = []
    cfg = lab_bench.BenchConfig(workers=(2,), rate_mbit=100, box_rate_mbit=100, boxes=(1, 2),
                                size=256 << 10, iterations=1, warmup=0, losses=(0.0,), ks=(64,),
                                systems=systems, out_dir=str(tmp_path), command="pytest boxes")
    doc = lab_bench.run_bench(cfg, out=lines.append)
    saved = json.loads((tmp_path / "lab_bench.json").read_text())
    assert saved["meta"]["boxes"] == [1, 2] and saved["meta"]["box_rate_mbit"] == 100
    swml = {r["boxes"]: r for r in doc["results"] if r["system"] == "swml-udp"}
    assert set(swml) == {1, 2}
    for m, r in swml.items():
        assert r["status"] == "ok", r
        assert r["rel_err"] < 1e-6, r                  # the exact sum, over any boxes
        assert r["bound_mbps"] == pytest.approx(bound_mbps("swml-udp", 100, 64, 2,
                                                           box_rates=[100] * m), rel=1e-3)
    # Two boxes of 100 Mbit/s take 2 x S at the workers' rate: twice one box's bound.
    assert swml[2]["bound_mbps"] == pytest.approx(2 * swml[1]["bound_mbps"], rel=1e-3)
    # The job went over both boxes, each carrying its part, and over one box only once.
    c2, c1 = swml[2]["counters"], swml[1]["counters"]
    assert c2["box0_packets_sent"] > 0 and c2["box1_packets_sent"] > 0, c2
    assert "box0_packets_sent" not in c1, c1
    md = (tmp_path / "lab_bench.md").read_text()
    assert "| 2 | 1 box of 100 Mbit/s, bound " in md and "| 2 | 2 boxes of 100 Mbit/s, bound " in md
    assert (tmp_path / "tat_vs_boxes.png").stat().st_size > 0
    gloo = [r for r in doc["results"] if r["system"] == "gloo"]
    if missing:
        pytest.skip(f"Gloo part skipped: {missing}")
    assert len(gloo) == 1 and gloo[0]["status"] == "ok", gloo     # once: the peer of every row


def _train(tmp_path, epochs: int, kill=None):
    pytest.importorskip("sklearn", reason="the training example needs scikit-learn (python3-sklearn)")
    pytest.importorskip("matplotlib", reason="the training example plots with matplotlib")
    if _torch_missing():
        pytest.skip(_torch_missing())
    from switchml_xdp.lab.train_example import TrainConfig
    from switchml_xdp.lab.train_runs import run_lab_training

    said: list[str] = []
    res = run_lab_training(2, TrainConfig(epochs=epochs, boxes=2), "udp", str(tmp_path / "c.png"),
                           out=said.append, box_rate=BOX_RATE, kill=kill)
    return res, "\n".join(str(s) for s in said)


def test_train_over_two_boxes_prints_each_boxes_share(tmp_path):
    res, said = _train(tmp_path, epochs=2)
    swml, gloo = res["swml"], res["gloo"]
    boxes = swml["worker"]["boxes"]
    assert [b["box"] for b in boxes] == ["10.0.0.1", "10.0.0.2"]
    assert all(b["packets_sent"] > 0 and b["capacity_bps"] == BOX_RATE * 1e6 for b in boxes), boxes
    assert swml["buckets"] > 0 and swml["fallback_buckets"] == 0      # through the switches
    assert swml["param_spread"] == 0.0
    assert abs(swml["test_acc"][-1] - gloo["test_acc"][-1]) <= 1.0
    assert "per box, swml run, rank 0's calls:" in said and "  box 10.0.0.2 " in said, said


def test_train_outlives_a_box_powered_off_mid_run_and_every_rank_warns_within_2s(tmp_path):
    try:
        from switchml_xdp.torch import box_failover  # noqa: F401 - only whether it is there
    except ImportError:
        pytest.skip("the swml group does not carry on without a lost box here "
                    "(switchml_xdp/torch/box_failover.py)")
    # 12 epochs: CI saw 6 epochs of 0.2 s each, and the kill 1 s in fell in the last.
    res, said = _train(tmp_path, epochs=12, kill=(1, 1.0))
    lost = res["swml"]["lost_box"]
    assert lost["killed"] and lost["box"] == "10.0.0.2", said
    ends = res["swml"]["epoch_end_t"]
    assert ends[0] < lost["killed_at"] < ends[-1], "the box was not lost mid-training"
    assert 1 < lost["epoch"] < len(ends), lost
    for rank, after in lost["warned_after_s"].items():
        assert after is not None and after <= 2.0, (rank, lost)
    assert res["swml"]["param_spread"] == 0.0
    assert abs(res["swml"]["test_acc"][-1] - res["gloo"]["test_acc"][-1]) <= 1.0, said
    assert "the ranks warned: rank 0 after" in said, said
