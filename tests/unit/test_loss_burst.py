"""The lab's bursty loss, without a lab: the Gilbert-Elliott model's
parameters from a mean rate and a mean burst length (switchml_xdp/lab/burst.py),
what a Lab's loss arguments accept (lab/loss.py lab_args), and the command
line's --burst (cli/lab_options.py)."""
from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from switchml_xdp.cli.lab import main as lab_cli
from switchml_xdp.cli.lab_options import link_loss, loss_text
from switchml_xdp.lab import LabError
from switchml_xdp.lab.burst import BurstModel, mean_length, model, resolve
from switchml_xdp.lab.loss import burst_state, lab_args
from switchml_xdp.lab.loss_values import LossError


@pytest.mark.parametrize(("loss", "mean_len"), [(0.02, 2), (0.05, 4), (0.10, 8), (0.5, 1), (0.01, 100)])
def test_mean_rate_and_length_give_p_and_r(loss, mean_len):
    m = BurstModel.of(loss, mean_len)
    assert m.r == pytest.approx(1 / mean_len) and m.h == 1.0
    assert m.p == pytest.approx(loss * m.r / (1 - loss))
    assert m.mean_loss() == pytest.approx(loss) and m.bad_fraction == pytest.approx(loss)
    assert m.mean_stay == pytest.approx(mean_len)


def test_percentages_and_text_are_read():
    assert BurstModel.of("5%", "4") == BurstModel.of(0.05, 4.0)


def test_a_lossy_good_state_and_a_partial_bad_one_add_up():
    m = BurstModel(p=0.02, r=0.2, h=0.5)
    pi_b = 0.02 / 0.22
    assert m.mean_loss(0.01) == pytest.approx((1 - pi_b) * 0.01 + pi_b * 0.5)
    d = m.describe(0.01)
    assert d["mean_loss"] == pytest.approx(m.mean_loss(0.01)) and d["mean_stay"] == 5.0
    assert "bursts of 5 frames" in m.label(0.01) and "h 0.5" in m.label(0.01)


def test_no_burst_ever_begins_with_p_zero():
    m = BurstModel(p=0.0, r=0.5)
    assert m.bad_fraction == 0.0 and m.mean_loss(0.03) == pytest.approx(0.03)


@pytest.mark.parametrize(("loss", "mean_len", "says"), [
    (0.6, 1, "at most 50%"), (0.95, 4, "at most 80%"), (1.0, 4, "at most"),
    (0.05, 0.5, "1.."), (0.05, "x", ">= 1"), (0.05, "nan", "1.."), (0.05, math.inf, "1.."),
    (1.5, 4, "0..1"), ("lots", 4, "percentage"),
])
def test_impossible_or_malformed_bursts_are_one_line_errors(loss, mean_len, says):
    with pytest.raises(LossError, match=says) as e:
        BurstModel.of(loss, mean_len)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("fields", [{"p": 0.1, "r": 0}, {"p": 1.5, "r": 0.5},
                                    {"p": 0.1, "r": 0.5, "h": 2}, {"p": -0.1, "r": 0.5}])
def test_a_model_out_of_range_is_refused(fields):
    with pytest.raises(LossError):
        BurstModel(**fields)


def test_mean_length_reads_numbers_of_frames():
    assert mean_length("2.5") == 2.5 and mean_length(1) == 1.0
    for bad in ("0", "0.99", "-4", "", None, "1e9"):
        with pytest.raises(LossError):
            mean_length(bad)


def test_resolve_says_which_state_the_loss_belongs_to():
    m = BurstModel(p=0.01, r=0.25, h=0.5)
    assert resolve(0.05, None) == (0.05, None)
    assert resolve("5%", 4) == (0.0, BurstModel.of(0.05, 4))      # the mean rate, in bursts
    assert resolve(0, 4) == (0.0, None)                           # nothing to spread
    assert resolve(0.01, m) == (0.01, m)                          # the good state's
    assert resolve(0.01, {"p": 0.01, "r": 0.25, "h": 0.5}) == (0.01, m)
    with pytest.raises(LossError):
        model({"p": 0.01})


def test_a_labs_loss_arguments_round_trip_through_its_state_file():
    m = BurstModel(p=0.01, r=0.25)
    assert lab_args(0.05, None, None, "4") == (0.05, None, None, 4.0)
    assert lab_args(None, None, None, m) == (None, None, None, m)
    assert lab_args(None, None, None, burst_state(m))[3] == m
    assert burst_state(4.0) == 4.0 and burst_state(None) is None
    for args in ((None, None, None, 4), (0, None, None, 4), (0.6, None, None, 1),
                 (0.05, None, None, 0.5), (0.05, None, 70000, None)):
        with pytest.raises(LabError):
            lab_args(*args)


def test_what_the_command_line_prints():
    assert loss_text(0.05, None) == "5%" and loss_text(0.05, 4.0) == "5% in bursts of 4 frames"
    assert link_loss({"loss": 0.02, "dup": 0, "burst": None}) == "2%"
    assert link_loss({"loss": 0.0, "dup": 0, "burst": BurstModel.of(0.05, 4)}) == "5%b4"


@pytest.mark.parametrize(("args", "says"), [
    (["--burst", "4"], "needs --loss"),
    (["--loss", "0", "--burst", "4"], "needs --loss"),
    (["--loss", "5%", "--burst", "0.5"], "1.."),
    (["--loss", "5%", "--burst", "four"], ">= 1"),
    (["--loss", "60%", "--burst", "1"], "at most 50%"),
])
def test_up_refuses_bad_bursts_before_building_anything(args, says):
    r = CliRunner().invoke(lab_cli, ["up", "-n", "1", *args])
    assert r.exit_code != 0 and says in r.output, r.output
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)


def test_bench_takes_burst_for_its_sweep(monkeypatch, tmp_path):
    from switchml_xdp.bench import lab_bench

    seen = []
    monkeypatch.setattr(lab_bench, "run_bench", lambda cfg, out: seen.append(cfg))
    r = CliRunner().invoke(lab_cli, ["bench", "-n", "2", "--loss", "0,5%,10%", "--burst", "4",
                                     "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert seen[-1].burst == 4.0 and seen[-1].losses == (0.0, 0.05, 0.10)
    for args, says in ((["--loss", "0", "--burst", "4"], "needs --loss"),
                       (["--loss", "0,10%,60%", "--burst", "1"], "at most 50%"),
                       (["--racks", "2", "--burst", "4"], "not with")):
        r = CliRunner().invoke(lab_cli, ["bench", *args, "--out", str(tmp_path)])
        assert r.exit_code != 0 and says in r.output, r.output


def test_bench_rows_meta_and_heading_record_the_bursts():
    import time

    from switchml_xdp.bench import lab_bench, report

    cfg = lab_bench.BenchConfig(workers=(2,), losses=(0.0, 0.05), ks=(64,), burst=4.0,
                                systems=("swml-udp", "gloo"))
    bench = lab_bench.Bench(cfg, out=lambda line: None)
    lossy = bench._record("swml-udp", 2, 64, 0.05, None, status="unavailable: (a stand-in)")
    assert lossy["burst"]["mean_loss"] == pytest.approx(0.05) and lossy["burst"]["mean_stay"] == 4
    assert bench._record("swml-udp", 2, 64, 0.0, None, status="unavailable: -")["burst"] is None
    assert "burst" not in bench._record("gloo", 2, None, 0.05, None, status="unavailable: -")
    meta = bench._meta(time.time(), {"loadavg": [0, 0, 0]})
    assert meta["burst"]["mean_len"] == 4.0 and list(meta["burst"]["by_loss"]) == ["0.05"]
    assert meta["burst"]["by_loss"]["0.05"]["r"] == 0.25 and "random" in meta["burst"]["tcp"]
    meta["started"] = "now"
    md = report.markdown({"meta": meta, "results": bench.results})
    assert "Loss in bursts: " in md and "last 4 frames on average" in md
    assert lab_bench.BenchConfig().burst is None
    assert "Loss in bursts" not in report.markdown({"meta": {**meta, "burst": None},
                                                    "results": bench.results})
