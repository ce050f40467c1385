"""`swml-lab bench --jobs` on a tiny mix (needs root; switchml_xdp/bench/jobs_bench.py):
two jobs of two workers through one box whose link is the bottleneck, and
the same jobs as Gloo rings: every row printed, the JSON has them, every
result exact, the box's port counted at least every job's bytes; and, on a
switch with share policies, the weighted policy: the weights asked for at
join and the one set mid-run reach the box, its rates are sampled, and the
targets are printed. The spec's syntax and bounds:
tests/unit/test_jobs_bench_spec.py; the targets' arithmetic:
tests/unit/test_jobs_bench_targets.py."""
from __future__ import annotations

import json

import pytest

from requires import NO_LAB

if NO_LAB:
    pytest.skip(f"lab tests: {NO_LAB}", allow_module_level=True)

from switchml_xdp.bench.jobs_bench import _torch_missing, run_jobs_bench
from switchml_xdp.bench.jobs_spec import JobsConfig, parse_jobs, switch_lacks_shares


def test_a_tiny_mix_prints_each_jobs_completion_and_the_box_links_busy_share(tmp_path):
    lines = []
    cfg = JobsConfig(parse_jobs("2x256KiB,2x512KiB"), rate_mbit=100, iterations=2, shares=("none",),
                     json_path=str(tmp_path / "jobs.json"), png_path=str(tmp_path / "jobs.png"))
    doc = run_jobs_bench(cfg, out=lines.append)
    text = "\n".join(lines)
    gloo = not _torch_missing()
    [policy] = doc["policies"]
    assert policy["share"] == "none" and len(policy["jobs"]) == 2, doc
    for i, job in enumerate(policy["jobs"]):
        assert 0 < job["completion_s"] <= policy["last_s"] and job["rel_err"] < 1e-6, job
        assert f"job {i} {cfg.jobs[i].label}" in text, text
    assert policy["last_s"] == max(j["completion_s"] for j in policy["jobs"])
    assert policy["average_s"] == pytest.approx(sum(j["completion_s"] for j in policy["jobs"]) / 2)
    data = sum(j.workers * j.size for j in cfg.jobs) * cfg.iterations
    assert policy["box_bytes"] >= data and 0 < policy["box_busy"] <= 1.1, policy
    for row in ("share none", "average", "last", "box link busy"):
        assert row in text, text
    if gloo:
        assert len(doc["gloo"]["jobs"]) == 2 and "swml/gloo" in text, text
        assert all(0 < j["completion_s"] and j["rel_err"] < 1e-6 for j in doc["gloo"]["jobs"])
    else:
        assert doc["gloo"] is None and "gloo rings: not run (torch is not installed" in text
    assert json.loads((tmp_path / "jobs.json").read_text()) == json.loads(json.dumps(doc))
    assert "  targets (set for 2x2MiB,2x4MiB,2x8MiB,2x16MiB, 10 iterations" in text, text
    assert "not measured: srpt against fair" in text, text


@pytest.mark.skipif(switch_lacks_shares() is not None, reason=f"{switch_lacks_shares()}")
def test_weighted_weights_reach_the_box_at_join_and_mid_run(tmp_path):
    """Two jobs asking for 3 and 1 at join, set to 1:1 mid-run: the box's
    share objects say so before and after the change."""
    lines = []
    cfg = JobsConfig(parse_jobs("2x1MiB@3,2x1MiB@1"), rate_mbit=20, iterations=3,
                     shares=("weighted",), gloo=False, reweight=(1, 1),
                     json_path=str(tmp_path / "jobs.json"), png_path=str(tmp_path / "jobs.png"))
    doc = run_jobs_bench(cfg, out=lines.append)
    text = "\n".join(lines)
    [policy] = doc["policies"]
    rates = policy["rates"]
    assert rates["error"] is None and not rates["refused"], rates
    change, samples = rates["change_s"], rates["samples"]
    assert 0 < change < policy["jobs"][0]["completion_s"], (change, policy)
    weights = [[(s["share"][j] or {}).get("weight") for j in (0, 1)] for s in samples]
    before = [w for s, w in zip(samples, weights) if 0 <= s["t"] < change]
    after = [w for s, w in zip(samples, weights) if s["t"] > change + 1.5]
    assert before and all(w == [3, 1] for w in before), weights
    assert after and after[-1] == [1, 1], weights
    assert all(s["bytes"][0] is not None for s in samples if 0 <= s["t"] < change), samples
    assert "rates job 0 : job 1" in text and "weights set to 1:1" in text, text
    assert doc["gloo"] is None and "gloo rings: not run (--no-gloo)" in text, text
    for name in ("weighted_ratio", "reweight_settle", "box_busy"):
        assert any(t["name"] == name and t["pass"] is not None for t in doc["targets"]), doc["targets"]
    assert any(line.startswith(("    PASS weighted", "    MISS weighted")) for line in lines), text


@pytest.mark.skipif(switch_lacks_shares() is not None, reason=f"{switch_lacks_shares()}")
def test_srpt_with_marks_serves_the_smaller_job_first_and_every_rank_keeps_its_box(tmp_path):
    """srpt with --dscp and the lab's priority bands: the smaller job first,
    both exact; the waiting job's ranks keep their box: their heartbeats
    ride CS6 in the first band and the lower band keeps a minimum rate (with
    neither, the workers of a 4-job race lost the box). The smaller job's
    calls take about 5 s, longer than the switch's lease, which the waiting
    job's heartbeats must keep."""
    cfg = JobsConfig(parse_jobs("2x4MiB,2x2MiB"), rate_mbit=20, iterations=3,
                     shares=("srpt",), gloo=False, dscp=(46, 0),
                     json_path=str(tmp_path / "jobs.json"), png_path=str(tmp_path / "jobs.png"))
    doc = run_jobs_bench(cfg, out=lambda line: None)
    [policy] = doc["policies"]
    big, small = policy["jobs"]
    assert small["completion_s"] < big["completion_s"], policy
    assert all(j["rel_err"] < 1e-6 for j in (big, small)), policy
