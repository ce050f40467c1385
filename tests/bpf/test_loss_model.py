"""The lab's loss injector on its own (xdp/lab/swml_loss.c through
BPF_PROG_TEST_RUN): random loss and Gilbert-Elliott bursts, measured frame by
frame on one link, against the model (switchml_xdp/lab/burst.py).

Test runs arrive on loopback (ifindex 1), made link 0 of a stand-in lab, so
the XDP program drops "up" frames and the tc egress one "down" frames. The
injector's own Python (LossInjector.set, settings, counters) drives the maps.
"""
from __future__ import annotations

import contextlib
import ctypes as ct
import dataclasses
import secrets

import pytest

from frames import Endpoint, udp_frame
from loss_runs import burst_rate_sd, burst_run_bounds, drop_runs, near, random_run_bounds
from switchml_xdp import bpf, wire
from switchml_xdp.lab import loss as loss_mod
from switchml_xdp.lab.burst import BurstModel
from xdp_tester import require_bpf

LOOPBACK_IFINDEX = 1
XDP_DROP, TC_ACT_SHOT = 1, 2
FRAME = udp_frame(Endpoint("02:00:00:00:00:01", "10.0.0.1", 40000),
                  Endpoint("02:00:00:00:00:02", "10.0.0.2", wire.DEFAULT_PORT), bytes(64))


@dataclasses.dataclass(frozen=True)
class _Host:
    name: str


class _OneLinkLab:
    """What LossInjector asks of a lab: a prefix and one host, loopback."""

    def __init__(self):
        self.prefix = f"losstest{secrets.token_hex(3)}"
        self.hosts = self.workers = [_Host("lo")]

    def host(self, h):
        return self.hosts[0]


@pytest.fixture(scope="module")
def link():
    """(injector, {"up": fd of the XDP program, "down": fd of tc egress's})."""
    require_bpf()
    lab = _OneLinkLab()
    pins = loss_mod.pin_dir(lab.prefix)
    bpf.ensure_bpffs(pins)
    with contextlib.ExitStack() as stack:
        stack.callback(loss_mod.remove_pins, lab.prefix)
        prog = bpf.compile_program(loss_mod.SOURCE, loss_mod.XDP_PROG,
                                   {"SWML_LOSS_PIN_DIR": bpf.c_string(pins)})
        stack.callback(prog.close)
        prog.table("links")[ct.c_uint32(LOOPBACK_IFINDEX)] = ct.c_uint32(0)
        injector = loss_mod.LossInjector(lab)
        stack.callback(injector.close)
        injector.set_port(wire.DEFAULT_PORT)
        yield injector, {"up": prog.fd, "down": prog.load(loss_mod.EGRESS_PROG, "sched_cls")}


def fields(model: BurstModel) -> tuple[float, ...]:
    return dataclasses.astuple(model)


def verdicts(link, direction: str, frames: int) -> tuple[list[bool], dict]:
    """Whether each of `frames` frames was dropped, and the counters' deltas."""
    injector, fds = link
    before = injector.counters()["lo"][direction]
    drop = XDP_DROP if direction == "up" else TC_ACT_SHOT
    out = [bpf.prog_test_run(fds[direction], FRAME)[0] == drop for _ in range(frames)]
    after = injector.counters()["lo"][direction]
    return out, {k: after[k] - before[k] for k in after}


@pytest.mark.parametrize("direction", ["up", "down"])
@pytest.mark.parametrize("loss", [0.05, 0.3])
def test_random_loss_is_independent(link, direction, loss):
    """Random loss: rate L, runs of drops of mean 1 / (1 - L), never a bad state."""
    link[0].set(loss, direction="both")
    n = 20000
    dropped, c = verdicts(link, direction, n)
    runs = drop_runs(dropped)
    assert c["seen"] == n and c["dropped"] == sum(dropped) and c["passed"] == n - sum(dropped)
    assert near(sum(dropped) / n, loss, (loss * (1 - loss) / n) ** 0.5)
    mean, sd = random_run_bounds(loss, len(runs))
    assert near(sum(runs) / len(runs), mean, sd), (sum(runs) / len(runs), mean)
    assert c["bad"] == c["bursts"] == 0
    assert c["drop_runs"] == len(runs)


@pytest.mark.parametrize("direction", ["up", "down"])
@pytest.mark.parametrize(("loss", "mean_len"), [(0.05, 4), (0.10, 8)])
def test_bursts_have_the_asked_rate_and_length(link, direction, loss, mean_len):
    """Bursty loss at mean rate L, mean burst B: the measured rate is L and
    the runs of drops are geometric with mean B (a quarter of them one frame
    long at B = 4, where random loss makes nearly all of them single)."""
    link[0].set(loss, direction=direction, burst=mean_len)
    model = BurstModel.of(loss, mean_len)
    assert fields(link[0].settings()["lo"][direction]["burst"]) == pytest.approx(fields(model))
    n = 40000
    dropped, c = verdicts(link, direction, n)
    runs = drop_runs(dropped)
    assert near(sum(dropped) / n, loss, burst_rate_sd(model, n)), sum(dropped) / n
    mean, sd = burst_run_bounds(model, len(runs))
    assert near(sum(runs) / len(runs), mean, sd), (sum(runs) / len(runs), mean)
    singles = sum(r == 1 for r in runs) / len(runs)
    assert near(singles, model.r, (model.r * (1 - model.r) / len(runs)) ** 0.5), singles
    # h = 1 and a lossless good state: every bad frame is a drop, every stay one run.
    assert c["bad"] == c["dropped"] == sum(dropped)
    assert c["bursts"] - 1 <= c["drop_runs"] == len(runs) <= c["bursts"] + 1


def test_a_model_with_a_lossy_good_state(link):
    """loss= is then the good state's, h the bad state's: the counters show
    the time in the bad state and the mean stay there."""
    model = BurstModel(p=0.02, r=0.2, h=0.5)
    link[0].set(0.01, direction="up", burst=model)
    s = link[0].settings()["lo"]["up"]
    assert s["loss"] == pytest.approx(0.01) and fields(s["burst"]) == pytest.approx(fields(model))
    n = 40000
    dropped, c = verdicts(link, "up", n)
    assert near(c["bad"] / n, model.bad_fraction, burst_rate_sd(model, n))
    assert near(c["bad"] / c["bursts"], model.mean_stay,
                burst_run_bounds(model, c["bursts"])[1])
    assert near(sum(dropped) / n, model.mean_loss(0.01), burst_rate_sd(model, n))


def test_setting_random_loss_again_ends_a_burst(link):
    """A link caught in the bad state leaves it when bursts are turned off."""
    link[0].set(0, direction="up", burst=BurstModel(p=1.0, r=1e-9))
    dropped, c = verdicts(link, "up", 50)
    assert all(dropped) and c["bursts"] == 1 and c["bad"] == 50
    link[0].set(0, direction="up")
    assert link[0].settings()["lo"]["up"]["burst"] is None
    dropped, c = verdicts(link, "up", 50)
    assert not any(dropped) and c["bad"] == 0
