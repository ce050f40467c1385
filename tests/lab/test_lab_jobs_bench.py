"""`swml-lab bench --jobs` on a tiny mix (needs root; switchml_xdp/bench/jobs_bench.py):
two jobs of two workers through one box whose link is the bottleneck, and
the same jobs as Gloo rings: every row printed, the JSON has them, every
result exact, the box's port counted at least every job's bytes. The
spec's syntax and bounds: tests/unit/test_jobs_bench_spec.py."""
from __future__ import annotations

import json

import pytest

from requires import NO_LAB

if NO_LAB:
    pytest.skip(f"lab tests: {NO_LAB}", allow_module_level=True)

from switchml_xdp.bench.jobs_bench import JobsConfig, _torch_missing, parse_jobs, run_jobs_bench


def test_a_tiny_mix_prints_each_jobs_completion_and_the_box_links_busy_share(tmp_path):
    lines = []
    cfg = JobsConfig(parse_jobs("2x256KiB,2x512KiB"), rate_mbit=100, iterations=2,
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
