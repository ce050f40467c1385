"""The driver of `swml-lab train` (the rank side: lab/train_example.py): a
lab, its switches, the swml run then the Gloo run with the same seeds,
the summary and the PNG.

The lab is the plain one (one box, several boxes or a box of several ports)
or, with cfg.racks, a RacksLab (lab/racks.py): the parent and, tree, every
rack box up, each rank's SWML_SWITCH the box of its host (its rack's, or
the parent flat). A box killed mid-run (`--kill-box`, lab/lost_box.py):
a plain box or the parent is powered off (its link down, its daemon
killed); a rack box has its daemon killed and its data plane removed, its
links kept up, for in the lab the rack box's namespace is also its rack's
router, without which the rack would be cut off from the others
(docs/scale-out.md, "Racks in the lab").
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import statistics
import sys
import tempfile
import time

from .lost_box import BEGAN_ENV, BoxKiller, report_lines, warning_records
from .train_example import MODES, TrainConfig


def rank_switch(lab, host) -> str:
    """The SWML_SWITCH of a rank on `host`: its rack's box in a RacksLab
    (the parent flat), else every box of the lab."""
    from .racks import RacksLab

    if isinstance(lab, RacksLab):
        return lab.box_of(host).ip
    return ",".join(box.ip for box in lab.switches)


def run_mode(lab, mode: str, cfg: TrainConfig, backend: str, job: str, timeout: float,
             env: dict | None = None) -> dict:
    """All ranks of one training run as processes in their namespaces; rank 0's
    result, with every rank's warnings. Each rank finds its boxes in SWML_SWITCH."""
    from .cluster import RanksFailed, rank_result, run_rank_processes

    per_host = cfg.ranks_per_host
    world = len(lab.workers) * per_host
    placements = []
    for rank in range(world):
        host = lab.workers[rank // per_host]
        placements.append((host, [
            sys.executable, "-m", "switchml_xdp.lab.train_example", "--rank", str(rank),
            "--world", str(world), "--mode", mode, "--master", lab.workers[0].ip,
            "--job", job, "--backend", backend, "--config", json.dumps(cfg.__dict__)],
            {"SWML_SWITCH": rank_switch(lab, host)}))
    try:
        outs = run_rank_processes(lab, placements, timeout, env=env)
    except RanksFailed as e:
        raise RuntimeError(f"{mode} training failed: {e}") from None
    result = rank_result(outs[0][0])
    if result is None:
        raise RuntimeError(f"rank 0 ({mode}) printed no result")
    notes = [ln for ln in outs[0][1].splitlines() if ln.startswith("switchml-xdp:")]
    result["notes"] = notes
    result["warnings"] = [w for stdout, _ in outs for w in warning_records(stdout)]
    return result


def time_per_epoch(result: dict) -> float:
    """Median over epochs after the first (which includes DDP's warm-up)."""
    times = result["epoch_s"][1:] or result["epoch_s"]
    return statistics.median(times)


def where(cfg: dict, world: int) -> str:
    """The lab the run had, for the plot's title."""
    racks = cfg.get("racks")
    if racks:
        return f"{world} workers in racks {','.join(map(str, racks))} ({cfg.get('layout', 'tree')})"
    return f"{world} workers in the lab"


def plot_curves(results: dict[str, dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    style = {"gloo": dict(color="tab:blue", lw=3.0, alpha=0.55),
             "swml": dict(color="tab:orange", lw=1.4, marker="o", ms=3)}
    label = {"gloo": "Gloo allreduce", "swml": "swml (switch, quantized)"}
    fig, (ax_l, ax_a) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, r in results.items():
        ax_l.plot(r["epoch"], r["train_loss"], label=f"{label[mode]}: train", **style[mode])
        ax_l.plot(r["epoch"], r["test_loss"], ls="--", label=f"{label[mode]}: test",
                  **{k: v for k, v in style[mode].items() if k != "marker"})
        ax_a.plot(r["epoch"], r["test_acc"],
                  label=f"{label[mode]}: {r['test_acc'][-1]:.2f}%", **style[mode])
    ax_l.set(title="cross-entropy loss", xlabel="epoch", ylabel="loss", yscale="log")
    ax_a.set(title="test accuracy", xlabel="epoch", ylabel="accuracy (%)")
    ax_a.set_ylim(max(0.0, min(min(r["test_acc"]) for r in results.values()) - 2), 100.5)
    for ax in (ax_l, ax_a):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    r0 = next(iter(results.values()))
    times = ", ".join(f"{label[m]} {time_per_epoch(r) * 1e3:.0f} ms" for m, r in results.items())
    how = r0["config"].get("parallel", "ddp").upper()
    fig.suptitle(f"{how} on scikit-learn digits, {where(r0['config'], r0['world'])}, MLP 64-"
                 f"{r0['config']['hidden']}-10, same seeds\ntime per epoch: {times}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_lines(results: dict[str, dict]) -> list[str]:
    rows = [("mode", "final acc", "train loss", "time/epoch", "aggregation")]
    for mode in MODES:
        r = results[mode]
        if mode == "swml" and r.get("every_box_lost"):
            how = f"switch until every box was lost, then Gloo: {r['buckets']} buckets"
        elif mode == "swml":
            w = r.get("worker", {})
            how = (f"switch, {w.get('backend', '?')} datapath, k={w.get('k', '?')}, "
                   f"{w.get('job_world', '?')} members: "
                   f"{r.get('buckets', 0)} buckets, {w.get('packets_sent', 0)} packets, "
                   f"{w.get('retransmissions', 0)} retransmissions")
        else:
            how = ("gloo reduce-scatter and all-gather (FSDP2)" if r["config"].get("parallel") == "fsdp2"
                   else "gloo ring allreduce (DDP built-in)")
        rows.append((mode, f"{r['test_acc'][-1]:.2f}%", f"{r['train_loss'][-1]:.4f}",
                     f"{time_per_epoch(r) * 1e3:.1f} ms", how))
    from .box_runs import box_lines

    widths = [max(len(row[c]) for row in rows) for c in range(4)]
    boxes = results["swml"].get("worker", {}).get("boxes")
    return (["  ".join(v.ljust(w) for v, w in zip(row[:4], widths)) + "  " + row[4] for row in rows]
            + box_lines([boxes], "swml run, rank 0's calls"))


def _open_lab(stack: contextlib.ExitStack, workers: int, cfg: TrainConfig, rate, box_rate,
              ports: int, uplink_rate) -> tuple:
    """The lab (entered on `stack`), its switches up, and a line that says what it is."""
    from .box_runs import switches_on_every_box
    from .namespace_lab import Lab
    from .racks import RacksLab, switches_of_the_racks

    shaped = f", links shaped to {rate:g} Mbit/s" if rate else ""
    if cfg.racks:
        lab = stack.enter_context(RacksLab(None, cfg.racks, cfg.layout, rate_mbit=rate,
                                           uplink_rate_mbit=uplink_rate))
        line = (f"lab {lab.prefix}: racks {','.join(map(str, cfg.racks))} ({cfg.layout}), parent "
                f"{lab.switch.ip}" + (f", rack boxes {','.join(p.ip for p in lab.rack_ports)}"
                                      if cfg.layout == "tree" else "")
                + f" x {cfg.ranks_per_host} rank(s) a host" + shaped
                + (f", uplinks to {uplink_rate:g} Mbit/s" if uplink_rate else ""))
        return lab, switches_of_the_racks(stack, lab), line
    lab = stack.enter_context(Lab(workers=workers, rate_mbit=rate, boxes=cfg.boxes,
                                  box_rate_mbit=box_rate, ports=ports))
    line = (f"lab {lab.prefix}: {'boxes' if cfg.boxes > 1 else 'switch'} "
            f"{','.join(box.ip for box in lab.switches)} + {workers} hosts x "
            f"{cfg.ranks_per_host} rank(s)" + shaped
            + (f", box ports to {box_rate:g} Mbit/s" if box_rate else ""))
    return lab, switches_on_every_box(stack, lab, box_rate=box_rate), line


def _killer(lab, switches: list, kill: tuple[int, float], began: str, out) -> BoxKiller:
    """The BoxKiller of box kill[0] (module docstring: how each box is lost)."""
    from .racks import RacksLab

    box, after = kill
    daemon = switches[box]
    started = functools.partial(os.path.exists, began)
    if not (isinstance(lab, RacksLab) and box > 0):
        return BoxKiller(lab, box, after, daemon.proc.kill, out, began=started)
    port, uplink = lab.rack_ports[box - 1], lab.uplinks[box - 1]

    def kill_rack_box() -> None:
        daemon.proc.kill()
        for host in (port, uplink):
            lab.run(host, ["ip", "link", "set", "dev", host.iface, "xdp", "off"])
        daemon.proc.wait()
        daemon.stop()       # what the killed daemon left: pins, state file

    return BoxKiller(lab, box, after, kill_rack_box, out, began=started, links=(),
                     what="its daemon killed, its data plane removed (the rack's routing kept)")


def run_lab_training(workers: int = 4, cfg: TrainConfig | None = None, backend: str = "auto",
                     png: str = "swml-train.png", json_path: str | None = None,
                     rate: float | None = None, timeout: float = 900.0, out=print,
                     box_rate: float | None = None, kill: tuple[int, float] | None = None,
                     ports: int = 1, uplink_rate: float | None = None) -> dict:
    """The whole comparison: lab, switches, both runs, summary, plot. Returns
    both results. cfg.boxes boxes, their ports shaped to box_rate Mbit/s; or
    cfg.racks (workers: theirs), the uplinks shaped to uplink_rate;
    kill=(box, seconds): that box of lab.switches (racks: 0 the parent, 1+r
    rack r's box) lost that long into the swml run, and when each rank
    warned after it in results["swml"]["lost_box"]."""
    cfg = cfg or TrainConfig()
    results: dict[str, dict] = {}
    with contextlib.ExitStack() as stack:
        lab, switches, line = _open_lab(stack, workers, cfg, rate, box_rate, ports, uplink_rate)
        ranks = len(lab.workers) * cfg.ranks_per_host
        out(line)
        for sw in switches:
            out(sw.ready_line)
        for mode in MODES:
            out(f"training with {mode}: {cfg.epochs} epochs, batch {cfg.batch} x {ranks} ranks ...")
            t0 = time.monotonic()
            job = f"train-{secrets.token_hex(4)}"
            killer = env = None
            if kill and mode == "swml":
                began = os.path.join(stack.enter_context(tempfile.TemporaryDirectory()), "began")
                env = {BEGAN_ENV: began}
                killer = _killer(lab, switches, kill, began, out).start()
            try:
                results[mode] = run_mode(lab, mode, cfg, backend, job, timeout, env)
            except RuntimeError as e:
                if killer and killer.killed_at:
                    raise RuntimeError(f"{e}\n({killer.describe()})") from None
                raise
            finally:
                if killer:
                    killer.cancel()
            for note in results[mode].pop("notes", []):
                out("  " + note)
            out(f"  done in {time.monotonic() - t0:.1f} s")
            if killer:
                lost = results[mode]["lost_box"] = killer.report(results[mode]["warnings"], ranks)
                if lost["killed"]:   # the epoch it fell in
                    lost["epoch"] = 1 + sum(t < lost["killed_at"] for t in results[mode]["epoch_end_t"])
    out("")
    for line in summary_lines(results):
        out(line)
    if "lost_box" in results["swml"]:
        for line in report_lines(results["swml"]["lost_box"]):
            out(line)
    diff = results["swml"]["test_acc"][-1] - results["gloo"]["test_acc"][-1]
    n_test = results["gloo"]["test_samples"]
    out(f"\naccuracy difference swml - gloo: {diff:+.2f} points (test set of {n_test} images; "
        f"one image = {100 / n_test:.2f} points)")
    plot_curves(results, png)
    out(f"curves: {os.path.abspath(png)}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)
        out(f"results: {os.path.abspath(json_path)}")
    return results
