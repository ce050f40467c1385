"""`swml-lab bench --jobs SPEC` before anything is built: the jobs' syntax
(weights too) and bounds, the share policies it takes, the weights set
mid-run, the bounds and ideal completions it prints, and the options that
do not go with it refused in one line (switchml_xdp/bench/jobs_spec.py);
the targets' arithmetic and the weighted run's rate figures:
tests/unit/test_jobs_bench_targets.py; the run itself:
tests/lab/test_lab_jobs_bench.py."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from switchml_xdp.bench import jobs_spec
from switchml_xdp.bench.jobs_spec import (
    SHARES,
    JobsConfig,
    JobSpec,
    alone_bound_s,
    ideal_completions_s,
    makespan_bound_s,
    parse_jobs,
    parse_reweight,
    parse_shares,
    reweight_at_s,
)
from switchml_xdp.cli import lab as lab_cli


def test_a_spec_is_one_workers_x_size_a_job():
    assert parse_jobs("2x2MiB,2x4MiB,2x8MiB,2x16MiB") == [
        JobSpec(2, 2 << 20), JobSpec(2, 4 << 20), JobSpec(2, 8 << 20), JobSpec(2, 16 << 20)]
    assert parse_jobs(" 3X64KiB , 2*1024 ") == [JobSpec(3, 64 << 10), JobSpec(2, 1024)]
    assert [j.label for j in parse_jobs("2x2MiB,4x512KiB")] == ["2x2MiB", "4x0.5MiB"]


def test_a_job_may_ask_for_a_weight():
    assert parse_jobs("2x64MiB@3, 2x64MiB@1,2x1MiB @ 8,2x1MiB@0.5") == [
        JobSpec(2, 64 << 20, 3), JobSpec(2, 64 << 20, 1), JobSpec(2, 1 << 20, 8),
        JobSpec(2, 1 << 20, 0.5)]
    assert [j.label for j in parse_jobs("2x64MiB@3,2x64MiB@1,2x1MiB@1.5")] == [
        "2x64MiB@3", "2x64MiB", "2x1MiB@1.5"]
    assert parse_jobs("2x1MiB")[0].weight == 1


@pytest.mark.parametrize("spec, says", [
    ("", "WEIGHT\\], comma-separated"), ("2x2MiB,,2x4MiB", "WEIGHT\\], comma-separated"),
    ("2MiB", "a job is NxSIZE"), ("x2MiB", "a job is NxSIZE"), ("2x", "a job is NxSIZE"),
    ("2x1MiB@", "a weight is a number above zero, at most 8"), ("2x1MiB@0", "above zero"),
    ("2x1MiB@-1", "above zero"), ("2x1MiB@nan", "above zero"), ("2x1MiB@inf", "above zero"),
    ("2x1MiB@nine", "above zero"), ("2x1MiB@8.5", "at most 8 .the switch's --max-weight"),
    ("2x1MiB@3@1", "above zero"), ("2x@3", "a job is NxSIZE"),
    ("-2x2MiB", "a job is NxSIZE"), ("1x2MiB", "2..64 workers"), ("65x1MiB", "2..64 workers"),
    ("2x2XiB", "not a size"), ("2x2", "smaller than one element"), ("2x2GiB", "at most 1 GiB"),
    (",".join(["2x1MiB"] * 17), "at most 16 jobs"), ("64x1MiB,64x1MiB,64x1MiB,64x1MiB", "at most 244"),
])
def test_a_bad_spec_is_a_one_line_error(spec, says):
    with pytest.raises(ValueError, match=says) as e:
        parse_jobs(spec)
    assert "\n" not in str(e.value)


def test_shares_are_the_policies_the_box_offers_each_once():
    assert SHARES == ("none", "fair", "weighted", "srpt")
    assert parse_shares(None) == SHARES
    assert parse_shares("none") == ("none",) and parse_shares(" None ") == ("none",)
    assert parse_shares("srpt,fair") == ("srpt", "fair")
    for bad in ("fastest", "none,none", "", "fair,,srpt"):
        with pytest.raises(ValueError, match="--share takes none, fair, weighted, srpt, each once"):
            parse_shares(bad)


def test_reweight_is_one_weight_a_job_under_the_weighted_policy():
    jobs = parse_jobs("2x64MiB@3,2x64MiB@1")
    assert parse_reweight("1,1", jobs, ("weighted",)) == (1, 1)
    assert parse_reweight(" 1 , 2.5", jobs, SHARES) == (1, 2.5)
    for text, shares, says in [
        ("1,1", ("none", "srpt"), "needs the weighted policy"), ("1", SHARES, "one weight a job .2."),
        ("1,1,1", SHARES, "one weight a job"), ("0,1", SHARES, "a weight is a number above zero"),
        ("1,x", SHARES, "a weight is a number above zero"), ("3,1", SHARES, "the weights the jobs already"),
    ]:
        with pytest.raises(ValueError, match=says) as e:
            parse_reweight(text, jobs, shares)
        assert "\n" not in str(e.value)


def test_the_makespan_bound_is_every_jobs_bytes_through_the_box_link():
    cfg = JobsConfig(parse_jobs("2x2MiB,2x4MiB"), rate_mbit=100, iterations=10)
    headers = (74 + 4 * 256) / (4 * 256)      # 74 bytes of headers a packet of 256 float32s
    assert makespan_bound_s(cfg) == pytest.approx(2 * 6 * 2**20 * 10 * 8 * headers / 100e6)
    # a job alone: its two workers' tensors into the box's link, the bottleneck
    assert alone_bound_s(cfg, cfg.jobs[1]) == pytest.approx(2 * 4 * 2**20 * 10 * 8 * headers / 100e6)
    faster_box = JobsConfig(cfg.jobs, rate_mbit=100, box_rate_mbit=400, iterations=10)
    assert alone_bound_s(faster_box, cfg.jobs[1]) == pytest.approx(4 * 2**20 * 10 * 8 * headers / 100e6)


def test_the_ideal_boxes_fair_and_shortest_first_completions():
    cfg = JobsConfig(parse_jobs("2x8MiB,2x2MiB,2x4MiB"), rate_mbit=100, iterations=10)
    unit = makespan_bound_s(JobsConfig(parse_jobs("2x2MiB"), rate_mbit=100, iterations=10))
    ideal = ideal_completions_s(cfg)
    # fair: the three share the link until the smallest is done (3 units each), then two ...
    assert ideal["fair"] == pytest.approx([7 * unit, 3 * unit, 5 * unit])
    # shortest first: one after the other, the smallest first; the last is the same
    assert ideal["srpt"] == pytest.approx([7 * unit, unit, 3 * unit])
    assert max(ideal["srpt"]) == pytest.approx(makespan_bound_s(cfg))
    assert "weighted" not in ideal      # every weight 1: weighted is fair
    # a job whose workers cannot fill the box's link alone: no ideal figures
    assert ideal_completions_s(JobsConfig(cfg.jobs, rate_mbit=100, box_rate_mbit=300)) is None


def test_the_ideal_weighted_box_shares_by_weight_and_the_change_comes_half_way():
    cfg = JobsConfig(parse_jobs("2x8MiB@3,2x8MiB@1"), rate_mbit=100, iterations=10)
    unit = makespan_bound_s(JobsConfig(parse_jobs("2x8MiB"), rate_mbit=100, iterations=10))
    ideal = ideal_completions_s(cfg)
    # 3:1 until the first is done at 4/3 of its link time, then the second alone
    assert ideal["weighted"] == pytest.approx([4 / 3 * unit, 2 * unit])
    assert ideal["fair"] == pytest.approx([2 * unit, 2 * unit])
    assert reweight_at_s(cfg) == pytest.approx(2 / 3 * unit)
    three = ideal_completions_s(JobsConfig(parse_jobs("2x2MiB@2,2x2MiB@1,2x4MiB@1"), iterations=10))
    small = makespan_bound_s(JobsConfig(parse_jobs("2x2MiB"), iterations=10))
    # shares 2:1:1 -> the first done at 2 units; then the other two 1:1 with 0.5 and 1.5 units left
    assert three["weighted"] == pytest.approx([2 * small, 3 * small, 4 * small])
    slow = JobsConfig(cfg.jobs, rate_mbit=100, box_rate_mbit=300, iterations=10)
    assert reweight_at_s(slow) == pytest.approx(alone_bound_s(slow, cfg.jobs[0]) / 2)


@pytest.mark.parametrize("args, hint, says", [
    (["--jobs", "2x"], "--jobs", "a job is NxSIZE"),
    (["--jobs", "2x1MiB", "--share", "srpt-ish"], "--share", "--share takes none"),
    (["--jobs", "2x1MiB@0"], "--jobs", "a weight is a number above zero"),
    (["--jobs", "2x1MiB,2x1MiB", "--share", "none", "--reweight", "1,2"], "--reweight",
     "needs the weighted policy"),
    (["--jobs", "2x1MiB,2x1MiB", "--reweight", "2"], "--reweight", "one weight a job"),
    (["--jobs", "2x1MiB,2x1MiB", "--reweight", "9,1"], "--reweight", "at most 8"),
    (["--jobs", "2x1MiB", "-n", "4"], "--workers", "not with --jobs"),
    (["--jobs", "2x1MiB", "--size", "4MiB"], "--size", "not with --jobs"),
    (["--jobs", "2x1MiB", "--loss", "1%"], "--loss", "not with --jobs"),
    (["--jobs", "2x1MiB", "--racks", "2"], "--racks", "not with --jobs"),
    (["--share", "none"], "--share", "only with --jobs"),
    (["--reweight", "1,1"], "--reweight", "only with --jobs"),
    (["--no-gloo"], "--no-gloo", "only with --jobs"),
])
def test_the_cli_refuses_in_one_line_before_building(args, hint, says, tmp_path):
    r = CliRunner().invoke(lab_cli.main, ["bench", "--out", str(tmp_path / "out"), *args])
    assert r.exit_code == 2, r.output
    assert says in r.output and hint in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "out").exists()


@pytest.mark.parametrize("share", [None, "fair", "none,srpt"])
def test_policies_on_a_switch_without_them_are_refused_in_one_line(share, tmp_path, monkeypatch):
    monkeypatch.setattr(jobs_spec, "switch_lacks_shares", lambda: "this swml-switch has no --share")
    args = ["bench", "--out", str(tmp_path / "out"), "--jobs", "2x1MiB"]
    r = CliRunner().invoke(lab_cli.main, args + (["--share", share] if share else []))
    assert r.exit_code == 2, r.output
    assert "this swml-switch has no --share" in r.output and "--share none runs" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "out").exists()


def test_whether_the_switch_offers_the_policies_is_read_from_its_up_command():
    from switchml_xdp.cli import switch as switch_cli

    has = any(p.name == "share" for p in switch_cli.up.params)
    assert (jobs_spec.switch_lacks_shares() is None) == has


def test_the_cli_hands_the_bench_what_it_was_told(tmp_path, monkeypatch):
    from switchml_xdp.cli import lab_bench_jobs

    got = []
    monkeypatch.setattr(jobs_spec, "switch_lacks_shares", lambda: None)
    monkeypatch.setattr(lab_bench_jobs, "run_rows", lambda run, cfg: got.append(cfg))
    r = CliRunner().invoke(lab_cli.main, [
        "bench", "--out", str(tmp_path / "out"), "--jobs", "2x1MiB@3,2x1MiB", "--share", "weighted",
        "--reweight", "1,1", "--no-gloo", "--rate", "40", "--iterations", "2"])
    assert r.exit_code == 0, r.output
    [cfg] = got
    assert cfg.jobs == [JobSpec(2, 1 << 20, 3), JobSpec(2, 1 << 20, 1)] and cfg.shares == ("weighted",)
    assert (cfg.reweight, cfg.gloo, cfg.rate_mbit, cfg.iterations) == ((1, 1), False, 40, 2)
    assert cfg.json_path == str(tmp_path / "out" / "jobs_bench.json")
    r = CliRunner().invoke(lab_cli.main, ["bench", "--out", str(tmp_path / "out2"), "--jobs", "2x1MiB"])
    assert r.exit_code == 0 and got[1].shares == SHARES and got[1].gloo and got[1].iterations == 10
