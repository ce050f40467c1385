"""Rates from two samples of a switch's cumulative counters.

The data plane only counts (packets by outcome, and per job packets, bytes,
results and shadow replies: `DataplaneMaps.read_job_stats`); whoever wants a
rate samples twice and divides the differences by the time between the
samples. A counter that went down between them belongs to a restarted switch:
no rate is given for it rather than a negative one.
"""
from __future__ import annotations

from .. import wire

#: Per-job cumulative counters (read_job_stats) -> the rate `status` shows.
JOB_RATES = {
    "packets": "packets_per_s",            # DATA packets of the job the switch took in
    "results": "completions_per_s",        # slot rounds completed (RESULTs sent)
    "shadow_replies": "retransmissions_answered_per_s",   # stored results sent again
}


def _per_s(before: int | None, after: int | None, dt: float) -> float | None:
    if before is None or after is None or after < before or dt <= 0:
        return None
    return (after - before) / dt


def job_rates(before: dict | None, after: dict | None, dt: float) -> dict[str, dict]:
    """{job id: {packets_per_s, gbit_per_s, completions_per_s,
    retransmissions_answered_per_s}} for the jobs counted in both samples
    (`before`, `after`: {job id: cumulative counters}, ids as text)."""
    out: dict[str, dict] = {}
    for job_id, now in (after or {}).items():
        then = (before or {}).get(job_id)
        if then is None:
            continue
        rates = {rate: _per_s(then.get(key), now.get(key), dt) for key, rate in JOB_RATES.items()}
        byte_rate = _per_s(then.get("bytes"), now.get("bytes"), dt)
        rates["gbit_per_s"] = None if byte_rate is None else byte_rate * 8 / 1e9
        out[job_id] = rates
    return out


def counter_rates(before: dict | None, after: dict | None, dt: float) -> dict[str, float | None]:
    """{counter name: per second} for every name of wire.COUNTER_NAMES in both."""
    if not before or not after:
        return {}
    return {name: _per_s(before.get(name), after.get(name), dt)
            for name in wire.COUNTER_NAMES if name in before and name in after}


def switch_rates(before: dict, after: dict) -> dict | None:
    """The rates of one switch between two status samples of it ("sampled_at":
    monotonic seconds, "counters", "job_stats"); None where they are not of
    the same running daemon or carry no counters."""
    if (before.get("pid"), before.get("started")) != (after.get("pid"), after.get("started")):
        return None
    dt = after.get("sampled_at", 0.0) - before.get("sampled_at", 0.0)
    counters = counter_rates(before.get("counters"), after.get("counters"), dt)
    if not counters:
        return None
    return {
        "interval_s": dt,
        "counters": counters,
        "drops": {name: counters[name] for name in wire.DROP_REASONS if name in counters},
        "jobs": job_rates(before.get("job_stats"), after.get("job_stats"), dt),
        "per_job": after.get("job_stats") is not None,
    }


def add_rates(before: list[dict], after: list[dict]) -> list[dict]:
    """`after`'s switches, each with "rates" against the same interface in `before`."""
    earlier = {s["iface"]: s for s in before}
    for s in after:
        if s["iface"] in earlier:
            s["rates"] = switch_rates(earlier[s["iface"]], s)
    return after
