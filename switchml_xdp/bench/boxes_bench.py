"""A job over several boxes against one box and Gloo, on a lab whose boxes'
ports are the bottleneck (docs/scale-out.md):

    sudo python -m switchml_xdp.bench.boxes_bench [--workers 4] [--boxes 1,2,4]
        [--ports 4] [--rate 100] [--box-rates 100,100,200] [--size 16MiB] [--iterations 5]

For every box count M: a lab of N workers and M boxes, every worker link
and every box port shaped to its rate (both ways), an XDP switch on each box
told its port's rate (`--capacity`), and N ranks (bench/rank.py, afxdp where
it runs) timing allreduce of the same float32 tensors through all M boxes
at once; then Gloo's ring on the same worker links, the peer. Each row
prints the median tensor aggregation time (the slowest rank's, from a
barrier), its bound, max(S / worker rate, N S / the boxes' rates summed),
header-adjusted, the share of it reached, and the time against one box's.
`--box-rates` gives each box its own rate: the split follows the boxes'
capacities, and the row `equal split` times the same boxes told equal ones.
`--ports P` adds a row of one box with P ports (Lab(ports=P): each port on
a segment of its own, shaped to the rate), bound as P boxes are.

The workers' own links: a worker sends S and receives S whatever M, so
with M >= N the box ports stop being the limit. Where the two cores are
the limit (high rates), say so: the figures are then the machine's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from .allreduce_bench import parse_size
from .constants import GLOO_PORT, boxes_bound_s, gloo_bound_mbps
from .rank_group import RankGroup

K = 256


def bound_s(size: int, workers: int, rate_mbit: float, box_rates: list[float]) -> float:
    """The job's bound through these boxes at this bench's k (constants.py)."""
    return boxes_bound_s(size, workers, rate_mbit, box_rates, K)


def gloo_bound_s(size: int, workers: int, rate_mbit: float) -> float:
    """Ring allreduce: 2(N-1)/N of the tensor each way over every worker link."""
    return size * 8 / (gloo_bound_mbps(rate_mbit, workers) * 1e6)


def _tat(ranks: list[dict]) -> float:
    per_iter = [max(r["times"][i] for r in ranks) for i in range(len(ranks[0]["times"]))]
    return statistics.median(per_iter)


def _run(lab, argv_of, iterations: int, warmup: int) -> tuple[float, str]:
    with RankGroup(lab, argv_of, timeout=300) as group:
        ranks = group.run(iterations, warmup, timeout=600)
        return _tat(ranks), group.impl


def measure_boxes(workers: int, rates: list[float], rate_mbit: float, size: int, iterations: int,
                  warmup: int, capacities: list[float] | None = None,
                  last_box_loss: float = 0.0) -> tuple[float, str]:
    """TAT through len(rates) boxes whose ports have `rates` (Mbit/s), each
    told `capacities` (default: its rate); `last_box_loss`: random loss of
    data frames both ways on the last box's link only."""
    from ..lab import Lab
    from ..lab.cluster import SwitchProcess

    caps = capacities or rates
    with Lab(workers=workers, rate_mbit=rate_mbit, boxes=len(rates), box_rate_mbit=rates) as lab:
        switches = [SwitchProcess(lab, ["-k", str(K), "--capacity", f"{int(c)}M"], box=b)
                    for b, c in enumerate(caps)]
        if last_box_loss:
            lab.set_loss(last_box_loss, hosts=[lab.switches[-1].name])
        try:
            boxes = ",".join(s.ip for s in lab.switches)

            def argv_of(rank, host):
                return ["--system", "swml", "--backend", "auto", "--switch", boxes,
                        "--job", f"boxes{len(rates)}", "--rank", str(rank), "--world",
                        str(workers), "--size", str(size), "--k", str(K)]
            return _run(lab, argv_of, iterations, warmup)
        finally:
            for s in switches:
                s.stop()


def measure_ports(workers: int, ports: int, rate_mbit: float, size: int, iterations: int,
                  warmup: int) -> tuple[float, str]:
    """TAT through one box with `ports` ports, each shaped to rate_mbit."""
    from ..lab import Lab
    from ..lab.cluster import SwitchProcess

    with Lab(workers=workers, rate_mbit=rate_mbit, ports=ports, box_rate_mbit=rate_mbit) as lab, \
            SwitchProcess(lab, ["-k", str(K)]):
        def argv_of(rank, host):
            return ["--system", "swml", "--backend", "auto", "--switch", lab.switch.ip,
                    "--job", f"ports{ports}", "--rank", str(rank), "--world", str(workers),
                    "--size", str(size), "--k", str(K)]
        return _run(lab, argv_of, iterations, warmup)


def measure_gloo(workers: int, rate_mbit: float, size: int, iterations: int,
                 warmup: int) -> tuple[float, str]:
    from ..lab import Lab

    with Lab(workers=workers, rate_mbit=rate_mbit) as lab:
        master = lab.workers[0].ip

        def argv_of(rank, host):
            return ["--system", "gloo", "--rank", str(rank), "--world", str(workers),
                    "--size", str(size), "--master", master, "--master-port", str(GLOO_PORT),
                    "--iface", host.iface]
        return _run(lab, argv_of, iterations, warmup)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m switchml_xdp.bench.boxes_bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--boxes", default="1,2,4", help="box counts, each a row (equal rates)")
    ap.add_argument("--rate", type=float, default=100.0, help="every link's rate, Mbit/s")
    ap.add_argument("--ports", default=None,
                    help="port counts, each a row more: one box with that many ports")
    ap.add_argument("--box-rates", default=None,
                    help="one row more: boxes of these rates (Mbit/s), e.g. 100,100,200")
    ap.add_argument("--size", default="16MiB")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--box-loss", type=float, default=None,
                    help="one row more: the largest box count with this loss (e.g. 0.01) on its "
                         "last box's link only, both ways")
    ap.add_argument("--no-gloo", action="store_true")
    ap.add_argument("--json", default=None, help="write the rows here too")
    a = ap.parse_args(argv)
    size, n = parse_size(a.size), a.workers
    print(f"{n} workers, worker links {a.rate:g} Mbit/s each way, {size / 2**20:g} MiB float32, "
          f"k={K}, {a.warmup} warm-up + {a.iterations} iterations, medians", flush=True)
    rows = []

    def row(name: str, tat: float, bound: float, impl: str, one_box: float | None) -> None:
        rows.append({"row": name, "tat_s": tat, "bound_s": bound, "impl": impl})
        vs = f"  {one_box / tat:5.2f}x one box" if one_box else ""
        print(f"  {name:<34} TAT {tat * 1e3:8.1f} ms  bound {bound * 1e3:8.1f} ms "
              f"({100 * bound / tat:5.1f}%){vs}  [{impl}]", flush=True)

    one = None
    for m in [int(x) for x in a.boxes.split(",")]:
        rates = [a.rate] * m
        tat, impl = measure_boxes(n, rates, a.rate, size, a.iterations, a.warmup)
        one = one or (tat if m == 1 else None)
        row(f"swml, {m} box{'es' if m > 1 else ''} of {a.rate:g} Mbit/s", tat,
            bound_s(size, n, a.rate, rates), impl, one)
    for p in [int(x) for x in a.ports.split(",")] if a.ports else []:
        tat, impl = measure_ports(n, p, a.rate, size, a.iterations, a.warmup)
        row(f"swml, 1 box, {p} ports of {a.rate:g} Mbit/s", tat,
            bound_s(size, n, a.rate, [a.rate] * p), impl, one)
    if a.box_loss:
        m = max(int(x) for x in a.boxes.split(","))
        rates = [a.rate] * m
        tat, impl = measure_boxes(n, rates, a.rate, size, a.iterations, a.warmup,
                                  last_box_loss=a.box_loss)
        row(f"swml, {m} boxes, {100 * a.box_loss:g}% loss on one", tat,
            bound_s(size, n, a.rate, rates), impl, one)
    if a.box_rates:
        rates = [float(x) for x in a.box_rates.split(",")]
        for name, caps in (("by capacity", None), ("equal split", [min(rates)] * len(rates))):
            tat, impl = measure_boxes(n, rates, a.rate, size, a.iterations, a.warmup, caps)
            row(f"swml, boxes {a.box_rates} Mbit/s, {name}", tat, bound_s(size, n, a.rate, rates),
                impl, one)
    if not a.no_gloo:
        tat, impl = measure_gloo(n, a.rate, size, a.iterations, a.warmup)
        row("gloo ring", tat, gloo_bound_s(size, n, a.rate), impl, one)
    doc = {"workers": n, "rate_mbit": a.rate, "size_bytes": size, "iterations": a.iterations,
           "command": " ".join(["python -m switchml_xdp.bench.boxes_bench", *(argv or sys.argv[1:])]),
           "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


if __name__ == "__main__":
    main()
