"""Competing jobs through one box whose link is the bottleneck, under each
of the box's share policies, against the same jobs as independent Gloo
rings (docs/operations.md, "Competing jobs"):

    sudo swml-lab bench --jobs 2x2MiB,2x4MiB,2x8MiB,2x16MiB [--rate 100]
        [--box-rate 100] [--iterations 10] [--share none,fair,weighted,srpt]
        [--reweight W,W..] [--no-gloo] [--out DIR]

SPEC is one NxSIZE[@WEIGHT] a job, comma-separated: N workers allreducing
float32 tensors of SIZE, asking the box for WEIGHT (default 1) at join
(bench/jobs_spec.py). One lab holds every job's workers, each link shaped
to --rate both ways and the box's link to --box-rate (default the same
rate): 8 workers at 100 Mbit/s behind a box at 100 Mbit/s make the box's
link the bottleneck. Every job is a job of its own on the one XDP switch,
started with each --share value in turn (a row of rows each; "none": the
box as it is, no policy, jobs sharing its link as their windows settle;
default: every policy). After a warm-up, every rank of every job waits for
one common instant, then runs its iterations back to back (bench/rank.py);
a job's completion time runs from that instant to the end of its slowest
rank's last iteration.

Each policy prints every job's completion time, the average and the last
(the makespan), the makespan's bound (every job's bytes through the box's
link at its rate, header-adjusted) and the box link's busy fraction: the
bytes its bridge port sent the box from the common start to the last
completion, over what the rate carries in that time. Under `weighted` the
box's per-job byte counters are sampled through the run
(bench/jobs_weighted.py): the rate ratio of jobs 0 and 1 against their
weights', and with --reweight, the weights changed half way to the first
job's end and how long the ratio took to follow. The targets the policies
are held to end the output, PASS or MISS (bench/jobs_targets.py). The
peer: the same jobs as Gloo rings (each job's ranks a gloo group of their
own, all starting together) on the same worker links, which share no link
between jobs; the ratio swml/gloo per job and on the average. Skipped,
saying so, without torch or with --no-gloo. The rows, the command, the samples and the
targets go to a JSON file, a bar chart to a PNG where matplotlib is
installed, and the weighted run's rates over time to another
(jobs_bench.json, jobs_bench.png and jobs_bench_rates.png under
`swml-lab bench --out`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path

from .constants import GLOO_PORT
from .jobs_spec import (
    NO_POLICY,
    WEIGHTED,
    JobsConfig,
    K,
    alone_bound_s,
    ideal_completions_s,
    makespan_bound_s,
    reweight_at_s,
)
from .jobs_targets import mix_of, target_lines, targets
from .jobs_weighted import TOLERANCE, job_name, plot_rates, watched, weighted_figures
from .output import NO_PLOT, pyplot, save_chart, save_doc
from .racks_bench import _torch_missing
from .rank_group import RankGroup

COUNTED = ("packets_sent", "retransmissions")    # a job's ranks' sums (swml; Gloo counts none)
WEIGHT_ENV = "SWML_JOB_WEIGHT"   # the weight a rank asks for at join
START_BYTES_A_S = 64 << 20      # input tensors the ranks make in a second, all together


def _hosts_of(lab, jobs: list) -> list[list]:
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


def start_lead_s(cfg: JobsConfig) -> float:
    """How far ahead the common start is set: every rank makes its input
    tensors when told to run (2 cores, a second or so for 64 MiB in all),
    and a rank that starts late would stretch its job's completion."""
    return 1.0 + sum(j.workers * j.size for j in cfg.jobs) / START_BYTES_A_S


def _race(lab, cfg: JobsConfig, argv_of, env_of=lambda j: None,
          watch=lambda start_at: contextlib.nullcontext({})) -> tuple[list[dict], float, str, dict]:
    """Every job's ranks as groups of their own (job j's with the
    environment env_of(j)), warmed up, then started at one instant: each
    job's completion (s) and largest error, the bytes the box's port sent
    meanwhile, the datapath, and what watch(start_at), a context around the
    timed run, found."""
    groups = []
    try:
        for j, hosts in enumerate(_hosts_of(lab, cfg.jobs)):
            groups.append(RankGroup(lab, argv_of(j, hosts), timeout=300, env=env_of(j), hosts=hosts))
        for g in groups:
            g.start(0, cfg.warmup)
        for g in groups:
            g.collect(600)
        before = _box_port_tx_bytes(lab)
        start_at = time.monotonic() + start_lead_s(cfg)
        for g in groups:
            g.start(cfg.iterations, 0, start_at)
        with watch(start_at) as found:
            answers = [g.collect(1800) for g in groups]
        sent = _box_port_tx_bytes(lab) - before
    finally:
        for g in groups:
            g.close()
    jobs = [{"completion_s": max(r["ends"][-1] for r in ranks) - start_at,
             "rel_err": max(r["rel_err"] or 0.0 for r in ranks),
             **{k: sum(r["counters"].get(k, 0) for r in ranks) for k in COUNTED}}
            for ranks in answers]
    return jobs, sent, groups[0].impl, found


def measure_swml(cfg: JobsConfig, share: str) -> tuple[list[dict], float, str, dict]:
    """The jobs through one XDP switch started with `share` (none: without
    --share); under WEIGHTED each rank asks for its job's weight at join,
    and the rates are sampled (jobs_weighted.watched)."""
    from ..lab import Lab
    from ..lab.cluster import SwitchProcess

    args = ["-k", str(K), "--capacity", f"{cfg.box_rate:g}M"]
    bands = cfg.dscp if share != NO_POLICY else None   # the box marks only under a policy
    if share != NO_POLICY:
        args += ["--share", share, *(["--dscp", ",".join(map(str, bands))] if bands else [])]
    weights = tuple(j.weight for j in cfg.jobs)
    workers = sum(j.workers for j in cfg.jobs)
    with Lab(workers=workers, rate_mbit=cfg.rate_mbit, box_rate_mbit=cfg.box_rate,
             dscp_bands=bands) as lab, SwitchProcess(lab, args):
        def argv_of(j, hosts):
            return lambda rank, host: [
                "--system", "swml", "--backend", "auto", "--switch", lab.switch.ip,
                "--job", job_name(j), "--rank", str(rank), "--world", str(len(hosts)),
                "--size", str(cfg.jobs[j].size), "--k", str(K), "--check"]
        if share != WEIGHTED:
            return _race(lab, cfg, argv_of)
        return _race(lab, cfg, argv_of,
                     lambda j: {**os.environ, WEIGHT_ENV: str(weights[j])},
                     lambda start_at: watched(lab, weights, cfg.reweight, reweight_at_s(cfg),
                                              start_at))


def measure_gloo(cfg: JobsConfig) -> tuple[list[dict], float, str, dict]:
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


def _vs_gloo(swml: dict, gloo: dict | None, key: str) -> str:
    """Gloo's figure beside swml's, and their ratio; nothing without Gloo."""
    if gloo is None:
        return ""
    return f"  gloo {gloo[key]:7.2f} s  swml/gloo {swml[key] / gloo[key]:5.2f}x"


def _rates(cfg: JobsConfig, jobs: list[dict], found: dict, out) -> dict | None:
    """The weighted run's samples and what they say, printed; None where not sampled."""
    if "samples" not in found:
        return None
    rates = {"samples": found["samples"], "error": found["error"],
             **{k: found[k] for k in ("change_s", "command_s", "refused") if k in found}}
    for said in [found["error"], *found.get("refused", [])]:
        if said:
            out(f"    rates: {said}")
    if len(cfg.jobs) < 2:
        return rates
    fig = weighted_figures(found["samples"], tuple(j.weight for j in cfg.jobs),
                           min(j["completion_s"] for j in jobs),
                           cfg.reweight if not found.get("refused") else None,
                           (found["change_s"], found["change_s"] + found["command_s"])
                           if "change_s" in found else None)
    rates["figures"] = fig
    out(f"    rates job 0 : job 1  {_ratio(fig)}")
    after = fig.get("after")
    if after:
        took = ("never" if after["settle_s"] is None else f"{after['settle_s']:.2f} s after the "
                f"command returned, {after['with_command_s']:.2f} s after it began")
        out(f"    weights set to {':'.join(map(str, cfg.reweight))} at {found['change_s']:.2f} s "
            f"(swml-switch job took {found['command_s']:.2f} s): {_ratio(after)}; within "
            f"{100 * TOLERANCE:g}% of {after['target']:g}:1 {took}")
    return rates


def _ratio(fig: dict) -> str:
    r = fig["ratio"]
    got = f"{r:.2f}:1" if r is not None else "unmeasured (too short, or no per-job counters)"
    return f"{got} over {fig['from_s']:.2f}-{fig['to_s']:.2f} s (weights {fig['target']:g}:1)"


def run_jobs_bench(cfg: JobsConfig, out=print) -> dict:
    """The rows, printed as they come, and the targets; the document --json gets."""
    out(f"jobs {cfg.spec} through one box: worker links {cfg.rate_mbit:g} Mbit/s, the box's "
        f"{cfg.box_rate:g} Mbit/s (each way), k={K}, {cfg.warmup} warm-up + {cfg.iterations} "
        f"iterations each, all starting together")
    gloo, missing = None, "--no-gloo" if not cfg.gloo else _torch_missing()
    if missing:
        out(f"  gloo rings: not run ({missing})")
    else:
        jobs, _, impl, _ = measure_gloo(cfg)
        gloo = {"impl": impl, "jobs": jobs, **_summary(jobs)}
    bound, ideal = makespan_bound_s(cfg), ideal_completions_s(cfg)
    for name, done in (ideal or {}).items():
        out(f"  ideal {name:<4} (the link never idle): jobs " + ", ".join(f"{t:.2f}" for t in done)
            + f" s, average {sum(done) / len(done):.2f} s, last {max(done):.2f} s")
    policies = []
    for share in cfg.shares:
        jobs, sent, impl, found = measure_swml(cfg, share)
        s = _summary(jobs)
        busy = sent * 8 / (cfg.box_rate * 1e6 * s["last_s"])
        out(f"  share {share} [{impl}]")
        for i, (spec_i, j) in enumerate(zip(cfg.jobs, jobs)):
            vs = (f"  gloo {gloo['jobs'][i]['completion_s']:7.2f} s  swml/gloo "
                  f"{j['completion_s'] / gloo['jobs'][i]['completion_s']:5.2f}x") if gloo else ""
            out(f"    job {i} {spec_i.label:<12} done {j['completion_s']:7.2f} s  alone's bound "
                f"{alone_bound_s(cfg, spec_i):6.2f} s{vs}  [{j['retransmissions']} of "
                f"{j['packets_sent']} packets resent, error {j['rel_err']:.1e}]")
        out(f"    average            {s['average_s']:7.2f} s{_vs_gloo(s, gloo, 'average_s')}")
        out(f"    last               {s['last_s']:7.2f} s  bound {bound:6.2f} s "
            f"({100 * bound / s['last_s']:5.1f}%){_vs_gloo(s, gloo, 'last_s')}")
        out(f"    box link busy      {100 * busy:5.1f}% ({sent / 2**20:.1f} MiB into the box "
            f"over {s['last_s']:.2f} s at {cfg.box_rate:g} Mbit/s)")
        policies.append({"share": share, "impl": impl, "jobs": jobs, **s,
                         "box_bytes": sent, "box_busy": busy, "rates": _rates(cfg, jobs, found, out)})
    if gloo:
        out(f"  gloo rings [{gloo['impl']}]: " + ", ".join(
            f"job {i} {j['completion_s']:.2f} s" for i, j in enumerate(gloo["jobs"])))
    doc = {"jobs": [dataclasses.asdict(j) for j in cfg.jobs], "rate_mbit": cfg.rate_mbit,
           "box_rate_mbit": cfg.box_rate, "k": K, "iterations": cfg.iterations,
           "warmup": cfg.warmup, "makespan_bound_s": bound,
           "alone_bound_s": [alone_bound_s(cfg, j) for j in cfg.jobs], "ideal_s": ideal,
           "reweight": cfg.reweight, "command": cfg.command, "policies": policies, "gloo": gloo}
    doc["targets"] = targets(doc)
    for line in target_lines(doc["targets"], mix_of(cfg.spec, cfg.iterations)):
        out(line)
    save_doc(doc, cfg.json_path, cfg.png_path, plot, out)
    if cfg.png_path and any(p["rates"] for p in policies):
        path = Path(cfg.png_path)
        out(plot_rates(doc, path.with_name(f"{path.stem}_rates{path.suffix}")))
    return doc


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

