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
HOLD_S = 1.0         # ... and the ratio over this long after it too
TOLERANCE = 0.10     # of the weights' ratio
SENDING = 0.05       # of the two jobs' bytes: a job that sent less was not sending
RESTART_S = 0.5      # around a time a job was not sending, left out of the ratio


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


def set_weights(lab, old: tuple[float, ...], new: tuple[float, ...]) -> list[str]:
    """`swml-switch job NAME --weight W` in the box's namespace for each job
    whose weight changes; what each said, where it refused (one line each)."""
    refused = []
    for j, (was, now) in enumerate(zip(old, new)):
        if was == now:
            continue
        r = lab.run(lab.switch, [sys.executable, "-m", "switchml_xdp.cli.switch", "job",
                                 job_name(j), "--weight", f"{now:g}", "--iface", lab.switch.iface],
                    check=False)
        if r.returncode != 0:
            said = (r.stderr or r.stdout).strip().splitlines()
            refused.append(f"{job_name(j)} --weight {now:g}: {said[-1] if said else r.returncode}")
    return refused


def bytes_at(samples: list[dict], j: int, t: float) -> float | None:
    """Job j's cumulative bytes at time t, interpolated between the samples
    around it; None outside them or where they lack the count."""
    pts = [(s["t"], s["bytes"][j]) for s in samples if s["bytes"][j] is not None]
    for (t0, b0), (t1, b1) in zip(pts, pts[1:]):
        if t0 <= t <= t1:
            return b0 + (b1 - b0) * (t - t0) / (t1 - t0) if t1 > t0 else b0
    return None


def steady_intervals(samples: list[dict]) -> list[tuple[float, float, int, int]]:
    """(t0, t1, job 0's bytes, job 1's) between consecutive samples where
    both jobs sent (each at least SENDING of the two's bytes) in it and
    through the RESTART_S around it: a job between two calls (its rank
    checking a result, say) leaves the link to the other, as it should,
    and is left out of the ratio, with its call's tail and its restart."""
    rows = [(a["t"], b["t"], b["bytes"][0] - a["bytes"][0], b["bytes"][1] - a["bytes"][1])
            for a, b in zip(samples, samples[1:])
            if None not in (a["bytes"][0], a["bytes"][1], b["bytes"][0], b["bytes"][1])]
    quiet = [(t0, t1) for t0, t1, d0, d1 in rows
             if min(d0, d1) <= SENDING * (d0 + d1) or d0 + d1 <= 0]
    return [r for r in rows
            if not any(r[0] - RESTART_S < q1 and q0 < r[1] + RESTART_S for q0, q1 in quiet)]


def ratio(samples: list[dict], a: float, b: float) -> float | None:
    """Job 0's bytes over job 1's from a to b (the intervals between samples
    whose middle is in it), while both sent (steady_intervals); None where
    that covers less than half of it or of WINDOW_S."""
    rows = [r for r in steady_intervals(samples) if a <= (r[0] + r[1]) / 2 <= b]
    if sum(t1 - t0 for t0, t1, _, _ in rows) < min(WINDOW_S, b - a) / 2 or not sum(r[3] for r in rows):
        return None
    return sum(r[2] for r in rows) / sum(r[3] for r in rows)


def settle_s(samples: list[dict], change: float, end: float, target: float) -> float | None:
    """How long after `change` the ratio over WINDOW_S came within
    TOLERANCE of `target`, and the ratio over the HOLD_S after it too (or
    until `end`), times where a job was not sending left out; None if never."""
    for t in (s["t"] for s in samples if change < s["t"] <= end):
        now, then = ratio(samples, t - WINDOW_S, t), ratio(samples, t, min(t + HOLD_S, end))
        if now is not None and abs(now / target - 1) <= TOLERANCE and \
                (then is None or abs(then / target - 1) <= TOLERANCE):
            return t - change
    return None


def weighted_figures(samples: list[dict], weights: tuple[float, ...], first_end: float,
                     reweight: tuple[float, ...] | None,
                     change: tuple[float, float] | None) -> dict:
    """The rate ratio of jobs 0 and 1 over the steady part(s), beside their
    weights', and with a change of weights, `change` (when its command
    began, when it returned), how long after the ratio settled: from the
    command's return (the box has the weights; settle_s) and from its start
    (with_command_s)."""
    rows = steady_intervals(samples)
    began = (rows[0][0] if rows else 0.0) + STEADY_AFTER_S
    before_end = change[0] if change is not None else first_end - END_MARGIN_S
    out = {"target": weights[0] / weights[1], "from_s": began, "to_s": before_end,
           "ratio": ratio(samples, began, before_end)}
    if reweight is not None and change is not None:
        after, end = reweight[0] / reweight[1], first_end - END_MARGIN_S
        settle = settle_s(samples, change[1], end, after)
        out["after"] = {"target": after, "from_s": change[1] + STEADY_AFTER_S, "to_s": end,
                        "ratio": ratio(samples, change[1] + STEADY_AFTER_S, end),
                        "settle_s": settle,
                        "with_command_s": None if settle is None else settle + change[1] - change[0]}
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
    ax.set_xlim(left=-STEADY_AFTER_S)        # the sampling began before the start
    ax.set_xlabel("seconds from the common start")
    ax.set_ylabel(f"rate into the box over {WINDOW_S:g} s (Mbit/s)")
    ax.set_title(f"weighted shares, box link {doc['box_rate_mbit']:g} Mbit/s", fontsize=10)
    return save_chart(plt, fig, ax, path)


@contextlib.contextmanager
def watched(lab, weights: tuple[float, ...], reweight: tuple[float, ...] | None, at_s: float,
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
