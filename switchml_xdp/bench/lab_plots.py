"""PNG plots of a `swml-lab bench` result (matplotlib, no display needed).

    tat_vs_workers.png    median TAT against workers, every system, loss-free,
                          one panel per k, with each system's link-bound TAT
    goodput_vs_bound.png  goodput against workers with the header-adjusted link
                          bounds (swml: one per k; Gloo: ring's, per N)
    tat_vs_loss.png       median TAT against loss, every system, one panel per
                          worker count (largest k)
    tat_vs_boxes.png      (a run of several box counts) median TAT against the
                          boxes, one panel per worker count (largest k, no
                          loss), with each box count's bound and Gloo's ring
"""
from __future__ import annotations

from pathlib import Path

from .constants import (
    GLOO_SYSTEMS,
    LABELS,
    SYSTEMS,
    bound_mbps,
    boxes_bound_s,
    gloo_bound_mbps,
    swml_bound_mbps,
)
from .report import box_counts, find_row

STYLE = {
    "swml-afxdp": dict(color="tab:blue", marker="o"),
    "swml-udp": dict(color="tab:cyan", marker="s"),
    "userspace": dict(color="tab:orange", marker="^"),
    "gloo": dict(color="tab:red", marker="D"),
    "swml-afxdp16": dict(color="tab:purple", marker="o", ls="-."),
    "gloo-fp16": dict(color="tab:pink", marker="D", ls="-."),
}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _caption(meta: dict) -> str:
    return (f"{meta['size_bytes'] / 2**20:g} MiB float32, links {meta['rate_mbit']:g} Mbit/s each way, "
            f"medians of {meta['iterations']} iterations")


def _systems(meta):
    return [s for s in SYSTEMS if s in meta["systems"]]


def _panels(count: int, width: float, height: float):
    """A figure of `count` panels side by side, one y axis; (figure, panels)."""
    fig, axes = _plt().subplots(1, count, figsize=(width * count, height), squeeze=False,
                                sharey=True)
    return fig, axes[0]


def _lines(ax, meta: dict, points) -> None:
    """One line a system that ran: points(system) gives its (x, y), where measured."""
    for s in _systems(meta):
        pts = points(s)
        if pts:
            ax.plot(*zip(*pts), label=LABELS[s], **STYLE[s])


def _by_workers(ax, k: int, ws: list[int]) -> None:
    """A panel of k's figures against the worker counts."""
    ax.set_title(f"k = {k}")
    ax.set_xlabel("workers")
    ax.set_xticks(ws)
    ax.grid(alpha=0.3)


def _save(fig, title: str, meta: dict, path: Path) -> Path:
    fig.suptitle(f"{title}\n{_caption(meta)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def _measured(res: list[dict], s: str, at, field: str, scale: float = 1.0) -> list[tuple]:
    """(x, row[field] * scale) of system s's row at each (x, (workers, k, loss[, boxes])) of `at`."""
    rows = ((x, find_row(res, s, *where)) for x, where in at)
    return [(x, r[field] * scale) for x, r in rows if r]


def plot_tat_vs_workers(doc: dict, path: Path) -> Path:
    meta, res = doc["meta"], doc["results"]
    ks, ws, boxes = meta["ks"], meta["workers"], box_counts(meta)[0]
    box_rates = [meta.get("box_rate_mbit")] * boxes
    fig, axes = _panels(len(ks), 5.5, 4.2)
    for ax, k in zip(axes, ks):
        _lines(ax, meta, lambda s: _measured(res, s, [(n, (n, k, 0.0, boxes)) for n in ws],
                                             "tat_median_s", 1e3))
        for s, ls in (("swml-afxdp", "--"), ("gloo", ":")):
            if s in meta["systems"]:
                collective = meta.get("collective", "allreduce")
                ideal = [meta["size_bytes"] * 8e3 / (bound_mbps(
                    s, meta["rate_mbit"], k, n, collective, box_rates) * 1e6) for n in ws]
                ax.plot(ws, ideal, ls, color=STYLE[s]["color"], alpha=0.6,
                        label=f"link bound, {'swml' if s != 'gloo' else 'ring'}")
        _by_workers(ax, k, ws)
    axes[0].set_ylabel("tensor aggregation time (ms)")
    axes[0].set_ylim(bottom=0)
    axes[-1].legend(fontsize=8)
    return _save(fig, "Aggregation time vs workers, no loss", meta, path)


def plot_goodput_vs_bound(doc: dict, path: Path) -> Path:
    meta, res = doc["meta"], doc["results"]
    ks, ws, rate = meta["ks"], meta["workers"], meta["rate_mbit"]
    fig, axes = _panels(len(ks), 5.5, 4.2)
    for ax, k in zip(axes, ks):
        _lines(ax, meta, lambda s: _measured(res, s, [(n, (n, k, 0.0, box_counts(meta)[0]))
                                                       for n in ws], "goodput_mbps"))
        ax.axhline(rate, color="black", lw=0.8, label=f"link rate {rate:g} Mbit/s")
        ax.axhline(swml_bound_mbps(rate, k), color=STYLE["swml-afxdp"]["color"], ls="--",
                   label=f"swml bound (4k/(4k+58)) {swml_bound_mbps(rate, k):.0f}")
        if "gloo" in meta["systems"]:
            ax.plot(ws, [gloo_bound_mbps(rate, n) for n in ws], ":", color=STYLE["gloo"]["color"],
                    label="ring bound (TCP, N/(2(N-1)))")
        _by_workers(ax, k, ws)
        ax.set_ylim(0, rate * 1.08)
    axes[0].set_ylabel("goodput per worker (Mbit/s of tensor)")
    axes[-1].legend(fontsize=7, loc="lower left")
    return _save(fig, "Goodput vs header-adjusted link bound, no loss", meta, path)


def plot_tat_vs_loss(doc: dict, path: Path) -> Path:
    meta, res = doc["meta"], doc["results"]
    k, ws, losses = max(meta["ks"]), meta["workers"], sorted(meta["losses"])
    xs = list(range(len(losses)))
    fig, axes = _panels(len(ws), 4.3, 4.0)
    for ax, n in zip(axes, ws):
        _lines(ax, meta, lambda s: _measured(res, s, [(x, (n, k, p, box_counts(meta)[0]))
                                                       for x, p in zip(xs, losses)],
                                             "tat_median_s", 1e3))
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{p * 100:g}%" for p in losses])
        ax.set_xlabel("loss per link and direction")
        ax.set_title(f"{n} workers")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("tensor aggregation time (ms)")
    axes[0].set_yscale("log")
    axes[-1].legend(fontsize=8)
    return _save(fig, f"Aggregation time vs loss, k = {k} for swml", meta, path)


def plot_tat_vs_boxes(doc: dict, path: Path) -> Path:
    meta, res = doc["meta"], doc["results"]
    k, ws, counts = max(meta["ks"]), meta["workers"], box_counts(meta)
    fig, axes = _panels(len(ws), 5.5, 4.0)
    for ax, n in zip(axes, ws):
        _lines(ax, meta, lambda s: [] if s in GLOO_SYSTEMS else _measured(
            res, s, [(m, (n, k, 0.0, m)) for m in counts], "tat_median_s", 1e3))
        bounds = [boxes_bound_s(meta["size_bytes"], n, meta["rate_mbit"],
                                [meta.get("box_rate_mbit")] * m, k) * 1e3 for m in counts]
        ax.plot(counts, bounds, "--", color=STYLE["swml-afxdp"]["color"], alpha=0.6,
                label="link bound, swml")
        for s in (s for s in GLOO_SYSTEMS if s in meta["systems"]):
            row = find_row(res, s, n, None, 0.0)
            if row:
                ax.axhline(row["tat_median_s"] * 1e3, label=LABELS[s], **{
                    key: v for key, v in STYLE[s].items() if key != "marker"})
        ax.set(title=f"{n} workers", xlabel="boxes", xticks=counts)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("tensor aggregation time (ms)")
    axes[0].set_ylim(bottom=0)
    axes[-1].legend(fontsize=8)
    rate = meta.get("box_rate_mbit")
    return _save(fig, f"Aggregation time vs boxes ({f'{rate:g} Mbit/s' if rate else 'unshaped'}), "
                      f"k = {k}", meta, path)


def plot_all(doc: dict, out_dir: Path) -> dict[str, Path]:
    out_dir = Path(out_dir)
    plots = {
        "tat_vs_workers": plot_tat_vs_workers(doc, out_dir / "tat_vs_workers.png"),
        "goodput_vs_bound": plot_goodput_vs_bound(doc, out_dir / "goodput_vs_bound.png"),
        "tat_vs_loss": plot_tat_vs_loss(doc, out_dir / "tat_vs_loss.png"),
    }
    if len(box_counts(doc["meta"])) > 1:
        plots["tat_vs_boxes"] = plot_tat_vs_boxes(doc, out_dir / "tat_vs_boxes.png")
    return plots
