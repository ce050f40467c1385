"""How a box divides its link between the jobs that have data to send
(`swml-switch up --share`; docs/operations.md, "Shares between jobs"). Pure
arithmetic: shares.py feeds it what the data plane saw and writes back what
it decides.

- fair: equal parts;
- weighted: parts in proportion to the jobs' weights;
- srpt: the job with the least left of its current call gets the link, the
  others a floor each (SRPT_FLOOR: enough to keep hearing the box's RESULTs,
  which carry their rate, and to keep saying what they have left). A job's
  claim is what it has left halved for every SRPT_AGE_HALF_S it has waited
  (not been served first), so that a long call is not passed over for ever
  by a stream of short ones. Work-conserving: whoever is first gets all the
  link the floors leave.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

POLICIES = ("fair", "weighted", "srpt")
SRPT_FLOOR = 0.005           # a waiting job's part of the link under srpt
SRPT_FLOORS_AT_MOST = 0.05   # ... and all waiting jobs' together at most
SRPT_AGE_HALF_S = 30.0       # a waiting job's claim halves every this many seconds
UNSAID = 1 << 50             # the claim of a job whose ranks do not say what is left


@dataclass(frozen=True)
class Demand:
    """A job with data to send, as the policy sees it."""
    name: str
    weight: float = 1.0
    left: int = 0            # bytes into the box left of its current call; 0: not said
    waited_s: float = 0.0    # since it was last served first (srpt)


def claim(d: Demand) -> float:
    """srpt's key: smaller is served first."""
    left = d.left if d.left > 0 else UNSAID
    return left * math.pow(0.5, d.waited_s / SRPT_AGE_HALF_S)


def serving_order(policy: str, demands: list[Demand]) -> list[str]:
    """The jobs, first-served first: srpt by claim, weighted by weight
    (largest first), fair all alike (by name, for a stable order)."""
    if policy == "srpt":
        key = lambda d: (claim(d), d.name)          # noqa: E731
    elif policy == "weighted":
        key = lambda d: (-d.weight, d.name)         # noqa: E731
    else:
        key = lambda d: d.name                      # noqa: E731
    return [d.name for d in sorted(demands, key=key)]


def divide(policy: str, demands: list[Demand]) -> dict[str, float]:
    """Each job's part of the link, summing to 1 (nothing for no jobs)."""
    if policy not in POLICIES:
        raise ValueError(f"a share policy is one of {', '.join(POLICIES)}, not {policy!r}")
    if not demands:
        return {}
    n = len(demands)
    if policy == "fair":
        return {d.name: 1.0 / n for d in demands}
    if policy == "weighted":
        total = sum(d.weight for d in demands)
        return {d.name: d.weight / total for d in demands}
    order = serving_order(policy, demands)
    floor = min(SRPT_FLOOR, SRPT_FLOORS_AT_MOST / max(1, n - 1))
    parts = {name: floor for name in order[1:]}
    parts[order[0]] = 1.0 - floor * (n - 1)
    return parts


def part_if_active(policy: str, active: list[Demand], idle: Demand) -> float:
    """The part a job with nothing to send now would get if it came back:
    what its ranks are told meanwhile, so that they do not start the next
    call at a rate that is no longer theirs."""
    return divide(policy, active + [idle])[idle.name]


def dscp_marks(policy: str, demands: list[Demand], classes: tuple[int, ...]) -> dict[str, int]:
    """Each job's DSCP under `--dscp` (classes highest priority first): by
    its place in the serving order, the jobs past the last class all in the
    last; under fair, every job in the first."""
    if not classes:
        return {}
    if policy == "fair":
        return {d.name: classes[0] for d in demands}
    order = serving_order(policy, demands)
    return {name: classes[min(i, len(classes) - 1)] for i, name in enumerate(order)}


def parse_dscp_classes(text: str) -> tuple[int, ...]:
    """'46,34,26,0' -> the classes; ValueError with a one-line reason."""
    items = [s.strip() for s in str(text).split(",")]
    try:
        values = tuple(int(s, 0) for s in items)
    except ValueError:
        values = ()
    if not values or any(not 0 <= v <= 63 for v in values) or len(set(values)) < len(values):
        raise ValueError(f"--dscp takes distinct DSCP values 0..63, highest priority first "
                         f"(e.g. 46,34,26,0), not {text!r}")
    if len(values) > 8:
        raise ValueError(f"--dscp takes at most 8 classes, not {len(values)}")
    return values


def parse_weight(value, cap: float | None = None) -> float:
    """A job's weight: a finite number above zero and, where `cap` is given,
    at most the cap; ValueError with a one-line reason."""
    if isinstance(value, bool):
        raise ValueError(f"a weight is a number above zero, not {value!r}")
    try:
        w = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"a weight is a number above zero, not {value!r}") from None
    if not math.isfinite(w) or w <= 0:
        raise ValueError(f"a weight is a number above zero, not {value!r}")
    if cap is not None and w > cap:
        raise ValueError(f"weight {w:g} is above this box's cap of {cap:g} (swml-switch up "
                         f"--max-weight)")
    return w
