"""The local step of several ranks per host, alone: reduce into the leader
and share the result back, through shared memory (shm_local.py) against the
Gloo-on-loopback group it replaced (hosts.LoopbackLocalGroup). No switch:
this times what a host adds before and after its leader streams.

    python -m switchml_xdp.bench.local_reduce [--ranks 2] [--sizes-mib 1 16 64]

Each rank is a process with one torch thread; a call's time is the slowest
rank's, the figure the median over the repetitions. On a machine with fewer
cores than ranks the ranks take turns on the CPU: say so with the figures.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from .local_procs import AUTO, LOOPBACK, run_on_host

KINDS = {"shm": AUTO, "gloo": LOOPBACK}
WARMUP = 2


def _time_calls(group, rank: int, sizes_mib: list[int], reps: int) -> dict[int, list[float]]:
    """Per size, each repetition's seconds for reduce_to_leader + share of
    a float32 tensor of that many MiB (SUM), on this rank."""
    import torch

    times: dict[int, list[float]] = {}
    for mib in sizes_mib:
        x = torch.full((mib << 18,), float(rank + 1))
        times[mib] = []
        for i in range(WARMUP + reps):
            start = time.perf_counter()
            group.reduce_to_leader(x, "SUM")
            group.share(x, None)
            if i >= WARMUP:
                times[mib].append(time.perf_counter() - start)
    return {"transport": group.transport, "times": times}


def measure(kind: str, n_ranks: int, sizes_mib: list[int], reps: int) -> tuple[str, dict[int, float]]:
    """(the transport the group took, size -> median seconds a call)."""
    per_rank = run_on_host(_time_calls, n_ranks, (sizes_mib, reps), kind=KINDS[kind],
                           timeout_s=120.0, deadline_s=600.0)
    medians = {}
    for mib in sizes_mib:
        slowest = [max(r["times"][mib][i] for r in per_rank) for i in range(reps)]
        medians[mib] = statistics.median(slowest)
    return per_rank[0]["transport"], medians


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args(argv)
    results = {kind: measure(kind, args.ranks, args.sizes_mib, args.reps) for kind in KINDS}
    (shm_transport, shm), (gloo_transport, gloo) = results["shm"], results["gloo"]
    print(f"local reduce + share, {args.ranks} ranks on one host, {os.cpu_count()} CPU cores, "
          f"float32 SUM, median of {args.reps} (slowest rank each)")
    print(f"  shm group: {shm_transport}; gloo group: {gloo_transport}")
    print(f"{'size':>8} {'shm ms':>9} {'gloo ms':>9} {'gloo/shm':>9} {'shm GB/s':>9}")
    for mib in args.sizes_mib:
        print(f"{mib:>5} MiB {shm[mib] * 1e3:>9.2f} {gloo[mib] * 1e3:>9.2f} "
              f"{gloo[mib] / shm[mib]:>8.2f}x {mib * 2**20 / shm[mib] / 1e9:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
