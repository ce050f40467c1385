"""`swml-lab bench --jobs SPEC` before anything is built: the jobs' syntax
and bounds, the share policies it takes, the bounds it prints, and the
options that do not go with it refused in one line
(switchml_xdp/bench/jobs_bench.py; the run itself:
tests/lab/test_lab_jobs_bench.py)."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from switchml_xdp.bench.jobs_bench import (
    JobsConfig,
    JobSpec,
    alone_bound_s,
    ideal_completions_s,
    makespan_bound_s,
    parse_jobs,
    parse_shares,
)
from switchml_xdp.cli import lab as lab_cli


def test_a_spec_is_one_workers_x_size_a_job():
    assert parse_jobs("2x2MiB,2x4MiB,2x8MiB,2x16MiB") == [
        JobSpec(2, 2 << 20), JobSpec(2, 4 << 20), JobSpec(2, 8 << 20), JobSpec(2, 16 << 20)]
    assert parse_jobs(" 3X64KiB , 2*1024 ") == [JobSpec(3, 64 << 10), JobSpec(2, 1024)]
    assert [j.label for j in parse_jobs("2x2MiB,4x512KiB")] == ["2x2MiB", "4x0.5MiB"]


@pytest.mark.parametrize("spec, says", [
    ("", "NxSIZE, comma-separated"), ("2x2MiB,,2x4MiB", "NxSIZE, comma-separated"),
    ("2MiB", "a job is NxSIZE"), ("x2MiB", "a job is NxSIZE"), ("2x", "a job is NxSIZE"),
    ("-2x2MiB", "a job is NxSIZE"), ("1x2MiB", "2..64 workers"), ("65x1MiB", "2..64 workers"),
    ("2x2XiB", "not a size"), ("2x2", "smaller than one element"), ("2x2GiB", "at most 1 GiB"),
    (",".join(["2x1MiB"] * 17), "at most 16 jobs"), ("64x1MiB,64x1MiB,64x1MiB,64x1MiB", "at most 244"),
])
def test_a_bad_spec_is_a_one_line_error(spec, says):
    with pytest.raises(ValueError, match=says) as e:
        parse_jobs(spec)
    assert "\n" not in str(e.value)


def test_shares_are_the_policies_the_box_offers_each_once():
    assert parse_shares("none") == ("none",) and parse_shares(" None ") == ("none",)
    for bad in ("fastest", "none,none", ""):
        with pytest.raises(ValueError, match="--share takes none"):
            parse_shares(bad)


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
    # a job whose workers cannot fill the box's link alone: no ideal figures
    assert ideal_completions_s(JobsConfig(cfg.jobs, rate_mbit=100, box_rate_mbit=300)) is None


@pytest.mark.parametrize("args, hint, says", [
    (["--jobs", "2x"], "--jobs", "a job is NxSIZE"),
    (["--jobs", "2x1MiB", "--share", "srpt-ish"], "--share", "--share takes none"),
    (["--jobs", "2x1MiB", "-n", "4"], "--workers", "not with --jobs"),
    (["--jobs", "2x1MiB", "--size", "4MiB"], "--size", "not with --jobs"),
    (["--jobs", "2x1MiB", "--loss", "1%"], "--loss", "not with --jobs"),
    (["--jobs", "2x1MiB", "--racks", "2"], "--racks", "not with --jobs"),
    (["--share", "none"], "--share", "only with --jobs"),
])
def test_the_cli_refuses_in_one_line_before_building(args, hint, says, tmp_path):
    r = CliRunner().invoke(lab_cli.main, ["bench", "--out", str(tmp_path / "out"), *args])
    assert r.exit_code == 2, r.output
    assert says in r.output and hint in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "out").exists()
