"""Competing jobs through one box whose link is the bottleneck, against the
same jobs as independent Gloo rings (docs/operations.md, "Competing jobs
(today, no policy)"):

    sudo swml-lab bench --jobs 2x2MiB,2x4MiB,2x8MiB,2x16MiB [--rate 100]
        [--box-rate 100] [--iterations 10] [--share none] [--out DIR]

SPEC is one NxSIZE a job, comma-separated: N workers allreducing float32
tensors of SIZE. One lab holds every job's workers, each link shaped to
--rate both ways and the box's link to --box-rate (default the same rate):
8 workers at 100 Mbit/s behind a box at 100 Mbit/s make the box's link the
bottleneck. Every job is a job of its own on the one XDP switch, started
with each --share value in turn (a row of rows each; "none": the box as it
is, jobs sharing its link as their windows settle). After a warm-up, every
rank of every job waits for one common instant, then runs its iterations
back to back (bench/rank.py); a job's completion time runs from that
instant to the end of its slowest rank's last iteration.

Each policy prints every job's completion time, the average and the last
(the makespan), the makespan's bound (every job's bytes through the box's
link at its rate, header-adjusted) and the box link's busy fraction: the
bytes its bridge port sent the box from the common start to the last
completion, over what the rate carries in that time. The peer: the same
jobs as Gloo rings (each job's ranks a gloo group of their own, all
starting together) on the same worker links, which share no link between
jobs; the ratio swml/gloo per job and on the average. Skipped, saying so,
without torch. The rows, the command and the figures go to a JSON file, and
a bar chart to a PNG where matplotlib is installed (jobs_bench.json and
jobs_bench.png under `swml-lab bench --out`).
"""
from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

from .. import wire
from ..lab.addressing import MAX_WORKERS
from .allreduce_bench import parse_size
from .constants import GLOO_PORT, boxes_bound_s, swml_bound_mbps
from .output import NO_PLOT, pyplot, save_chart, save_doc
from .racks_bench import _torch_missing
from .rank_group import RankGroup

K = 256
MAX_JOBS = 16
MAX_JOB_SIZE = 1 << 30
DEFAULT_SPEC = "2x2MiB,2x4MiB,2x8MiB,2x16MiB"
NO_POLICY = "none"        # the box as it is: no --share given to swml-switch up
# What --share takes: NO_POLICY and each policy `swml-switch up --share` offers
# (a policy added to the switch is added here, and becomes a row of rows).
SHARES = (NO_POLICY,)
COUNTED = ("packets_sent", "retransmissions")    # a job's ranks' sums (swml; Gloo counts none)
_JOB = re.compile(r"^(\d+)\s*[xX*]\s*(\S+)$")


@dataclasses.dataclass(frozen=True)
class JobSpec:
    workers: int
    size: int           # bytes of float32

    @property
    def label(self) -> str:
        return f"{self.workers}x{self.size / 2**20:g}MiB"


def parse_jobs(spec: str) -> list[JobSpec]:
    """'2x2MiB,2x4MiB' -> the jobs; ValueError with a one-line reason."""
    items = [s.strip() for s in str(spec).split(",")]
    if not spec or not str(spec).strip() or any(not s for s in items):
        raise ValueError(f"jobs are NxSIZE, comma-separated (e.g. {DEFAULT_SPEC}), not {spec!r}")
    if len(items) > MAX_JOBS:
        raise ValueError(f"at most {MAX_JOBS} jobs, not {len(items)}")
    jobs = []
    for item in items:
        m = _JOB.match(item)
        if not m:
            raise ValueError(f"a job is NxSIZE (workers x float32 tensor size, e.g. 2x4MiB), "
                             f"not {item!r}")
        n, size = int(m.group(1)), parse_size(m.group(2))
        if not 2 <= n <= wire.MAX_WORLD:
            raise ValueError(f"a job has 2..{wire.MAX_WORLD} workers, not {n} ({item!r})")
        if size > MAX_JOB_SIZE:
            raise ValueError(f"a job's tensor is at most 1 GiB, not {item!r}")
        jobs.append(JobSpec(n, size))
    if sum(j.workers for j in jobs) > MAX_WORKERS:
        raise ValueError(f"the jobs have {sum(j.workers for j in jobs)} workers, the lab at most "
                         f"{MAX_WORKERS}")
    return jobs


def parse_shares(text: str) -> tuple[str, ...]:
    """'none,fair' -> the policies, each one the box offers; ValueError otherwise."""
    shares = tuple(s.strip().lower() for s in str(text).split(","))
    bad = [s for s in shares if s not in SHARES]
    if bad or len(set(shares)) < len(shares):
        raise ValueError(f"--share takes {', '.join(SHARES)}, each once; not {text!r}")
    return shares


@dataclasses.dataclass
class JobsConfig:
    jobs: list[JobSpec]
    rate_mbit: float = 100.0
    box_rate_mbit: float | None = None     # None: the workers' rate
    iterations: int = 10
    warmup: int = 1
    shares: tuple[str, ...] = (NO_POLICY,)
    json_path: str | None = None
    png_path: str | None = None
    command: str = ""
    gloo: bool = True

    @property
    def box_rate(self) -> float:
        return self.box_rate_mbit or self.rate_mbit


def alone_bound_s(cfg: JobsConfig, job: JobSpec) -> float:
    """A job's iterations alone on the box: max(S / rate, N S / box rate), header-adjusted."""
    return cfg.iterations * boxes_bound_s(job.size, job.workers, cfg.rate_mbit, [cfg.box_rate], K)


def makespan_bound_s(cfg: JobsConfig) -> float:
    """Every job's every byte into the box through its link at its rate."""
    return sum(_link_time_s(cfg, j) for j in cfg.jobs)


def _link_time_s(cfg: JobsConfig, job: JobSpec) -> float:
    """A job's bytes into the box at the box link's whole rate, header-adjusted."""
    return job.workers * job.size * cfg.iterations * 8 / (swml_bound_mbps(cfg.box_rate, K) * 1e6)


def ideal_completions_s(cfg: JobsConfig) -> dict[str, list[float]] | None:
    """Each job's completion on an ideal box whose link never idles: "fair",
    equal rates for the jobs with data (processor sharing), and "srpt", the
    smallest first (all start together, so shortest job first). None where a
    job alone cannot fill the link (its workers' links slower than the box's):
    these figures assume every job can."""
    if any(j.workers * cfg.rate_mbit < cfg.box_rate for j in cfg.jobs):
        return None
    work = [_link_time_s(cfg, j) for j in cfg.jobs]
    order = sorted(range(len(work)), key=work.__getitem__)
    fair, srpt, t, done, before = [0.0] * len(work), [0.0] * len(work), 0.0, 0.0, 0.0
    for rank, i in enumerate(order):
        t += (work[i] - before) * (len(work) - rank)     # the jobs left share the link
        fair[i], before = t, work[i]
        done += work[i]
        srpt[i] = done
    return {"fair": fair, "srpt": srpt}


def _hosts_of(lab, jobs: list[JobSpec]) -> list[list]:
    """The lab's workers, dealt to the jobs in order."""
    out, at = [], 0
    for j in jobs:
        out.append(lab.workers[at:at + j.workers])
        at += j.workers
    return out


def _box_port_tx_bytes(lab) -> int:
    """What the bridge sent the box: the bottleneck direction of its link."""
    from ..lab import netns

    out = netns.run_in(lab.bridge_ns, ["ip", "-s", "-j", "link", "show", "dev", lab.switch.peer],
                       capture_output=True, text=True).stdout
    return json.loads(out)[0]["stats64"]["tx"]["bytes"]


def _race(lab, cfg: JobsConfig, argv_of) -> tuple[list[dict], float, str]:
    """Every job's ranks as groups of their own, warmed up, then started at
    one instant: each job's completion (s) and largest error, the bytes the
    box's port sent meanwhile, and the datapath."""
    groups = []
    try:
        for j, hosts in enumerate(_hosts_of(lab, cfg.jobs)):
            groups.append(RankGroup(lab, argv_of(j, hosts), timeout=300, hosts=hosts))
        for g in groups:
            g.start(0, cfg.warmup)
        for g in groups:
            g.collect(600)
        before = _box_port_tx_bytes(lab)
        start_at = time.monotonic() + 0.5
        for g in groups:
            g.start(cfg.iterations, 0, start_at)
        answers = [g.collect(1800) for g in groups]
        sent = _box_port_tx_bytes(lab) - before
    finally:
        for g in groups:
            g.close()
    jobs = [{"completion_s": max(r["ends"][-1] for r in ranks) - start_at,
             "rel_err": max(r["rel_err"] or 0.0 for r in ranks),
             **{k: sum(r["counters"].get(k, 0) for r in ranks) for k in COUNTED}}
            for ranks in answers]
    return jobs, sent, groups[0].impl


def measure_swml(cfg: JobsConfig, share: str) -> tuple[list[dict], float, str]:
    """The jobs through one XDP switch started with `share`."""
    from ..lab import Lab
    from ..lab.cluster import SwitchProcess

    args = ["-k", str(K), "--capacity", f"{cfg.box_rate:g}M"]
    if share != NO_POLICY:
        args += ["--share", share]
    workers = sum(j.workers for j in cfg.jobs)
    with Lab(workers=workers, rate_mbit=cfg.rate_mbit, box_rate_mbit=cfg.box_rate) as lab, \
            SwitchProcess(lab, args):
        def argv_of(j, hosts):
            return lambda rank, host: [
                "--system", "swml", "--backend", "auto", "--switch", lab.switch.ip,
                "--job", f"job{j}", "--rank", str(rank), "--world", str(len(hosts)),
                "--size", str(cfg.jobs[j].size), "--k", str(K), "--check"]
        return _race(lab, cfg, argv_of)


def measure_gloo(cfg: JobsConfig) -> tuple[list[dict], float, str]:
    """The same jobs as Gloo rings on the same worker links, no box up."""
    from ..lab import Lab

    workers = sum(j.workers for j in cfg.jobs)
    with Lab(workers=workers, rate_mbit=cfg.rate_mbit, box_rate_mbit=cfg.box_rate) as lab:
        def argv_of(j, hosts):
            return lambda rank, host: [
                "--system", "gloo", "--rank", str(rank), "--world", str(len(hosts)),
                "--size", str(cfg.jobs[j].size), "--master", hosts[0].ip,
                "--master-port", str(GLOO_PORT), "--iface", host.iface, "--check"]
        return _race(lab, cfg, argv_of)


def _summary(jobs: list[dict]) -> dict:
    done = [j["completion_s"] for j in jobs]
    return {"average_s": sum(done) / len(done), "last_s": max(done)}


def run_jobs_bench(cfg: JobsConfig, out=print) -> dict:
    """The rows, printed as they come; the document --json gets."""
    spec = ",".join(j.label for j in cfg.jobs)
    out(f"jobs {spec} through one box: worker links {cfg.rate_mbit:g} Mbit/s, the box's "
        f"{cfg.box_rate:g} Mbit/s (each way), k={K}, {cfg.warmup} warm-up + {cfg.iterations} "
        f"iterations each, all starting together")
    gloo = None
    if cfg.gloo and _torch_missing():
        out(f"  gloo rings: not run ({_torch_missing()})")
    elif cfg.gloo:
        jobs, _, impl = measure_gloo(cfg)
        gloo = {"impl": impl, "jobs": jobs, **_summary(jobs)}
    bound, ideal = makespan_bound_s(cfg), ideal_completions_s(cfg)
    for name, done in (ideal or {}).items():
        out(f"  ideal {name:<4} (the link never idle): jobs " + ", ".join(f"{t:.2f}" for t in done)
            + f" s, average {sum(done) / len(done):.2f} s, last {max(done):.2f} s")
    policies = []
    for share in cfg.shares:
        jobs, sent, impl = measure_swml(cfg, share)
        s = _summary(jobs)
        busy = sent * 8 / (cfg.box_rate * 1e6 * s["last_s"])
        policies.append({"share": share, "impl": impl, "jobs": jobs, **s,
                         "box_bytes": sent, "box_busy": busy})
        out(f"  share {share} [{impl}]")
        for i, (spec_i, j) in enumerate(zip(cfg.jobs, jobs)):
            vs = (f"  gloo {gloo['jobs'][i]['completion_s']:7.2f} s  swml/gloo "
                  f"{j['completion_s'] / gloo['jobs'][i]['completion_s']:5.2f}x") if gloo else ""
            out(f"    job {i} {spec_i.label:<12} done {j['completion_s']:7.2f} s  alone's bound "
                f"{alone_bound_s(cfg, spec_i):6.2f} s{vs}  [{j['retransmissions']} of "
                f"{j['packets_sent']} packets resent, error {j['rel_err']:.1e}]")
        vs = f"  gloo {gloo['average_s']:7.2f} s  swml/gloo {s['average_s'] / gloo['average_s']:5.2f}x"
        out(f"    average            {s['average_s']:7.2f} s{vs if gloo else ''}")
        vs = f"  gloo {gloo['last_s']:7.2f} s  swml/gloo {s['last_s'] / gloo['last_s']:5.2f}x"
        out(f"    last               {s['last_s']:7.2f} s  bound {bound:6.2f} s "
            f"({100 * bound / s['last_s']:5.1f}%){vs if gloo else ''}")
        out(f"    box link busy      {100 * busy:5.1f}% ({sent / 2**20:.1f} MiB into the box "
            f"over {s['last_s']:.2f} s at {cfg.box_rate:g} Mbit/s)")
    if gloo:
        out(f"  gloo rings [{gloo['impl']}]: " + ", ".join(
            f"job {i} {j['completion_s']:.2f} s" for i, j in enumerate(gloo["jobs"])))
    doc = {"jobs": [dataclasses.asdict(j) for j in cfg.jobs], "rate_mbit": cfg.rate_mbit,
           "box_rate_mbit": cfg.box_rate, "k": K, "iterations": cfg.iterations,
           "warmup": cfg.warmup, "makespan_bound_s": bound,
           "alone_bound_s": [alone_bound_s(cfg, j) for j in cfg.jobs], "ideal_s": ideal,
           "command": cfg.command, "policies": policies, "gloo": gloo}
    return save_doc(doc, cfg.json_path, cfg.png_path, plot, out)


def plot(doc: dict, path: Path) -> str:
    """Each job's completion, a group of bars a job (a bar a policy, Gloo's
    last); what was written, in a line."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    series = [(f"swml, share {p['share']}", p["jobs"]) for p in doc["policies"]]
    if doc["gloo"]:
        series.append(("gloo rings", doc["gloo"]["jobs"]))
    labels = [f"{j['workers']}x{j['size'] / 2**20:g}MiB" for j in doc["jobs"]]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(1.2 * len(labels) + 3, 4))
    for s, (name, jobs) in enumerate(series):
        ax.bar([i + s * width for i in range(len(labels))], [j["completion_s"] for j in jobs],
               width, label=name)
    ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(labels))], labels)
    ax.axhline(doc["makespan_bound_s"], color="black", linestyle=":", label="makespan bound")
    ax.set_ylabel("completion time from the common start (s)")
    ax.set_title(f"competing jobs, worker links {doc['rate_mbit']:g} Mbit/s, box "
                 f"{doc['box_rate_mbit']:g} Mbit/s, {doc['iterations']} iterations", fontsize=10)
    return save_chart(plt, fig, ax, path)

