"""Is the switch faster for my model? Run a training script for a few steps with
the `swml` backend and again with Gloo (and NCCL where there are GPUs), on the
hosts it will train on, and compare.

    SWML_SWITCH=10.0.0.1 torchrun --nnodes=2 --nproc_per_node=2 ... \\
        -m switchml_xdp.torch.ab [--steps 30] [--warmup 5] [--backends gloo,swml] \\
        train.py [its arguments]

The script is the user's own, unchanged: it calls
`dist.init_process_group(...)` (whatever backend it names is replaced by the
arm's), builds its model and optimizer and trains. Each arm runs it from the
start in this process (`runpy`), with the same seeds, and stops it after
`--steps` optimizer steps. What is measured, per arm:

- time a step: the median interval between optimizer steps after `--warmup`;
- communication: DDP's own timer of its gradient all_reduce, a step
  (`avg_backward_comm_time` of DDP's logging data, which DDP samples over its
  first ten iterations), and its share of the step; "-" without DDP;
- the loss: the scalar each `backward()` is called on; the last step's, and
  the largest difference from the first arm's over the common steps.

Rank 0 prints one row an arm and the ratios to the first arm. Each arm gets
a process group of its own, on a store of its own under the launcher's, so
that nothing of one arm is read by the next.
"""
from __future__ import annotations

import datetime
import os
import random
import runpy
import statistics
import sys
import time
from dataclasses import dataclass, field

import click
import torch
import torch.distributed as dist

from . import BACKEND_NAME, SwmlOptions  # importing the package registers the backend

# torch.distributed.init_process_group as the script would get it; an arm
# replaces it by _ArmInit while it runs.
_REAL_INIT = dist.init_process_group
GLOO_SETTLE_S = 0.1   # after an arm's last barrier, before its group goes (Arm.run)


class StepsDone(BaseException):
    """Raised from the optimizer's step hook after the arm's steps: a
    BaseException, so that the script's own `except Exception` lets it by."""


@dataclass
class ArmResult:
    backend: str
    step_times: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    comm_s: float | None = None   # DDP's all_reduce time a step

    def step_s(self, warmup: int) -> float:
        gaps = [b - a for a, b in zip(self.step_times, self.step_times[1:], strict=False)]
        timed = gaps[warmup:] or gaps
        return statistics.median(timed) if timed else float("nan")


def _launcher_store(timeout: datetime.timedelta) -> dist.Store:
    """A client of the store torchrun (or the env:// launcher) set up."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    return dist.TCPStore(host, port, world, is_master=rank == 0 and not agent,
                         timeout=timeout, wait_for_workers=False)


class Arm:
    """One backend's run of the script: the hooks that time and stop it."""

    def __init__(self, backend: str, steps: int, store: dist.Store, index: int):
        self.result = ArmResult(backend)
        self.steps, self.store, self.index = steps, store, index
        self.ddps: list = []

    def init_process_group(self, backend=None, *args, **kwargs):
        """The script's init_process_group, with this arm's backend and store."""
        if self.result.backend != BACKEND_NAME or not isinstance(kwargs.get("pg_options"),
                                                                 SwmlOptions):
            kwargs.pop("pg_options", None)   # options of one backend mean nothing to another
        kwargs.pop("init_method", None)
        kwargs["store"] = dist.PrefixStore(f"swml-ab/{self.index}/", self.store)
        kwargs.setdefault("rank", int(os.environ["RANK"]))
        kwargs.setdefault("world_size", int(os.environ["WORLD_SIZE"]))
        return _REAL_INIT(self.result.backend, *args, **kwargs)

    def on_step(self, optimizer, args, kwargs) -> None:
        self.result.step_times.append(time.perf_counter())
        if len(self.result.step_times) >= self.steps:
            raise StepsDone

    def run(self, script: str, argv: list[str], seed: int) -> ArmResult:
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.optim.optimizer import register_optimizer_step_post_hook

        real_backward, real_ddp_init = torch.Tensor.backward, DDP.__init__
        arm = self

        def backward(tensor, *a, **kw):
            if tensor.numel() == 1:
                arm.result.losses.append(float(tensor.detach().float()))
            return real_backward(tensor, *a, **kw)

        def ddp_init(module, *a, **kw):
            real_ddp_init(module, *a, **kw)
            arm.ddps.append(module)

        random.seed(seed)
        torch.manual_seed(seed)
        handle = register_optimizer_step_post_hook(self.on_step)
        dist.init_process_group, torch.Tensor.backward, DDP.__init__ = \
            self.init_process_group, backward, ddp_init
        saved_argv = sys.argv
        sys.argv = [script, *argv]
        try:
            runpy.run_path(script, run_name="__main__")
        except StepsDone:
            pass
        except SystemExit as e:
            if e.code not in (None, 0):
                raise
        finally:
            sys.argv = saved_argv
            handle.remove()
            dist.init_process_group, torch.Tensor.backward, DDP.__init__ = \
                _REAL_INIT, real_backward, real_ddp_init
        self.result.comm_s = self._ddp_comm_s()
        # The group goes last, once its worker threads are idle. A Gloo
        # group's destructor joins them, holding the GIL; one still dropping
        # a finished work (whose thread-local state holds Python objects)
        # waits for the GIL: a deadlock, seen about once in ten runs. So the
        # DDPs go first (the group registry still holds the group), then the
        # barrier's work is given the GIL to finish with, then the group.
        self.ddps.clear()
        if dist.is_initialized():
            dist.barrier()
            time.sleep(GLOO_SETTLE_S)
            dist.destroy_process_group()
        return self.result

    def _ddp_comm_s(self) -> float | None:
        times = []
        for ddp in self.ddps:
            try:
                data = ddp._get_ddp_logging_data()
            except Exception:  # noqa: BLE001 - a DDP without logging data: no figure
                continue
            if data.get("avg_backward_comm_time"):
                times.append(data["avg_backward_comm_time"] / 1e9)
        return sum(times) if times else None


def format_rows(results: list[ArmResult], warmup: int) -> str:
    base = results[0]
    base_step = base.step_s(warmup)
    lines = [f"{'backend':>8} {'steps':>5} {'s/step':>9} {'vs ' + base.backend:>9} "
             f"{'comm s/step':>11} {'comm %':>7} {'last loss':>10} {'max |dloss|':>11}"]
    for r in results:
        step = r.step_s(warmup)
        comm = "-" if r.comm_s is None else f"{r.comm_s:.4f}"
        share = "-" if r.comm_s is None else f"{100 * r.comm_s / step:.0f}%"
        common = list(zip(r.losses, base.losses, strict=False))
        dloss = max((abs(a - b) for a, b in common), default=float("nan"))
        last = f"{r.losses[-1]:.4f}" if r.losses else "-"
        lines.append(f"{r.backend:>8} {len(r.step_times):>5} {step:>9.4f} "
                     f"{step / base_step:>8.2f}x {comm:>11} {share:>7} {last:>10} {dloss:>11.2e}")
    lines.append(f"s/step: median time between optimizer steps after {warmup} warm-up steps; "
                 "comm: DDP's gradient all_reduce a step (its own timer); loss: rank 0's, "
                 f"compared step by step with {base.backend}'s.")
    return "\n".join(lines)


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--steps", type=click.IntRange(2, 100000), default=30, show_default=True,
              help="optimizer steps a backend")
@click.option("--warmup", type=click.IntRange(0, 1000), default=5, show_default=True,
              help="steps left out of the time a step")
@click.option("--backends", default=None,
              help="comma-separated, the first the reference [default: gloo,swml, and nccl "
                   "where CUDA is available]")
@click.option("--seed", type=int, default=0, show_default=True)
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def main(steps, warmup, backends, seed, script, script_args):
    """Run SCRIPT (under torchrun) with each backend for a few steps and compare."""
    if "RANK" not in os.environ or "MASTER_ADDR" not in os.environ:
        raise click.UsageError("run under torchrun (it sets RANK, WORLD_SIZE, MASTER_ADDR and "
                               "MASTER_PORT), on the hosts the script trains on")
    arms = backends.split(",") if backends else \
        ["gloo", BACKEND_NAME, *(["nccl"] if torch.cuda.is_available() else [])]
    store = _launcher_store(datetime.timedelta(minutes=10))
    results = []
    for index, backend in enumerate(arms):
        results.append(Arm(backend, steps, store, index).run(script, list(script_args), seed))
    if int(os.environ["RANK"]) == 0:
        click.echo(format_rows(results, warmup))


if __name__ == "__main__":
    main()
