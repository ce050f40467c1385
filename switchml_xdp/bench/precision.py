"""Precision 16 against 32 over shaped lab links (docs/quantization.md, "Where
it stands, measured"); as root, with nothing else running:

    python -m switchml_xdp.bench.precision [-n 2] [--rate 200] [--queue 32] [--size 4]
                                           [--iterations 7] [--backend afxdp] [-k 256]

Each rank alternates 32- and 16-bit float32 sums of the same tensor (after one
warm-up of each); elements/s = n / median (and fastest) time of the slowest rank.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import click
import numpy as np

from .. import wire
from ..lab import Lab
from ..lab.cluster import SwitchProcess
from ..lab.shaping import MAX_QUEUE_PACKETS, MAX_RATE_MBIT

PRECISIONS = ("32", "16")
RANK_STATS = ("packets_sent", "retransmissions", "cwnd", "srtt_us")


def rank_main(rank: int, world: int, n: int, iterations: int, backend: str, switch_ip: str) -> None:
    """One rank, in its lab namespace: prints its median and fastest times of
    each precision and its transport's figures, as one JSON line."""
    from .. import Worker

    x = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
    times: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    with Worker(switch_ip, "b16", rank, world, backend=backend, verbose=False) as w:
        for i in range(iterations + 1):
            for p in PRECISIONS:
                a = x.copy()
                t0 = time.perf_counter()
                w.allreduce(a, precision=p)
                if i:   # the first of each is the warm-up
                    times[p].append(time.perf_counter() - t0)
        stats = w.stats()
    out = {p: sorted(v)[len(v) // 2] for p, v in times.items()}
    out.update({"min" + p: min(v) for p, v in times.items()})
    out.update({key: stats.get(key) for key in RANK_STATS})
    print(json.dumps(out), flush=True)


@click.command()
@click.option("-n", "--workers", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--rate", type=click.FloatRange(0, MAX_RATE_MBIT), default=200.0, show_default=True,
              metavar="MBIT", help="every worker link's rate each way; 0: unshaped")
@click.option("--queue", type=click.IntRange(0, MAX_QUEUE_PACKETS), default=32, show_default=True,
              metavar="PACKETS", help="shaped queues' depth; 0: TBF's 20 ms")
@click.option("--size", "mib", type=click.FloatRange(0, None, min_open=True), default=4.0,
              show_default=True, help="float32 tensor size in MiB")
@click.option("--iterations", type=click.IntRange(1, None), default=7, show_default=True)
@click.option("--backend", type=click.Choice(["afxdp", "udp"]), default="afxdp", show_default=True)
@click.option("-k", "--elements", "k", type=click.IntRange(1, wire.MAX_K), default=256, show_default=True,
              help="elements a packet (the switch's -k)")
def main(workers, rate, queue, mib, iterations, backend, k):
    """Time 32- and 16-bit float32 sums through the XDP switch in a lab."""
    kw: dict = {"workers": workers}
    if rate:
        kw["rate_mbit"] = rate
        if queue:
            kw["queue_packets"] = queue
    n = int(mib * 2**20 / 4)
    with Lab(**kw) as lab, SwitchProcess(lab, ["-k", str(k)]):
        code = "import sys; from switchml_xdp.bench.precision import rank_main; " \
               "rank_main(*map(int, sys.argv[1:5]), *sys.argv[5:])"
        procs = [lab.popen(h, [sys.executable, "-c", code, str(r), str(workers), str(n),
                               str(iterations), backend, lab.switch.ip],
                           stdout=subprocess.PIPE, text=True)
                 for r, h in enumerate(lab.workers)]
        outs = [p.communicate(timeout=600)[0] for p in procs]
    res = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    t32, t16 = (max(r[p] for r in res) for p in PRECISIONS)
    m32, m16 = (max(r["min" + p] for r in res) for p in PRECISIONS)
    click.echo(f"{backend} N={workers} rate={rate:g} q={queue} k={k} size={mib:g}MiB "
               f"iters={iterations}: 32-bit {n / t32 / 1e6:.2f} M el/s ({t32 * 1e3:.0f} ms), "
               f"16-bit {n / t16 / 1e6:.2f} M el/s ({t16 * 1e3:.0f} ms): ratio {t32 / t16:.2f}x; "
               f"fastest {m32 * 1e3:.0f} / {m16 * 1e3:.0f} ms: {n / m32 / 1e6:.2f} / "
               f"{n / m16 / 1e6:.2f} M el/s, ratio {m32 / m16:.2f}x")
    for rank, r in enumerate(res):
        click.echo(f"  rank {rank}: {json.dumps(r)}")


if __name__ == "__main__":
    main()
