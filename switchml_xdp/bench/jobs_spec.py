"""What `swml-lab bench --jobs` runs, checked before anything is built: the
mix of jobs (NxSIZE[@WEIGHT] each), the box's share policies, the weights
set mid-run, and what an ideal box makes of the mix (its bounds and
completions), the figures the measured ones are compared against
(bench/jobs_bench.py; docs/operations.md, "Competing jobs")."""
from __future__ import annotations

import dataclasses
import re

from .. import wire
from ..lab.addressing import MAX_WORKERS
from ..switch.share_policy import parse_weight as weight_rule
from ..switch.shares import DEFAULT_MAX_WEIGHT
from .allreduce_bench import parse_size
from .constants import boxes_bound_s, swml_bound_mbps

K = 256
MAX_JOBS = 16
MAX_JOB_SIZE = 1 << 30
# The most a job's weight may be here: `swml-switch up --max-weight`'s default,
# which the bench leaves as it is (a join asking for more would be capped).
MAX_WEIGHT = DEFAULT_MAX_WEIGHT   # what the lab's box takes (its default --max-weight)
DEFAULT_SPEC = "2x2MiB,2x4MiB,2x8MiB,2x16MiB"
NO_POLICY = "none"        # the box as it is: no --share given to swml-switch up
WEIGHTED = "weighted"     # the policy under which the jobs' weights count
# What --share takes: NO_POLICY and each policy `swml-switch up --share` offers
# (a policy added to the switch is added here, and becomes a row of rows).
SHARES = (NO_POLICY, "fair", WEIGHTED, "srpt")
_JOB = re.compile(r"^(\d+)\s*[xX*]\s*([^@\s]+)\s*(?:@\s*(\S*))?$")


@dataclasses.dataclass(frozen=True)
class JobSpec:
    workers: int
    size: int           # bytes of float32
    weight: float = 1   # its share of the box under WEIGHTED, asked for at join

    @property
    def label(self) -> str:
        return f"{self.workers}x{self.size / 2**20:g}MiB" + (f"@{self.weight}" if self.weight != 1 else "")


def parse_weight(text: str, what: str) -> float:
    """'3' -> 3, '1.5' -> 1.5; ValueError in one line for what is not a
    number above zero and at most MAX_WEIGHT (the switch's own rule)."""
    t = str(text).strip()
    try:
        w = weight_rule(t, cap=MAX_WEIGHT)
    except ValueError:
        raise ValueError(f"a weight is a number above zero, at most {MAX_WEIGHT:g} (the "
                         f"switch's --max-weight), not {t!r} ({what})") from None
    return int(w) if w.is_integer() else w


def parse_jobs(spec: str) -> list[JobSpec]:
    """'2x2MiB,2x4MiB@3' -> the jobs; ValueError with a one-line reason."""
    items = [s.strip() for s in str(spec).split(",")]
    if not spec or not str(spec).strip() or any(not s for s in items):
        raise ValueError(f"jobs are NxSIZE[@WEIGHT], comma-separated (e.g. {DEFAULT_SPEC}), "
                         f"not {spec!r}")
    if len(items) > MAX_JOBS:
        raise ValueError(f"at most {MAX_JOBS} jobs, not {len(items)}")
    jobs = []
    for item in items:
        m = _JOB.match(item)
        if not m:
            raise ValueError(f"a job is NxSIZE[@WEIGHT] (workers x float32 tensor size, e.g. "
                             f"2x4MiB or 2x4MiB@3), not {item!r}")
        n, size = int(m.group(1)), parse_size(m.group(2))
        if not 2 <= n <= wire.MAX_WORLD:
            raise ValueError(f"a job has 2..{wire.MAX_WORLD} workers, not {n} ({item!r})")
        if size > MAX_JOB_SIZE:
            raise ValueError(f"a job's tensor is at most 1 GiB, not {item!r}")
        weight = 1 if m.group(3) is None else parse_weight(m.group(3), item)
        jobs.append(JobSpec(n, size, weight))
    if sum(j.workers for j in jobs) > MAX_WORKERS:
        raise ValueError(f"the jobs have {sum(j.workers for j in jobs)} workers, the lab at most "
                         f"{MAX_WORKERS}")
    return jobs


def parse_shares(text: str | None) -> tuple[str, ...]:
    """'none,fair' -> the policies, each one the box offers; None: all of
    them; ValueError otherwise."""
    if text is None:
        return SHARES
    shares = tuple(s.strip().lower() for s in str(text).split(","))
    bad = [s for s in shares if s not in SHARES]
    if bad or len(set(shares)) < len(shares):
        raise ValueError(f"--share takes {', '.join(SHARES)}, each once; not {text!r}")
    return shares


def parse_reweight(text: str, jobs: list[JobSpec], shares: tuple[str, ...]) -> tuple[float, ...]:
    """'1,1' -> the weights every job gets mid-run under WEIGHTED, one a job;
    ValueError in one line otherwise."""
    if WEIGHTED not in shares:
        raise ValueError(f"--reweight needs the {WEIGHTED} policy in --share")
    items = str(text).split(",")
    if len(items) != len(jobs):
        raise ValueError(f"--reweight takes one weight a job ({len(jobs)}), not {text!r}")
    weights = tuple(parse_weight(w, "--reweight") for w in items)
    if weights == tuple(j.weight for j in jobs):
        raise ValueError(f"--reweight {text!r} is the weights the jobs already have")
    return weights


def switch_lacks_shares() -> str | None:
    """Why the switch here cannot run the policies (its `up` has no --share), or None."""
    from ..cli import switch as switch_cli

    if any(p.name == "share" for p in switch_cli.up.params):
        return None
    return "this swml-switch has no --share (the policies fair, weighted and srpt need it)"


@dataclasses.dataclass
class JobsConfig:
    jobs: list[JobSpec]
    rate_mbit: float = 100.0
    box_rate_mbit: float | None = None     # None: the workers' rate
    iterations: int = 10
    warmup: int = 1
    shares: tuple[str, ...] = SHARES
    json_path: str | None = None
    png_path: str | None = None
    command: str = ""
    gloo: bool = True
    reweight: tuple[float, ...] | None = None   # under WEIGHTED, the jobs' weights from mid-run on
    dscp: tuple[int, ...] | None = None   # under a policy, the box's --dscp and the lab's bands

    @property
    def box_rate(self) -> float:
        return self.box_rate_mbit or self.rate_mbit

    @property
    def spec(self) -> str:
        return ",".join(j.label for j in self.jobs)


def alone_bound_s(cfg: JobsConfig, job: JobSpec) -> float:
    """A job's iterations alone on the box: max(S / rate, N S / box rate), header-adjusted."""
    return cfg.iterations * boxes_bound_s(job.size, job.workers, cfg.rate_mbit, [cfg.box_rate], K)


def makespan_bound_s(cfg: JobsConfig) -> float:
    """Every job's every byte into the box through its link at its rate."""
    return sum(_link_time_s(cfg, j) for j in cfg.jobs)


def _link_time_s(cfg: JobsConfig, job: JobSpec) -> float:
    """A job's bytes into the box at the box link's whole rate, header-adjusted."""
    return job.workers * job.size * cfg.iterations * 8 / (swml_bound_mbps(cfg.box_rate, K) * 1e6)


def shared_link_s(work: list[float], weights: list[float]) -> list[float]:
    """When each job is done on a link shared by weight among the jobs with
    work left (each job's work in seconds of the whole link)."""
    left, done, t = list(work), [0.0] * len(work), 0.0
    active = set(range(len(work)))
    while active:
        total = sum(weights[i] for i in active)
        first = min(active, key=lambda i: left[i] / weights[i])
        dt = left[first] * total / weights[first]
        t += dt
        for i in list(active):
            left[i] -= dt * weights[i] / total
            if i == first or left[i] <= 1e-12 * work[i]:
                done[i] = t
                active.discard(i)
    return done


def ideal_completions_s(cfg: JobsConfig) -> dict[str, list[float]] | None:
    """Each job's completion on an ideal box whose link never idles: "fair",
    equal rates for the jobs with data (processor sharing), "srpt", the
    smallest first (all start together, so shortest job first), and
    "weighted" where the jobs' weights differ (rates by weight). None where a
    job alone cannot fill the link (its workers' links slower than the box's):
    these figures assume every job can."""
    if any(j.workers * cfg.rate_mbit < cfg.box_rate for j in cfg.jobs):
        return None
    work = [_link_time_s(cfg, j) for j in cfg.jobs]
    srpt, done = [0.0] * len(work), 0.0
    for i in sorted(range(len(work)), key=work.__getitem__):
        done += work[i]
        srpt[i] = done
    out = {"fair": shared_link_s(work, [1.0] * len(work)), "srpt": srpt}
    if len({j.weight for j in cfg.jobs}) > 1:
        out[WEIGHTED] = shared_link_s(work, [float(j.weight) for j in cfg.jobs])
    return out


def reweight_at_s(cfg: JobsConfig) -> float:
    """When, from the common start, the weights change (--reweight): half way
    to the first job's end on an ideal box with the jobs' weights (its
    bound alone where there is no ideal box), so that the rates run steady
    on both sides of the change."""
    ideal = ideal_completions_s(cfg)
    if ideal is None:
        return min(alone_bound_s(cfg, j) for j in cfg.jobs) / 2
    return min(ideal.get(WEIGHTED, ideal["fair"])) / 2
