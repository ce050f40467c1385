"""Measuring a loss model from per-frame verdicts: runs of consecutive drops
and the statistical bounds the loss injector's tests hold them to
(xdp/lab/swml_loss.c, switchml_xdp/lab/burst.py)."""
from __future__ import annotations

import math
from collections.abc import Iterable

from switchml_xdp.lab.burst import BurstModel


def drop_runs(dropped: Iterable[bool]) -> list[int]:
    """The lengths of the runs of consecutive drops, in order."""
    out, run = [], 0
    for d in dropped:
        if d:
            run += 1
        elif run:
            out.append(run)
            run = 0
    if run:
        out.append(run)
    return out


def near(measured: float, expected: float, sd: float, sigmas: float = 5.0) -> bool:
    return abs(measured - expected) <= sigmas * sd


def random_run_bounds(loss: float, runs: int) -> tuple[float, float]:
    """(mean, sd of the mean) of a run of drops under independent loss L:
    geometric, mean 1 / (1 - L), variance L / (1 - L)^2."""
    return 1 / (1 - loss), math.sqrt(loss) / (1 - loss) / math.sqrt(max(runs, 1))


def burst_run_bounds(model: BurstModel, runs: int) -> tuple[float, float]:
    """(mean, sd of the mean) of a burst (h = 1, no loss in the good state):
    a stay in the bad state, geometric, mean 1 / r, variance (1 - r) / r^2."""
    r = model.r
    return 1 / r, math.sqrt(1 - r) / r / math.sqrt(max(runs, 1))


def burst_rate_sd(model: BurstModel, frames: int) -> float:
    """The sd of the share of `frames` spent in the bad state: a two-state
    Markov chain's, pi_b pi_g (1 + l) / (1 - l) / n with l = 1 - p - r."""
    pi_b = model.bad_fraction
    lam = 1 - model.p - model.r
    return math.sqrt(pi_b * (1 - pi_b) * (1 + lam) / (1 - lam) / frames)
