"""`swml-lab bench --jobs SPEC`: competing jobs through one box
(bench/jobs_bench.py), its options checked before anything is built."""
from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import click

from .lab_options import run_rows

# What a sweep has that the jobs' rows do not take (SPEC says where the workers are).
NOT_WITH_JOBS = ("workers", "size", "wait_quiet", "queue", "losses", "ks", "systems", "job_slots",
                 "no_check", "env", "fanout", "boxes", "ports", "collective", "racks", "per_rack",
                 "uplink_rate")


def bench_jobs(spec: str, share: str | None, reweight: str | None, rate, box_rate, iterations: int,
               warmup: int, out_dir: str | None, gloo: bool = True,
               dscp: tuple[int, ...] | None = None) -> None:
    """The jobs' rows, printed; JSON and PNG under out_dir."""
    from switchml_xdp.bench.jobs_bench import run_jobs_bench
    from switchml_xdp.bench.jobs_spec import (
        NO_POLICY,
        JobsConfig,
        parse_jobs,
        parse_reweight,
        parse_shares,
        switch_lacks_shares,
    )

    ctx = click.get_current_context()
    for param in ctx.command.params:
        if param.name in NOT_WITH_JOBS and \
                ctx.get_parameter_source(param.name) == click.core.ParameterSource.COMMANDLINE:
            raise click.BadParameter("not with --jobs", param_hint=max(param.opts, key=len))
    try:
        jobs = parse_jobs(spec)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--jobs") from None
    try:
        shares = parse_shares(share)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--share") from None
    try:
        weights = None if reweight is None else parse_reweight(reweight, jobs, shares)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--reweight") from None
    lacks = switch_lacks_shares() if shares != (NO_POLICY,) else None
    if lacks:
        raise click.BadParameter(f"{lacks}; --share none runs without", param_hint="--share")
    if ctx.get_parameter_source("iterations") != click.core.ParameterSource.COMMANDLINE:
        iterations = 10
    out = Path(out_dir or f"swml-lab-bench-jobs-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    cfg = JobsConfig(jobs, rate or 100.0, box_rate, iterations, warmup, shares,
                     str(out / "jobs_bench.json"), str(out / "jobs_bench.png"),
                     "swml-lab bench" + "".join(f" {shlex.quote(a)}" for a in sys.argv[2:]),
                     gloo=gloo, reweight=weights, dscp=dscp)
    run_rows(run_jobs_bench, cfg)
