"""`swml-lab train`: does quantized in-network aggregation train as well as Gloo?

A lab with N workers (4 by default) and the real switch; every worker runs
one rank as a process in its namespace. They train the same small MLP
(64-64-10) with DistributedDataParallel on scikit-learn's digits (the data set
ships with scikit-learn: nothing is downloaded), twice with the same seeds:
once with gradients averaged through the switch (the swml DDP hook) and once
with plain Gloo (DDP's built-in allreduce, over the same lab links; Gloo's TCP
rendezvous is on worker 0). It prints the final test accuracy and the time
per epoch of both, and saves a PNG of the loss and accuracy curves.

This module is the rank side (`python -m switchml_xdp.lab.train_example
--rank R ...`); lab/train_runs.py drives the whole comparison.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import click

from .lost_box import BEGAN_ENV, report_warnings

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
    # Workers in each rack of a RacksLab (None: the plain lab): each rank's
    # SWML_SWITCH its rack's box (tree) or the parent (flat), via the group.
    racks: list[int] | None = None
    layout: str = "tree"


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
        if mode == "swml" and (cfg.ranks_per_host > 1 or cfg.parallel == "fsdp2" or cfg.boxes > 1
                               or cfg.racks):
            # Several ranks a host: one Worker a host, through the swml
            # process group, which reduces each host's ranks first. Several
            # boxes, or racks: the group is where training outlives a lost
            # box (docs/scale-out.md).
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
        elif swml is not None:      # every box lost: the group went on through Gloo
            result.update(every_box_lost=True, buckets=swml.switch_calls,
                          fallback_buckets=swml.fallbacks)
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


if __name__ == "__main__":
    _rank_main()
