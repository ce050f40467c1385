"""What a rank costs while it waits for a late peer: two ranks of one job in
a lab of their own, rank 1 calling allreduce `late` seconds after rank 0
(after a barrier both passed), and rank 0's own CPU time (getrusage, every
thread) over the call that waits, in % of one core. Its retransmissions over
the call count the probes the timer sends towards the late rank's round
(docs/transport.md: a late rank gets one probe, backed off, not a window of
resends).

    python -m switchml_xdp.bench.late_peer [--backends afxdp,udp] [--late 1.0]
                                           [--calls 3] [--json]

docs/performance.md, "CPU per GiB reduced", has the figures.
"""
from __future__ import annotations

import statistics

import click

from .output import echo_rows

ELEMENTS = 16_384      # float32s a call: 64 KiB, so the reduction itself costs next to nothing
K = 256


def _argv(lab, backend: str):
    def argv_of(rank, host):
        return ["--system", "swml", "--backend", backend, "--switch", lab.switch.ip,
                "--job", f"late-{backend}", "--rank", str(rank), "--world", "2",
                "--size", str(4 * ELEMENTS), "--k", str(K)]
    return argv_of


def measure(backend: str, late_s: float = 1.0, calls: int = 3, lab=None) -> dict:
    """Rank 0's CPU over `calls` calls that each wait `late_s` for rank 1:
    the median call's % of a core, its wait, and the waiting rank's
    retransmissions and (afxdp) ppoll sleeps over all of them. `lab`: a lab
    of 2 workers to use (default: one of its own, with a switch)."""
    import contextlib

    from ..lab import Lab
    from ..lab.cluster import SwitchProcess
    from .rank_group import RankGroup

    with contextlib.ExitStack() as stack:
        if lab is None:
            lab = stack.enter_context(Lab(workers=2))
            stack.enter_context(SwitchProcess(lab, ["--elements", str(K)]))
        group = stack.enter_context(RankGroup(lab, _argv(lab, backend), hosts=lab.workers[:2]))
        waiting, late = group.run(calls, 1, timeout=120 + 10 * calls * late_s,
                                  late={"rank": 1, "s": late_s})
    pct = [100 * c / t for c, t in zip(waiting["cpu_s"], waiting["times"])]
    i = pct.index(statistics.median_low(pct))
    counters = waiting["counters"]
    return {"backend": group.impl, "late_s": late_s, "calls": calls,
            "wait_s": round(waiting["times"][i], 3), "cpu_s": round(waiting["cpu_s"][i], 5),
            "core_pct": round(pct[i], 2), "core_pct_max": round(max(pct), 2),
            "retransmissions": counters.get("retransmissions", 0),
            "sleeps": counters.get("sleeps"),
            "late_rank_core_pct": round(100 * sum(late["cpu_s"]) / sum(late["times"]), 2)}


def _line(r: dict) -> str:
    sleeps = f", {r['sleeps'] / r['calls']:.0f} sleeps" if r["sleeps"] is not None else ""
    return (f"  {r['backend']:<8} waited {r['wait_s']:.3f} s: {r['core_pct']:5.2f}% of a core "
            f"({r['cpu_s'] * 1e3:.1f} ms CPU; worst call {r['core_pct_max']:.2f}%), "
            f"{r['retransmissions'] / r['calls']:.1f} retransmissions{sleeps} a call")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--backends", default="afxdp,udp", show_default=True,
              help="worker backends, comma-separated")
@click.option("--late", "late_s", type=click.FloatRange(0.01, 30), default=1.0, show_default=True,
              help="seconds rank 1 calls after rank 0")
@click.option("--calls", type=click.IntRange(1, 20), default=3, show_default=True,
              help="calls that wait (the median one is reported)")
@click.option("--json", "as_json", is_flag=True, help="print JSON rows")
def main(backends: str, late_s: float, calls: int, as_json: bool) -> None:
    """A rank's CPU while its peer is late, for each backend."""
    from ..client.afxdp_backend import unavailable_reason

    rows = []
    for backend in (b.strip() for b in backends.split(",") if b.strip()):
        if backend == "afxdp" and (why := unavailable_reason()):
            click.echo(f"  afxdp    unavailable: {why}", err=True)
            continue
        rows.append(measure(backend, late_s, calls))
    echo_rows(rows, as_json, f"A rank waiting {late_s:g} s for its peer (2 ranks, "
              f"{4 * ELEMENTS // 1024} KiB float32, k={K}; median of {calls} calls):", _line,
              "  % of a core: the waiting rank's user + system time (getrusage, every thread) "
              "over its call / the call's wall time")


if __name__ == "__main__":
    main()
