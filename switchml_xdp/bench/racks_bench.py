"""Racks: one rack alone, a tree of boxes and the same racks flat, on shaped
links and an oversubscribed core (docs/scale-out.md, "A tree of boxes"):

    sudo python -m switchml_xdp.bench.racks_bench --per-rack 4,4 [--rate 100]
        [--uplink-rate 100] [--size 4MiB] [--iterations 3] [--loss 0,1%]
    (or `swml-lab bench --racks 2 --per-rack 4 --uplink-rate 100 ...`)

Three rows for the same bytes, each a lab of its own (switchml_xdp/lab/racks.py),
N ranks (bench/rank.py, afxdp where it runs) timing allreduce of float32
tensors, the median of the slowest rank's time from a barrier:

    one rack alone  the largest rack's workers on one box (the plain lab),
                    bound S / worker rate
    tree            every rack behind its rack box, which sends one stream
                    up its uplink to the parent; bound S / min(worker rate,
                    uplink rate)
    flat            no rack boxes: every worker a member of the parent's job
                    across the core, rack r's n_r streams on its uplink;
                    bound max over racks of n_r S / uplink rate

    gloo ring       the peer: torch.distributed's Gloo over the tree's
                    links (no boxes: its ring crosses the core through the
                    rack boxes' routing); bound 2(N-1)/N S / min(worker
                    rate, uplink rate) in TCP frames

all header-adjusted (constants.py), with the share of its bound each row
reaches and the ratios tree / one rack, flat / tree and gloo / tree. A loss after the
first adds a tree row with that loss on every worker link and uplink, each
way, against the loss-free tree. The rows, the command and the figures go
to --json, and a bar chart to --png where matplotlib is installed.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

from .allreduce_bench import parse_size
from .constants import GLOO_PORT, boxes_bound_s, gloo_bound_mbps
from .output import NO_PLOT, pyplot, save_chart, save_doc
from .rank_group import RankGroup

K = 256


@dataclasses.dataclass
class RacksConfig:
    per_rack: list[int]
    rate_mbit: float = 100.0
    uplink_rate_mbit: float | None = 100.0
    size: int = 4 << 20
    iterations: int = 3
    warmup: int = 1
    losses: tuple[float, ...] = (0.0,)
    json_path: str | None = None
    png_path: str | None = None
    command: str = ""
    gloo: bool = True     # the peer's row (needs torch)
    queue: int | None = None   # every shaped queue's depth, packets (None: the shaper's default)


def bounds_s(cfg: RacksConfig) -> dict[str, float]:
    """Each row's bound (the module's docstring)."""
    up = [cfg.uplink_rate_mbit]
    slowest = min(cfg.rate_mbit, cfg.uplink_rate_mbit or cfg.rate_mbit)
    return {"one rack": boxes_bound_s(cfg.size, max(cfg.per_rack), cfg.rate_mbit, [], K),
            "tree": boxes_bound_s(cfg.size, 1, cfg.rate_mbit, up, K),
            "flat": max(boxes_bound_s(cfg.size, n, cfg.rate_mbit, up, K) for n in cfg.per_rack),
            "gloo": cfg.size * 8 / (gloo_bound_mbps(slowest, sum(cfg.per_rack)) * 1e6)}


def _argv_of(lab, job: str, size: int, box_ip):
    world = len(lab.workers)

    def argv_of(rank, host):
        return ["--system", "swml", "--backend", "auto", "--switch", box_ip(host), "--job", job,
                "--rank", str(rank), "--world", str(world), "--size", str(size), "--k", str(K),
                "--check"]
    return argv_of


def _timed(lab, argv_of, cfg: RacksConfig) -> tuple[float, str, float]:
    """The median over iterations of the slowest rank's time, the datapath,
    and the largest error of a first timed result against the exact sum."""
    with RankGroup(lab, argv_of, timeout=300) as group:
        ranks = group.run(cfg.iterations, cfg.warmup, timeout=600)
    slowest = [max(times) for times in zip(*(r["times"] for r in ranks))]
    return statistics.median(slowest), group.impl, max(r["rel_err"] or 0.0 for r in ranks)


def measure_one_rack(cfg: RacksConfig) -> tuple[float, str, float]:
    """The largest rack's workers alone on one box, links at the rate."""
    from ..lab import Lab
    from ..lab.cluster import SwitchProcess

    with Lab(workers=max(cfg.per_rack), rate_mbit=cfg.rate_mbit, queue_packets=cfg.queue) as lab, \
            SwitchProcess(lab, ["-k", str(K)]):
        return _timed(lab, _argv_of(lab, "one-rack", cfg.size, lambda h: lab.switch.ip), cfg)


def measure_racks(cfg: RacksConfig, layout: str, loss: float = 0.0) -> tuple[float, str, float]:
    """The racks laid out as `layout`, a rack box each (tree) or none (flat)."""
    import contextlib

    from ..lab.racks import RacksLab, switches_of_the_racks

    with RacksLab(None, cfg.per_rack, layout, rate_mbit=cfg.rate_mbit,
                  uplink_rate_mbit=cfg.uplink_rate_mbit, loss=loss or None,
                  queue_packets=cfg.queue) as lab, \
            contextlib.ExitStack() as stack:
        switches_of_the_racks(stack, lab, ["-k", str(K)])
        return _timed(lab, _argv_of(lab, layout, cfg.size, lambda h: lab.box_of(h).ip), cfg)


def _torch_missing() -> str | None:
    """Why the Gloo row cannot run here, or None."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return "torch is not installed: make setup-torch"
    return None


def measure_gloo(cfg: RacksConfig) -> tuple[float, str, float]:
    """Gloo's ring over the tree's links, no boxes up."""
    from ..lab.racks import RacksLab

    with RacksLab(None, cfg.per_rack, "tree", rate_mbit=cfg.rate_mbit,
                  uplink_rate_mbit=cfg.uplink_rate_mbit, queue_packets=cfg.queue) as lab:
        master, world = lab.workers[0].ip, len(lab.workers)

        def argv_of(rank, host):
            return ["--system", "gloo", "--rank", str(rank), "--world", str(world),
                    "--size", str(cfg.size), "--master", master,
                    "--master-port", str(GLOO_PORT), "--iface", host.iface]
        return _timed(lab, argv_of, cfg)


def run_racks_bench(cfg: RacksConfig, out=print) -> dict:
    """The rows, printed as they come; the document --json gets."""
    sizes = ",".join(map(str, cfg.per_rack))
    up = f"{cfg.uplink_rate_mbit:g} Mbit/s" if cfg.uplink_rate_mbit else "unshaped"
    queue = f"{cfg.queue}-packet queues" if cfg.queue else "the shapers' default queues (20 ms)"
    out(f"racks of {sizes} workers, worker links {cfg.rate_mbit:g} Mbit/s, uplinks {up} "
        f"(each way), {queue}, {cfg.size / 2**20:g} MiB float32, k={K}, {cfg.warmup} warm-up + "
        f"{cfg.iterations} iterations, medians")
    bounds, rows = bounds_s(cfg), []

    def row(name: str, bound: float, measured: tuple[float, str, float], vs=None) -> float:
        tat, impl, err = measured
        rows.append({"row": name, "tat_s": tat, "bound_s": bound, "impl": impl, "rel_err": err})
        ratio = f"  {vs[0]} {tat / vs[1]:5.2f}x" if vs else ""
        out(f"  {name:<26} TAT {tat * 1e3:8.1f} ms  bound {bound * 1e3:8.1f} ms "
            f"({100 * bound / tat:5.1f}%){ratio}  [{impl}, error {err:.1e}]")
        return tat

    one = row(f"one rack of {max(cfg.per_rack)} alone", bounds["one rack"], measure_one_rack(cfg))
    tree = row(f"tree, racks {sizes}", bounds["tree"], measure_racks(cfg, "tree"),
               ("tree/one rack", one))
    row(f"flat, racks {sizes}", bounds["flat"], measure_racks(cfg, "flat"), ("flat/tree", tree))
    if cfg.gloo and _torch_missing():
        out(f"  gloo ring: not run ({_torch_missing()})")
    elif cfg.gloo:
        row(f"gloo ring, racks {sizes}", bounds["gloo"], measure_gloo(cfg), ("gloo/tree", tree))
    for loss in (p for p in cfg.losses if p):
        row(f"tree, {100 * loss:g}% loss", bounds["tree"], measure_racks(cfg, "tree", loss),
            ("vs loss-free", tree))
    doc = {"per_rack": cfg.per_rack, "rate_mbit": cfg.rate_mbit, "queue_packets": cfg.queue,
           "uplink_rate_mbit": cfg.uplink_rate_mbit, "size_bytes": cfg.size, "k": K,
           "iterations": cfg.iterations, "command": cfg.command, "rows": rows}
    return save_doc(doc, cfg.json_path, cfg.png_path, plot, out)


def plot(doc: dict, path: Path) -> str:
    """A bar a row (its TAT) and its bound as a tick; what was written, in a line."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    names = [r["row"] for r in doc["rows"]]
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(names) + 1.5))
    ax.barh(names, [r["tat_s"] * 1e3 for r in doc["rows"]], color="tab:blue", label="TAT")
    ax.scatter([r["bound_s"] * 1e3 for r in doc["rows"]], names, marker="|", s=400,
               color="black", label="link bound")
    ax.invert_yaxis()
    ax.set_xlabel("tensor aggregation time (ms)")
    up = doc["uplink_rate_mbit"]
    ax.set_title(f"{doc['size_bytes'] / 2**20:g} MiB, worker links {doc['rate_mbit']:g} Mbit/s, "
                 f"uplinks {f'{up:g} Mbit/s' if up else 'unshaped'}", fontsize=10)
    return save_chart(plt, fig, ax, path)


def main(argv: list[str] | None = None) -> dict:
    from ..lab.loss import probability
    from ..lab.racks import rack_sizes

    ap = argparse.ArgumentParser(prog="python -m switchml_xdp.bench.racks_bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-rack", default="4,4", help="workers in each rack, e.g. 4,4 or 2,3,4")
    ap.add_argument("--rate", type=float, default=100.0, help="every worker link, Mbit/s")
    ap.add_argument("--uplink-rate", type=float, default=100.0, help="every uplink, Mbit/s")
    ap.add_argument("--size", default="4MiB")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--loss", default="0", help="losses, e.g. 0,1%%: a tree row each after the first")
    ap.add_argument("--json", default=None)
    ap.add_argument("--png", default=None)
    a = ap.parse_args(argv)
    cfg = RacksConfig(rack_sizes(None, a.per_rack), a.rate, a.uplink_rate, parse_size(a.size),
                      a.iterations, a.warmup, tuple(probability(x) for x in a.loss.split(",")),
                      a.json, a.png,
                      " ".join(["python -m switchml_xdp.bench.racks_bench", *(argv or sys.argv[1:])]))
    return run_racks_bench(cfg)


if __name__ == "__main__":
    main()
