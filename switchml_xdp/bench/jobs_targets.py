"""The targets the box's share policies are held to (docs/operations.md,
"Competing jobs"), worked out from the jobs bench's document
(bench/jobs_bench.py): each a PASS or MISS line, or "not measured" with
what would measure it."""
from __future__ import annotations

from .jobs_spec import DEFAULT_SPEC, WEIGHTED
from .jobs_weighted import TOLERANCE

SRPT_AVERAGE = 0.70   # srpt's average completion, at most this much of fair's
SRPT_LAST = 1.05      # srpt's last completion, at most this much of fair's
BUSY = 0.95           # the box's link, at least this busy under every policy
SETTLE_S = 1.0        # weights changed while the jobs run: in effect within this
STARVE = 2.0          # under srpt, each job within this much of its ideal fair completion


def _target(name: str, value: float | None, limit: float, says: str, at_least=False) -> dict:
    ok = value is not None and (value >= limit if at_least else value <= limit)
    return {"name": name, "value": value, "limit": limit, "pass": ok, "says": says}


def _unmeasured(name: str, needs: str) -> dict:
    return {"name": name, "value": None, "limit": None, "pass": None, "says": needs}


def _policy(doc: dict, share: str) -> dict | None:
    return next((p for p in doc["policies"] if p["share"] == share), None)


def targets(doc: dict) -> list[dict]:
    """Every target, from what the document measured."""
    out = []
    fair, srpt = _policy(doc, "fair"), _policy(doc, "srpt")
    ideal = doc.get("ideal_s")
    if fair and srpt:
        for name, key, limit, what in (("srpt_average", "average_s", SRPT_AVERAGE, "average"),
                                       ("srpt_last", "last_s", SRPT_LAST, "last")):
            v = srpt[key] / fair[key]
            pick = sum if key == "average_s" else max
            on_ideal = f", an ideal box's {pick(ideal['srpt']) / pick(ideal['fair']):.2f}x" \
                if ideal else ""
            out.append(_target(name, v, limit, f"srpt's {what} completion {v:.2f}x fair's "
                                               f"(at most {limit:g}x{on_ideal})"))
    else:
        out += [_unmeasured(n, "srpt against fair: needs --share fair,srpt")
                for n in ("srpt_average", "srpt_last")]
    if doc["policies"]:
        busy = min(p["box_busy"] for p in doc["policies"])
        each = ", ".join(f"{p['share']} {100 * p['box_busy']:.1f}%" for p in doc["policies"])
        out.append(_target("box_busy", busy, BUSY, f"the box's link busy under every policy: {each} "
                                                   f"(at least {100 * BUSY:g}%)", at_least=True))
    out += _weighted_targets(_policy(doc, WEIGHTED), doc)
    if srpt and ideal:
        over = [j["completion_s"] / f for j, f in zip(srpt["jobs"], ideal["fair"])]
        worst = max(range(len(over)), key=over.__getitem__)
        out.append(_target("srpt_starve", over[worst], STARVE,
                           f"srpt: each of the {len(over)} jobs within {over[worst]:.2f}x its ideal "
                           f"fair-share completion, job {worst} the furthest (at most {STARVE:g}x)"))
    else:
        out.append(_unmeasured("srpt_starve", "srpt against an ideal fair box: needs --share srpt "
                                              "and jobs that each fill the box's link alone"))
    return out


def _weighted_targets(policy: dict | None, doc: dict) -> list[dict]:
    """The rates' ratio under the weights, and the settling after a change."""
    fig = (policy or {}).get("rates", {}).get("figures")
    if not fig or fig["ratio"] is None:
        return [_unmeasured("weighted_ratio", "rates by weight: needs --share weighted, two jobs "
                                              "or more, and a run long enough to sample"),
                _unmeasured("reweight_settle", "weights changed mid-run: needs --reweight")]
    off = abs(fig["ratio"] / fig["target"] - 1)
    out = [_target("weighted_ratio", off, TOLERANCE,
                   f"weighted: job 0 : job 1 at {fig['ratio']:.2f}:1, weights {fig['target']:g}:1, "
                   f"{100 * off:.1f}% off (at most {100 * TOLERANCE:g}%)")]
    after = fig.get("after")
    if after is None:
        out.append(_unmeasured("reweight_settle", "weights changed mid-run: needs --reweight"))
    else:
        s = after["settle_s"]
        took = (f"{s:.2f} s after swml-switch job returned ({after['with_command_s']:.2f} s "
                f"after it began)" if s is not None else "never settled")
        out.append(_target("reweight_settle", s, SETTLE_S,
                           f"weights set to {':'.join(map(str, doc['reweight']))} mid-run: the "
                           f"ratio within {100 * TOLERANCE:g}% of {after['target']:g}:1 "
                           f"{took} (at most {SETTLE_S:g} s)"))
    return out


def mix_of(spec: str, iterations: int) -> str:
    """A mix as the target lines name it."""
    return f"{spec}, {iterations} iterations"


TARGETS_MIX = mix_of(DEFAULT_SPEC, 10)    # the mix the targets are set for


def target_lines(found: list[dict], mix: str) -> list[str]:
    """What the bench prints: a line a target; `mix` (mix_of) where it is not TARGETS_MIX."""
    mix = "" if mix == TARGETS_MIX else f" (set for {TARGETS_MIX}; this mix is {mix})"
    lines = [f"  targets{mix}:"]
    for t in found:
        verdict = {True: "PASS", False: "MISS", None: "not measured:"}[t["pass"]]
        lines.append(f"    {verdict} {t['says']}")
    return lines
