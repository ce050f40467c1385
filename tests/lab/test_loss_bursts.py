"""Bursty loss (Gilbert-Elliott, switchml_xdp/lab/burst.py) on a real lab
link: numbered datagrams from w0 to w1 with loss only on w0's link up; which
numbers arrived shows every run of consecutive drops, held against the model
and against the injector's own counters. Random loss alongside, for its runs.
"""
from __future__ import annotations

import pytest

from requires import NO_LAB

if NO_LAB:
    pytest.skip(NO_LAB, allow_module_level=True)

from click.testing import CliRunner

from loss_flow import Flow
from loss_runs import burst_rate_sd, burst_run_bounds, drop_runs, near, random_run_bounds
from switchml_xdp.cli.lab import main as lab_cli
from switchml_xdp.lab import Lab, cleanup_leftovers
from switchml_xdp.lab.addressing import new_prefix
from switchml_xdp.lab.burst import BurstModel

FRAMES = 6000


@pytest.fixture(scope="module")
def lab():
    with Lab(workers=2, loss=0.0) as lab:
        yield lab


def one_link(lab, loss, burst) -> tuple[list[bool], dict]:
    """FRAMES datagrams w0 -> w1 with loss on w0's link up: whether each was
    dropped, and the counters' deltas there."""
    w0, w1 = lab.workers
    lab.set_loss(0, hosts=lab.hosts)
    lab.set_loss(loss, hosts=[w0], direction="up", burst=burst)
    before = lab.loss_counters()["w0"]["up"]
    try:
        with Flow(lab, w0, w1) as flow:
            got = set(flow.send_numbered(FRAMES))
    finally:
        lab.set_loss(0, hosts=lab.hosts)
    after = lab.loss_counters()["w0"]["up"]
    return [i not in got for i in range(FRAMES)], {k: after[k] - before[k] for k in after}


def test_random_loss_runs_are_short(lab):
    """10% random: runs of drops average 1 / (1 - L), about 1.1 frames."""
    dropped, c = one_link(lab, 0.10, None)
    runs = drop_runs(dropped)
    assert c["seen"] == FRAMES and c["dropped"] == sum(dropped), c
    assert near(sum(dropped) / FRAMES, 0.10, (0.09 / FRAMES) ** 0.5)
    mean, sd = random_run_bounds(0.10, len(runs))
    assert near(sum(runs) / len(runs), mean, sd), sum(runs) / len(runs)
    assert c["drop_runs"] == len(runs) and c["bad"] == c["bursts"] == 0


@pytest.mark.parametrize("mean_len", [4, 10])
def test_bursts_on_a_real_link_have_the_asked_rate_and_length(lab, mean_len):
    """10% in bursts of mean length B: the receiver sees the rate and the
    runs the model gives (h = 1: each stay in the bad state one run)."""
    model = BurstModel.of(0.10, mean_len)
    dropped, c = one_link(lab, 0.10, mean_len)
    runs = drop_runs(dropped)
    assert c["seen"] == FRAMES and c["dropped"] == sum(dropped), c
    assert near(sum(dropped) / FRAMES, 0.10, burst_rate_sd(model, FRAMES)), sum(dropped) / FRAMES
    mean, sd = burst_run_bounds(model, len(runs))
    assert near(sum(runs) / len(runs), mean, sd), (sum(runs) / len(runs), mean)
    assert c["drop_runs"] == len(runs) and c["bad"] == c["dropped"]
    assert abs(c["bursts"] - len(runs)) <= 1


@pytest.fixture
def prefix():
    """A lab prefix, and whatever a test left up under it removed afterwards."""
    p = new_prefix()
    yield p
    cleanup_leftovers(p)


def test_cli_up_with_bursts_records_and_shows_them(prefix):
    """`swml-lab up --loss 5% --burst 4`: the links' model, the state file's,
    and what `up` prints; bad values are one-line errors."""
    up = CliRunner().invoke(lab_cli, ["up", "-n", "1", "--prefix", prefix, "--loss", "5%",
                                      "--burst", "4"])
    assert up.exit_code == 0 and "in bursts of 4 frames" in up.output, up.output
    assert "5%b4/5%b4" in up.output, up.output
    lab = Lab.from_state(prefix)
    assert lab.burst == 4.0
    model = lab.loss_settings()["w0"]["down"]["burst"]
    assert model.r == pytest.approx(0.25) and model.mean_loss() == pytest.approx(0.05)
    for args, says in ((["--burst", "4"], "needs --loss"),
                       (["--loss", "5%", "--burst", "0.5"], "1..")):
        r = CliRunner().invoke(lab_cli, ["up", "-n", "1", *args])
        assert r.exit_code != 0 and says in r.output and "Traceback" not in r.output, r.output
