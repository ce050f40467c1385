"""`swml-lab train`: does quantized in-network aggregation train as well as Gloo?

A lab with N workers (4 by default) and the real switch; every worker runs
one rank as a process in its namespace. They train the same small MLP
(64-64-10) with DistributedDataParallel on scikit-learn's digits (the data set
ships with scikit-learn: nothing is downloaded), twice with the same seeds:
once with gradients averaged through the switch (the swml DDP hook) and once
with plain Gloo (DDP's built-in allreduce, over the same lab links; Gloo's TCP
rendezvous is on worker 0). It prints the final test accuracy and the time
per epoch of both, and saves a PNG of the loss and accuracy curves.

The rank side is this module run as a script (`python -m
switchml_xdp.lab.train_example --rank R ...`); `run_lab_training` drives
the whole comparison.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

import click

from .lost_box import BEGAN_ENV, BoxKiller, report_lines, report_warnings, warning_records

MODES = ("gloo", "swml")
RENDEZVOUS_PORT = {"gloo": 29510, "swml": 29520}


@dataclass
class TrainConfig:
    epochs: int = 30
    batch: int = 16            # per rank; the global batch is batch * world
    lr: float = 0.05
    momentum: float = 0.9
    hidden: int = 64
    seed: int = 0
    bucket_kb: float = 1.0     # DDP bucket cap: small, so a step has two buckets (650 + 4160)
    test_fraction: float = 0.25
    ranks_per_host: int = 1    # >1: the swml run uses the swml process group (hosts.py)
    # "ddp", or "fsdp2": the model sharded with fully_shard over the run's group
    # (the swml process group in the swml run), its gradients reduce-scattered.
    parallel: str = "ddp"
    boxes: int = 1             # >1: the swml run over that many boxes (SWML_SWITCH), via the group


# --------------------------------------------------------------------- rank side

def load_digits_split(cfg: TrainConfig):
    """(x_train, y_train, x_test, y_test) as tensors, the same split on every rank."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=cfg.test_fraction,
                                          random_state=cfg.seed, stratify=y)
    return (torch.from_numpy(xtr), torch.from_numpy(ytr).long(),
            torch.from_numpy(xte), torch.from_numpy(yte).long())


def make_model(cfg: TrainConfig):
    import torch

    torch.manual_seed(cfg.seed)
    return torch.nn.Sequential(torch.nn.Linear(64, cfg.hidden), torch.nn.ReLU(),
                               torch.nn.Linear(cfg.hidden, 10))


def train_rank(rank: int, world: int, mode: str, master: str, switch: str | None, job: str | None,
               backend: str, cfg: TrainConfig) -> dict | None:
    """One rank's training run; rank 0 returns the curves, the others None."""
    import gc

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # N ranks share the machine's cores
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{RENDEZVOUS_PORT[mode]}",
                            rank=rank, world_size=world)
    try:
        return _train(rank, world, mode, switch, job, backend, cfg)
    finally:
        # The DDP model must be gone before its process group is destroyed: a DDP
        # freed after destroy_process_group sometimes hangs in Gloo's destructor
        # (torch 2.13), which is why the training lives in _train.
        gc.collect()
        dist.destroy_process_group()


def shard(model, group):
    """FSDP2: each Linear its own unit, then the whole model, over `group`
    (None: the default group)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group or dist.group.WORLD, "cpu")
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def full(p):
    """A parameter whole: FSDP2's are sharded DTensors."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def _train(rank: int, world: int, mode: str, switch: str | None, job: str | None, backend: str,
           cfg: TrainConfig) -> dict | None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    worker = hook_state = None
    try:
        xtr, ytr, xte, yte = load_digits_split(cfg)
        model = make_model(cfg)
        swml = None
        if mode == "swml" and (cfg.ranks_per_host > 1 or cfg.parallel == "fsdp2" or cfg.boxes > 1):
            # Several ranks a host: one Worker a host, through the swml
            # process group, which reduces each host's ranks first. Several
            # boxes: the group is where training outlives a lost box
            # (docs/scale-out.md).
            from switchml_xdp.torch import SwmlOptions

            swml = dist.new_group(backend="swml", pg_options=SwmlOptions(
                switch=switch, job=job, backend=backend, verbose=rank == 0))
        if cfg.parallel == "fsdp2":
            if swml is not None:
                # The gradients' reduce-scatters through the switch, which this
                # run compares with Gloo's (off by default in the backend:
                # slower than Gloo's in the lab, docs/pytorch.md).
                swml.reduce_scatter_min_bytes = 0
            ddp = model = shard(model, swml)
        else:
            ddp = DDP(model, bucket_cap_mb=cfg.bucket_kb / 1024, process_group=swml)
        if mode == "swml" and swml is None:
            from switchml_xdp import Worker
            from switchml_xdp.torch import register_hook

            worker = Worker(switch, job, rank, world, backend=backend, verbose=rank == 0)
            hook_state = register_hook(ddp, worker)
        opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        loss_fn = torch.nn.CrossEntropyLoss()
        per_rank = len(xtr) // world
        began = os.environ.get(BEGAN_ENV)
        if began and rank == 0:
            open(began, "w").close()   # where `swml-lab train --kill-after` counts from
        curves = {"epoch": [], "train_loss": [], "test_loss": [], "test_acc": [], "epoch_s": [],
                  "epoch_end_t": []}
        for epoch in range(cfg.epochs):
            g = torch.Generator().manual_seed(cfg.seed * 1000 + epoch)
            order = torch.randperm(len(xtr), generator=g)[: per_rank * world]
            mine = order[rank::world]
            dist.barrier()
            t0 = time.perf_counter()
            loss_sum = torch.zeros(2, dtype=torch.float64)
            for b in range(0, per_rank, cfg.batch):
                idx = mine[b:b + cfg.batch]
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(ddp(xtr[idx]), ytr[idx])
                loss.backward()
                opt.step()
                loss_sum += torch.tensor([loss.item() * len(idx), len(idx)], dtype=torch.float64)
            elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)   # the slowest rank's epoch
            dist.all_reduce(loss_sum)                         # the global mean training loss
            with torch.no_grad():
                logits = model(xte)
                test_loss = loss_fn(logits, yte).item()
                acc = (logits.argmax(1) == yte).float().mean().item() * 100
            curves["epoch"].append(epoch + 1)
            curves["train_loss"].append((loss_sum[0] / loss_sum[1]).item())
            curves["test_loss"].append(test_loss)
            curves["test_acc"].append(acc)
            curves["epoch_s"].append(elapsed.item())
            curves["epoch_end_t"].append(time.time())
        # Every rank must hold the same parameters at the end.
        flat = torch.cat([full(p).detach().reshape(-1) for p in model.parameters()])
        spread = flat.clone()
        dist.all_reduce(spread, op=dist.ReduceOp.MAX)
        low = flat.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        result = {"mode": mode, "world": world, "config": cfg.__dict__, **curves,
                  "param_spread": (spread - low).abs().max().item(),
                  "test_samples": len(yte), "train_samples": len(ytr)}
        streamer = worker or (swml.worker if swml is not None else None)  # rank 0 leads its host
        if streamer is not None:
            st = streamer.stats()
            result["worker"] = {k: st[k] for k in ("backend", "k", "slots", "tensors", "elements",
                                                   "packets_sent", "retransmissions", "boxes")
                                if k in st}
            result["worker"]["job_world"] = streamer.info.world
            result["buckets"] = hook_state.buckets if hook_state else swml.switch_calls
            result["fallback_buckets"] = (hook_state.fallback_buckets if hook_state
                                          else swml.fallbacks)
        dist.barrier()
        return result if rank == 0 else None
    finally:
        if worker is not None:
            worker.close()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--rank", type=int, required=True, help="this rank")
@click.option("--world", type=int, required=True, help="ranks in all")
@click.option("--mode", type=click.Choice(MODES), required=True, help="how gradients are reduced")
@click.option("--master", required=True, help="address of rank 0 (Gloo's rendezvous)")
@click.option("--switch", default=None, envvar="SWML_SWITCH",
              help="the switch's address, or the boxes' A,B,... (swml modes) [default: $SWML_SWITCH]")
@click.option("--job", default=None, help="the swml job name")
@click.option("--backend", default="auto", show_default=True, help="the swml worker backend")
@click.option("--config", default="{}", show_default=True, help="TrainConfig fields as JSON")
def _rank_main(rank, world, mode, master, switch, job, backend, config) -> None:
    """One rank of `swml-lab train`."""
    report_warnings(rank)
    cfg = TrainConfig(**json.loads(config))
    result = train_rank(rank, world, mode, master, switch, job, backend, cfg)
    if result is not None:
        print("RESULT " + json.dumps(result), flush=True)


# ----------------------------------------------------------------------- driver

def _run_mode(lab, mode: str, cfg: TrainConfig, backend: str, job: str, timeout: float,
              env: dict | None = None) -> dict:
    """All ranks of one training run as processes in their namespaces; rank 0's
    result, with every rank's warnings. The ranks find the boxes in SWML_SWITCH."""
    from .cluster import RanksFailed, rank_result, run_rank_processes

    per_host = cfg.ranks_per_host
    world = len(lab.workers) * per_host
    placements = []
    for rank in range(world):
        placements.append((lab.workers[rank // per_host], [
            sys.executable, "-m", "switchml_xdp.lab.train_example", "--rank", str(rank),
            "--world", str(world), "--mode", mode, "--master", lab.workers[0].ip,
            "--job", job, "--backend", backend, "--config", json.dumps(cfg.__dict__)]))
    boxes = ",".join(box.ip for box in lab.switches)
    try:
        outs = run_rank_processes(lab, placements, timeout, env={"SWML_SWITCH": boxes, **(env or {})})
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
    fig.suptitle(f"{how} on scikit-learn digits, {r0['world']} workers in the lab, MLP 64-"
                 f"{r0['config']['hidden']}-10, same seeds\ntime per epoch: {times}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_lines(results: dict[str, dict]) -> list[str]:
    rows = [("mode", "final acc", "train loss", "time/epoch", "aggregation")]
    for mode in MODES:
        r = results[mode]
        if mode == "swml":
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


def run_lab_training(workers: int = 4, cfg: TrainConfig | None = None, backend: str = "auto",
                     png: str = "swml-train.png", json_path: str | None = None,
                     rate: float | None = None, timeout: float = 900.0, out=print,
                     box_rate: float | None = None, kill: tuple[int, float] | None = None,
                     ports: int = 1) -> dict:
    """The whole comparison: lab, switches, both runs, summary, plot. Returns
    both results. cfg.boxes boxes, their ports shaped to box_rate Mbit/s;
    kill=(box, seconds): that box powered off that long into the swml run
    (lost_box.py), and when each rank warned after it in results["swml"]["lost_box"]."""
    from .box_runs import switches_on_every_box
    from .namespace_lab import Lab

    cfg = cfg or TrainConfig()
    results: dict[str, dict] = {}
    with Lab(workers=workers, rate_mbit=rate, boxes=cfg.boxes, box_rate_mbit=box_rate,
             ports=ports) as lab, \
            contextlib.ExitStack() as stack:
        out(f"lab {lab.prefix}: {'boxes' if cfg.boxes > 1 else 'switch'} "
            f"{','.join(box.ip for box in lab.switches)} + {workers} hosts x "
            f"{cfg.ranks_per_host} rank(s)" + (f", links shaped to {rate:g} Mbit/s" if rate else "")
            + (f", box ports to {box_rate:g} Mbit/s" if box_rate else ""))
        switches = switches_on_every_box(stack, lab, box_rate=box_rate)
        for sw in switches:
            out(sw.ready_line)
        for mode in MODES:
            out(f"training with {mode}: {cfg.epochs} epochs, batch {cfg.batch} x "
                f"{workers * cfg.ranks_per_host} ranks ...")
            t0 = time.monotonic()
            job = f"train-{secrets.token_hex(4)}"
            killer = env = None
            if kill and mode == "swml":
                began = os.path.join(stack.enter_context(tempfile.TemporaryDirectory()), "began")
                env = {BEGAN_ENV: began}
                killer = BoxKiller(lab, kill[0], kill[1], switches[kill[0]].proc.kill, out,
                                   began=lambda: os.path.exists(began)).start()
            try:
                results[mode] = _run_mode(lab, mode, cfg, backend, job, timeout, env)
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
                lost = results[mode]["lost_box"] = killer.report(results[mode]["warnings"],
                                                                 workers * cfg.ranks_per_host)
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


if __name__ == "__main__":
    _rank_main()
