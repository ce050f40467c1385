"""The jobs' rates through the box over time, under the weighted policy
(bench/jobs_bench.py; docs/operations.md, "Competing jobs"): the box's
per-job byte counters sampled every SAMPLE_S through its control port's
`status`, the weights changed mid-run with `swml-switch job NAME --weight W`,
and what the samples say: the rate ratio of the first two jobs over the
steady part, against their weights', and how long after the change the
ratio settled."""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path

from .output import NO_PLOT, pyplot, save_chart

SAMPLE_S = 0.15      # between two status requests
STEADY_AFTER_S = 1.0  # the start's and a change's transient, left out of a steady ratio
END_MARGIN_S = 0.2   # before the first job's end, where the steady part stops
WINDOW_S = 0.3       # the ratio that must settle: over this much time
HOLD_S = 1.0         # ... and stay within TOLERANCE for this long
TOLERANCE = 0.10     # of the weights' ratio


def job_name(j: int) -> str:
    """The name job j joins the box under."""
    return f"job{j}"


class RateSampler:
    """A thread that asks the box's `status` every SAMPLE_S, from its own
    network namespace, for each job's cumulative bytes (the data plane's
    job_stats) and share object; samples: [{"t", "bytes": [..], "share": [..]}],
    t in seconds from `zero` (a time.monotonic()), a list entry a job."""

    def __init__(self, lab, jobs: int, zero: float):
        self.lab, self.jobs, self.zero = lab, jobs, zero
        self.samples: list[dict] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="swml-rate-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from ..client.control import ControlClient

        try:
            with self.lab.enter(self.lab.switch):
                client = ControlClient(self.lab.switch.ip, connect_timeout=10)
        except Exception as e:  # noqa: BLE001 - said in the bench's output, the race goes on
            self.error = f"no status from the box: {e}"
            return
        try:
            while not self._stop.wait(SAMPLE_S):
                before = time.monotonic()
                st = client.status()
                self.samples.append(sample_of(st, self.jobs, (before + time.monotonic()) / 2
                                              - self.zero))
        except Exception as e:  # noqa: BLE001
            self.error = f"status stopped answering: {e}"
        finally:
            client.close()

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join(timeout=15)
        return self.samples


def sample_of(status: dict, jobs: int, t: float) -> dict:
    """One sample from a `status` reply: each job's cumulative bytes (None
    where the box does not count it) and its share object (None where none)."""
    by_name = {j.get("name"): j for j in status.get("jobs", [])}
    stats = status.get("job_stats") or {}
    out = {"t": t, "bytes": [], "share": []}
    for j in range(jobs):
        job = by_name.get(job_name(j), {})
        row = stats.get(str(job.get("id")))
        out["bytes"].append(row.get("bytes") if row else None)
        out["share"].append(job.get("share"))
    return out


def set_weights(lab, old: tuple[int, ...], new: tuple[int, ...]) -> list[str]:
    """`swml-switch job NAME --weight W` in the box's namespace for each job
    whose weight changes; what each said, where it refused (one line each)."""
    refused = []
    for j, (was, now) in enumerate(zip(old, new)):
        if was == now:
            continue
        r = lab.run(lab.switch, [sys.executable, "-m", "switchml_xdp.cli.switch", "job",
                                 job_name(j), "--weight", str(now)], check=False)
        if r.returncode != 0:
            said = (r.stderr or r.stdout).strip().splitlines()
            refused.append(f"{job_name(j)} --weight {now}: {said[-1] if said else r.returncode}")
    return refused


def bytes_at(samples: list[dict], j: int, t: float) -> float | None:
    """Job j's cumulative bytes at time t, interpolated between the samples
    around it; None outside them or where they lack the count."""
    pts = [(s["t"], s["bytes"][j]) for s in samples if s["bytes"][j] is not None]
    for (t0, b0), (t1, b1) in zip(pts, pts[1:]):
        if t0 <= t <= t1:
            return b0 + (b1 - b0) * (t - t0) / (t1 - t0) if t1 > t0 else b0
    return None


def ratio(samples: list[dict], a: float, b: float) -> float | None:
    """Job 0's bytes over job 1's from a to b; None where unmeasured."""
    ends = [bytes_at(samples, j, t) for j in (0, 1) for t in (a, b)]
    if b <= a or None in ends or ends[3] <= ends[2]:
        return None
    return (ends[1] - ends[0]) / (ends[3] - ends[2])


def settle_s(samples: list[dict], change: float, end: float, target: float) -> float | None:
    """How long after `change` the WINDOW_S ratio came within TOLERANCE of
    `target` and stayed there for HOLD_S (or until `end`); None if never."""
    ends = [s["t"] for s in samples if change < s["t"] <= end and s["t"] - WINDOW_S >= samples[0]["t"]]
    near = [(t, r is not None and abs(r / target - 1) <= TOLERANCE)
            for t in ends for r in [ratio(samples, t - WINDOW_S, t)]]
    for i, (t, ok) in enumerate(near):
        if ok and all(k for u, k in near[i:] if u <= t + HOLD_S):
            return t - change
    return None


def weighted_figures(samples: list[dict], weights: tuple[int, ...], first_end: float,
                     reweight: tuple[int, ...] | None, change: float | None) -> dict:
    """The rate ratio of jobs 0 and 1 over the steady part(s), beside their
    weights', and the settling after a change of weights."""
    before_end = change if change is not None else first_end - END_MARGIN_S
    out = {"target": weights[0] / weights[1],
           "from_s": STEADY_AFTER_S, "to_s": before_end,
           "ratio": ratio(samples, STEADY_AFTER_S, before_end)}
    if reweight is not None and change is not None:
        after = reweight[0] / reweight[1]
        out["after"] = {"target": after, "from_s": change + STEADY_AFTER_S,
                        "to_s": first_end - END_MARGIN_S,
                        "ratio": ratio(samples, change + STEADY_AFTER_S, first_end - END_MARGIN_S),
                        "settle_s": settle_s(samples, change, first_end - END_MARGIN_S, after)}
    return out


def rates_mbit(samples: list[dict], j: int) -> tuple[list[float], list[float]]:
    """Job j's rate into the box over each WINDOW_S ending at a sample: (t, Mbit/s)."""
    ts, rs = [], []
    for s in samples:
        a, b = bytes_at(samples, j, s["t"] - WINDOW_S), s["bytes"][j]
        if a is not None and b is not None:
            ts.append(s["t"])
            rs.append((b - a) * 8 / WINDOW_S / 1e6)
    return ts, rs


def plot_rates(doc: dict, path: Path) -> str:
    """Each job's rate over time under the weighted policy, the change of
    weights marked; what was written, in a line."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    policy = next(p for p in doc["policies"] if p.get("rates"))
    fig, ax = plt.subplots(figsize=(8, 4))
    for j, spec in enumerate(doc["jobs"]):
        ts, rs = rates_mbit(policy["rates"]["samples"], j)
        ax.plot(ts, rs, label=f"job {j} ({spec['workers']}x{spec['size'] / 2**20:g}MiB, "
                              f"weight {spec['weight']})")
    change = policy["rates"].get("change_s")
    if change is not None:
        ax.axvline(change, color="black", linestyle=":",
                   label="weights set to " + ":".join(map(str, doc["reweight"])))
    ax.set_xlabel("seconds from the common start")
    ax.set_ylabel(f"rate into the box over {WINDOW_S:g} s (Mbit/s)")
    ax.set_title(f"weighted shares, box link {doc['box_rate_mbit']:g} Mbit/s", fontsize=10)
    return save_chart(plt, fig, ax, path)


@contextlib.contextmanager
def watched(lab, weights: tuple[int, ...], reweight: tuple[int, ...] | None, at_s: float,
            start_at: float):
    """Around the race under the weighted policy: the rates sampled, and
    where `reweight` says, the weights set to it at_s seconds after start_at.
    Yields a dict that holds, once the block is done, "samples", "error"
    (the sampler's, or None), and with reweight, "change_s" (when the first
    `swml-switch job` began, from start_at), "command_s" (how long they took)
    and "refused" (what they refused)."""
    info: dict = {}
    sampler = RateSampler(lab, len(weights), start_at)
    try:
        if reweight is not None:
            time.sleep(max(0.0, start_at + at_s - time.monotonic()))
            began = time.monotonic()
            info["refused"] = set_weights(lab, weights, reweight)
            info["change_s"], info["command_s"] = began - start_at, time.monotonic() - began
        yield info
    finally:
        info["samples"], info["error"] = sampler.stop(), sampler.error
