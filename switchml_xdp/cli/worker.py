"""`swml-worker`: a worker of a switchml-xdp job, from the command line."""
from __future__ import annotations

import contextlib
import json
import sys

import click

from .. import wire
from ..bench import allreduce_bench
from . import join_progress
from .common import CONTEXT, Boxes, Sweep, allreduce_options, version_option


@click.group(context_settings=CONTEXT)
@version_option
def main() -> None:
    """switchml-xdp worker tools."""


@main.command(epilog=allreduce_bench.COLUMNS_HELP)
@click.option("--switch", "boxes", required=True, type=Boxes(),
              help="the switch's IPv4 address (or a host name that has one); several boxes "
                   "comma-separated: the job joins each, and every tensor is split over them by "
                   "their capacity (docs/scale-out.md)")
@click.option("--job", required=True, help="job name (the same on every rank)")
@click.option("--rank", required=True, type=click.IntRange(0, None),
              help="this worker's rank, 0..WORLD-1 (each rank of the job once)")
@click.option("--world", required=True, type=click.IntRange(1, None),
              help="number of ranks in the job (the same on every rank)")
@allreduce_options("64MiB", iterations=10, warmup=2, iterations_flags=("--iterations", "-n"))
@click.option("--sweep", type=Sweep(), is_flag=False, default=None,
              flag_value=allreduce_bench.DEFAULT_SWEEP,
              help="every size from MIN to MAX, each FACTOR (2) times the last, instead of --size, "
                   f"as nccl-tests prints them (time, algbw, busbw); alone: "
                   f"{allreduce_bench.DEFAULT_SWEEP}")
@click.option("--op", default="sum", show_default=True, type=click.Choice(list(wire.OPS)),
              help="the reduction: every element's sum, minimum or maximum over the ranks")
@click.option("--precision", default="32", show_default=True, type=click.Choice(["32", "16"]),
              help="16: the 16-bit block format (float32 sum only; docs/quantization.md)")
@click.option("--iface", default=None, help="interface towards the switch [default: from the route]")
@click.option("--port", default=wire.DEFAULT_PORT, show_default=True, type=click.IntRange(1, 65535),
              help="this worker's UDP port (the same on every rank)")
@click.option("--lanes", default=1, show_default=True, type=click.IntRange(1, wire.MAX_LANES),
              help="split the stream into LANES lanes, a power of two, the same on every rank: "
                   "a socket and a thread each, on ports PORT..PORT+LANES-1 (udp; afxdp where the "
                   "NIC steers port PORT+q to queue q)")
@click.option("--control-port", default=wire.DEFAULT_CONTROL_PORT, show_default=True,
              type=click.IntRange(1, 65535), help="the switch's TCP control port")
@click.option("--join-timeout", default=60.0, show_default=True, type=click.FloatRange(0.1, 600),
              help="seconds to wait at the switch for every rank to join")
@click.option("--token", envvar="SWML_TOKEN", default=None,
              help="the job's secret, the same on every rank (or $SWML_TOKEN, which other users "
                   "cannot read in ps); without one the job is open to anyone")
@click.option("--verify", is_flag=True, help="check every element against the exact result")
@click.option("--baseline", type=click.Choice(["raw"]), default=None,
              help="raw: then the path's ceiling, a raw AF_XDP ping-pong of frames of the job's "
                   "size through the reflector at the switch's address (`swml-switch reflect "
                   "IFACE` on the box once the switch is down; waited for up to --join-timeout), "
                   "and swml's packets/s as a fraction of it (docs/performance.md)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of a table")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar")
def bench(boxes, job, rank, world, size, sweep, iterations, warmup, dtype, op, precision,
          backend, iface, port, lanes, control_port, join_timeout, token, verify, baseline,
          as_json, quiet):
    """Time allreduce of one tensor through the switch, as rank RANK of WORLD.

    Start it on every rank; each waits at the switch until all WORLD ranks have
    joined, then all run the same allreduces, and each prints one row. One
    host runs one rank of a job (the switch sends results to one address and
    port per member); a second job on the same host needs another --port."""
    from .. import Worker
    from ..client.control import ControlError, JobAborted

    if rank >= world:
        raise click.BadParameter(f"rank {rank} must be < world {world}", param_hint="--rank")
    if baseline:   # before the allreduces: the raw path needs the engine whatever the backend
        from ..client.afxdp_backend import unavailable_reason
        if (why := unavailable_reason()):
            raise click.ClickException(f"--baseline raw needs the AF_XDP engine: {why}")
    switch_ip = boxes[0]   # where the join's progress is asked
    waiting = contextlib.nullcontext()
    if not quiet and world > 1:
        others = world - 1
        click.echo(f"swml-worker: rank {rank}: waiting for the other {others} rank"
                   f"{'s' if others > 1 else ''} to join job {job!r} at {switch_ip}:{control_port} "
                   f"(up to {join_timeout:g} s) ...", err=True)
        waiting = join_progress.report(switch_ip, control_port, job, rank, world,
                                       lambda line: click.echo(line, err=True))
    try:
        with waiting:   # the join returns when every rank has joined
            w = Worker(boxes, job, rank, world, iface=iface, backend=backend, port=port,
                       control_port=control_port, join_timeout=join_timeout, verbose=not quiet,
                       token=token, lanes=lanes)
        with w:
            progress = not quiet and sys.stderr.isatty()
            if sweep:
                rows = allreduce_bench.run_sweep(w, sweep, iterations, warmup, dtype, verify,
                                                 progress, op, precision)
            else:
                rows = [allreduce_bench.run(w, size, iterations, warmup, dtype, verify, progress,
                                            op, precision)]
        if baseline:
            from ..bench import raw_path
            raw_k = w.info.k // 2 if precision == "16" else w.info.k   # frames of the same size
            raw = raw_path.measure_when_up(switch_ip, raw_k, w.info.slots, join_timeout,
                                           lambda line: click.echo(line, err=True), port=port,
                                           reflect_port=w.info.switch_port, iface=iface)
    except (ControlError, JobAborted, TimeoutError, RuntimeError, OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    if baseline:
        text = raw_path.beside(rows, raw)
        for r in rows:
            r["raw"] = raw
    if as_json:
        click.echo(json.dumps(rows if sweep else rows[0]))
    elif sweep:
        click.echo(allreduce_bench.format_sweep(rows))
    else:
        click.echo(allreduce_bench.format_table(rows))
        click.echo(allreduce_bench.COLUMNS_LEGEND)
    if baseline and not as_json:
        click.echo(text)
    if verify and any(r["verify_failures"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
