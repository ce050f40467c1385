"""What the switch costs: ns per packet of the XDP program under load (kernel
BPF stats) at k=64 and k=256, and how long `swml-switch up` takes to serve.

    python -m switchml_xdp.bench.switch_cost [--workers 2] [--seconds 3] [--json]

Load comes from real workers in the lab reducing int32 tensors through the
switch (the best backend available: afxdp where built, else udp).
"""
from __future__ import annotations

import json
import threading
import time

import click
import numpy as np

from ..lab import Lab
from ..lab.cluster import SwitchProcess, run_ranks
from ..switch.daemon import read_state
from .bpf_stats import ProgCost, bpf_stats_enabled


def measure(k: int, workers: int, seconds: float, backend: str) -> dict:
    from .. import Worker

    with Lab(workers=workers) as lab, SwitchProcess(lab, ["--elements", str(k)]) as sw:
        prog_id = read_state(sw.iface)["prog_id"]
        stop = threading.Event()
        n = 512 * k  # 512 packets a tensor

        def rank_body(rank, host):
            a = np.ones(n, dtype=np.int32)
            calls = 0
            with Worker(lab.switch.ip, f"cost{k}", rank, workers, backend=backend,
                        verbose=False) as w:
                w.allreduce(a)  # warm-up
                while not stop.is_set():
                    a[:] = 1
                    w.allreduce(a)
                    calls += 1
                    # Every rank must make the same calls: agree on when to stop.
                    flag = np.array([1 if stop.is_set() else 0], dtype=np.int32)
                    w.allreduce(flag)
                    if flag[0]:
                        break
                assert a[0] == workers, "the load itself must be exact"
                return calls, w.backend_name

        with bpf_stats_enabled():
            cost = ProgCost(prog_id)
            t0 = time.monotonic()
            timer = threading.Timer(seconds, stop.set)
            timer.start()
            results = run_ranks(lab, lab.workers, rank_body, timeout=seconds + 120)
            elapsed = time.monotonic() - t0
            c = cost.since()
        return {"k": k, "workers": workers, "backend": results[0][1], "startup_s": sw.startup_s,
                "packets": c["packets"], "pps": c["packets"] / elapsed,
                "ns_per_packet": c["ns_per_packet"]}


@click.command()
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 8))
@click.option("--seconds", default=3.0, show_default=True, type=click.FloatRange(0.5, 600))
@click.option("--backend", default="auto", type=click.Choice(["auto", "afxdp", "udp"]))
@click.option("--json", "as_json", is_flag=True)
def main(workers, seconds, backend, as_json):
    rows = []
    for k in (64, 256):
        click.echo(f"measuring k={k} with {workers} workers for {seconds:g} s ...", err=True)
        rows.append(measure(k, workers, seconds, backend))
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    click.echo(f"{'k':>4} {'backend':>8} {'workers':>7} {'packets':>9} {'pkt/s':>9} "
               f"{'ns/packet':>10} {'up->serving':>12}")
    for r in rows:
        click.echo(f"{r['k']:>4} {r['backend']:>8} {r['workers']:>7} {r['packets']:>9} "
                   f"{r['pps']:>9.0f} {r['ns_per_packet']:>10.0f} {r['startup_s']:>11.2f}s")
    click.echo("ns/packet: kernel BPF stats (run_time_ns / run_cnt) of the switch program; "
               "up->serving: from starting `swml-switch up` to its 'up on' line.")


if __name__ == "__main__":
    main()
