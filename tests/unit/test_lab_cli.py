"""`swml-lab` before anything is built: bad arguments, the bench's help, its
output directory and job slots, a queue depth without a rate. The lab itself:
tests/lab/test_lab_tool.py."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from switchml_xdp.cli import lab as lab_cli
from switchml_xdp.lab import Lab, LabError


@pytest.mark.parametrize("args, says", [
    (["demo", "--size", "1Q"], "not a size: '1Q'"),
    (["demo", "--size", "2"], "smaller than one element"),
    (["demo", "-n", "65"], "a job has at most 64 ranks"),
    (["demo", "-n", "0"], "--workers"),
    (["demo", "--rate", "0"], "--rate"),
    (["demo", "--prefix", "mine"], "demo makes a fresh lab each run"),
    (["demo", "--backend", "rdma"], "--backend"),
    (["demo", "--iterations", "0"], "--iterations"),
    (["up", "--switch", "--switch-args", "-k 999"], "--elements"),
    (["up", "--switch", "--switch-args", "--mode offload"], "--mode"),
    (["up", "--switch-args", "-k 64"], "only with --switch"),
    (["up", "--switch", "-n", "65"], "a job has at most 64 ranks"),
    (["bench", "--port-hooks", "none"], "--port-hooks"),
    (["bench", "--port-hooks", "boxes", "--loss", "0,1%"], "the loss injector is a hook on every port"),
    (["up", "--port-hooks", "boxes", "--loss", "1%"], "the loss injector is a hook on every port"),
    (["up", "--port-hooks", "boxes", "--loss-port", "0"], "the loss injector is a hook on every port"),
    (["up", "--port-hooks", "boxes", "--racks", "2"], "--port-hooks"),
])
def test_bad_arguments_fail_before_anything_is_built(args, says):
    r = CliRunner().invoke(lab_cli.main, args)
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output, r.output
    assert not isinstance(r.exception, AssertionError)


def test_bench_help_says_how_long_and_where():
    r = CliRunner().invoke(lab_cli.main, ["bench", "--help"])
    assert r.exit_code == 0
    text = " ".join(r.output.split()).replace("- ", "-")   # click wraps after hyphens
    assert "about 25 minutes" in text and "swml-lab-bench-DATE-TIME" in text
    assert "userspace (the same protocol served by a user-space switch" in text


def test_bench_writes_to_a_fresh_directory_unless_told(monkeypatch, tmp_path):
    from switchml_xdp.bench import lab_bench

    seen = []
    monkeypatch.setattr(lab_bench, "run_bench", lambda cfg, out: seen.append(cfg.out_dir))
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(lab_cli.main, ["bench", "-n", "2"]).exit_code == 0
    assert seen[-1].startswith("swml-lab-bench-") and "bench/results" not in seen[-1]
    assert CliRunner().invoke(lab_cli.main, ["bench", "--out", "bench/results"]).exit_code == 0
    assert seen[-1] == "bench/results"


@pytest.mark.parametrize("rate,k,slots", [(50, 256, 64), (50, 64, 256), (200, 256, 256),
                                          (1, 256, 16), (10000, 64, 512)])
def test_bench_job_slots_cover_a_lost_packets_recovery(rate, k, slots):
    """The bench's default slots cover WINDOW_MS of sending (a round held up by
    a loss must not stall the stream: 32 slots at 50 Mbit/s made 8 workers
    1.22x slower at 1% loss), as a power of two within the bounds."""
    from switchml_xdp.bench import lab_bench

    bench = lab_bench.Bench(lab_bench.BenchConfig(rate_mbit=rate))
    assert bench.job_slots(k) == slots
    packet_s = (lab_bench.SWML_HEADERS + 4 * k) * 8 / (rate * 1e6)
    if lab_bench.MIN_JOB_SLOTS < slots < lab_bench.MAX_JOB_SLOTS:
        assert slots * packet_s >= lab_bench.WINDOW_MS / 1e3 >= 8e-3
        assert slots / 2 * packet_s < lab_bench.WINDOW_MS / 1e3
    assert lab_bench.Bench(lab_bench.BenchConfig(rate_mbit=rate, job_slots=24)).job_slots(k) == 24


def test_queue_needs_a_rate_and_a_sane_depth():
    with pytest.raises(LabError, match="needs a rate"):
        Lab(workers=1, queue_packets=32)
    with pytest.raises(LabError, match="queue must be"):
        Lab(workers=1, rate_mbit=100, queue_packets=0)


def test_port_hooks_are_every_port_or_the_boxes():
    """Lab(port_hooks=...): refused in one line before anything is built."""
    with pytest.raises(LabError, match="port hooks 'workers': one of every, boxes"):
        Lab(workers=2, port_hooks="workers")
    assert Lab(workers=2, port_hooks="boxes").port_hooks == "boxes"
    assert Lab(workers=2).port_hooks == "every"
