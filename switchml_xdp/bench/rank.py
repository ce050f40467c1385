"""One rank of `swml-lab bench`: a process in its worker's namespace that
joins a switchml-xdp job (or a Gloo process group), says it is ready, then
runs what the orchestrator (rank_group.RankGroup) asks on stdin, one JSON
line each, and answers each on stdout: the times of its timed allreduces,
the machine's CPU times over them (rank 0), its own CPU time, counters.

    python -m switchml_xdp.bench.rank --system swml --rank R --world N ...

(an internal program of the bench, not a user command)
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from types import SimpleNamespace

import click

from .. import wire
from .constants import GLOO_PORT
from .cpu import CPU_FIELDS, machine_cpu_times, self_cpu_s


class _SwmlRank:
    def __init__(self, a):
        import numpy as np

        from ..client.api import Worker

        self.np = np
        # SWML_PORT, as the torch backend reads it (`swml-lab bench --env
        # SWML_PORT=P`): on a lab of several queues, which queue the job's
        # RESULTs land on (lab/steering.py)
        self.w = Worker(a.switch, a.job, a.rank, a.world, backend=a.backend, verbose=False,
                        join_timeout=120, port=int(os.environ.get("SWML_PORT", wire.DEFAULT_PORT)))
        self._one = np.zeros(1, np.int32)
        self.precision = a.precision
        self.scatter = a.collective == "reduce_scatter"
        self.name = self.w.backend_name + ("" if a.precision == "32" else f", {a.precision}-bit")

    def barrier(self) -> None:
        self._one[0] = 1
        self.w.allreduce(self._one)

    def allreduce(self, a):
        """The timed call on `a`; returns what it leaves this rank (its
        shard, for a reduce_scatter)."""
        if self.scatter:
            return self.w.reduce_scatter(a, precision=self.precision)
        return self.w.allreduce(a, precision=self.precision)

    # state (the box's pace too), not counts
    GAUGES = ("srtt_us", "rto_us", "cwnd", "rate_kbps", "dscp", "reo_mult")

    def counters(self) -> dict:
        s = self.w.stats()
        skip = {"rank", "world", "k", "slots", "job_id", "tensors", "elements", "seconds", *self.GAUGES}
        out = {k: v for k, v in s.items() if isinstance(v, int) and k not in skip}
        for i, box in enumerate(s.get("boxes", ())):   # a job over several boxes: each one's part
            out[f"box{i}_packets_sent"] = box["packets_sent"]
        return out

    def gauges(self) -> dict:
        s = self.w.stats()
        return {k: s[k] for k in self.GAUGES if k in s}

    def close(self) -> None:
        self.w.close()


class _GlooRank:
    def __init__(self, a):
        import datetime

        os.environ.update(MASTER_ADDR=a.master, MASTER_PORT=str(a.master_port),
                          GLOO_SOCKET_IFNAME=a.iface)
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)     # N ranks share the machine's cores
        self.torch, self.dist = torch, dist
        self.fp16 = a.precision == "16"
        self.scatter = a.collective == "reduce_scatter"
        self.world = a.world
        dist.init_process_group("gloo", rank=a.rank, world_size=a.world,
                                timeout=datetime.timedelta(seconds=300))
        self.name = f"gloo (torch {torch.__version__})" + (", fp16" if self.fp16 else "")

    def barrier(self) -> None:
        self.dist.barrier()

    def allreduce(self, a):
        t = self.torch.from_numpy(a)
        # fp16: torch's fp16_compress_hook, a float16 copy reduced and cast back (timed)
        x = t.to(self.torch.float16) if self.fp16 else t
        if self.scatter:
            out = x.new_empty(x.numel() // self.world)
            self.dist.reduce_scatter_tensor(out, x)
            return out.float().numpy()
        self.dist.all_reduce(x)
        if self.fp16:
            t.copy_(x)
        return a

    def counters(self) -> dict:
        return {}

    def gauges(self) -> dict:
        return {}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.dist.destroy_process_group()


def _check_error(a, result, it: int) -> float:
    """max |result - exact sum| / max |exact sum| (exact in float64), over
    what the call left this rank: the whole tensor, or its shard."""
    import numpy as np

    from .allreduce_bench import make_input

    n = a.size // 4
    mine = slice(a.rank * result.size, (a.rank + 1) * result.size) if result.size < n else slice(0, n)
    exact = np.zeros(result.size, np.float64)
    for r in range(a.world):
        exact += make_input("float32", n, r, it)[mine]
    scale = float(np.max(np.abs(exact))) or 1.0
    return float(np.max(np.abs(result.astype(np.float64) - exact))) / scale


def _run_iterations(a, impl, cmd: dict) -> dict:
    import numpy as np

    from .allreduce_bench import make_input

    n = a.size // 4
    iterations, warmup = int(cmd["iterations"]), int(cmd["warmup"])
    start_at = cmd.get("start_at")    # a time.monotonic() every rank of every job waits for
    late = cmd.get("late") or {}   # {"rank": R, "s": S}: rank R calls S seconds after the others
    ticks = [0.0] * len(CPU_FIELDS)
    times, ends, cpu_calls = [], [], []
    err = checked = None
    before = impl.counters()
    src = [make_input("float32", n, a.rank, it) for it in range(min(iterations + warmup, 2))]
    buf = np.empty(n, np.float32)
    for it in range(warmup + iterations):
        np.copyto(buf, src[it % len(src)])        # the same tensors for every system
        if it == warmup and start_at is not None:
            time.sleep(max(0.0, float(start_at) - time.monotonic()))
        impl.barrier()
        if it >= warmup and late.get("rank") == a.rank:
            time.sleep(float(late["s"]))
        s0, c0 = machine_cpu_times() if a.cpu else None, self_cpu_s()
        t0 = time.perf_counter()
        result = impl.allreduce(buf)
        dt = time.perf_counter() - t0
        c1, s1 = self_cpu_s(), machine_cpu_times() if a.cpu else None
        if it >= warmup:
            times.append(dt)
            ends.append(time.monotonic())
            cpu_calls.append(c1 - c0)
            if a.cpu:
                ticks = [t + (y - x) for t, x, y in zip(ticks, s0, s1)]
        if it == warmup and a.check:
            # Checked after the loop: computing the exact sum here would leave
            # the link idle between timed calls (0.3 s at 16 MiB), a gap other
            # jobs' completions would pay for in a race (jobs_bench.py).
            checked = (result.copy(), it % len(src))
    if checked is not None:
        err = _check_error(a, *checked)
    after = impl.counters()
    return {"rank": a.rank, "times": times, "ends": ends, "cpu_times": ticks if a.cpu else None,
            "self_cpu_s": sum(cpu_calls), "cpu_s": cpu_calls, "rel_err": err,
            "counters": {k: after[k] - before.get(k, 0) for k in after}, "gauges": impl.gauges()}


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--system", type=click.Choice(["swml", "gloo"]), required=True,
              help="reduce through the switch or with Gloo's ring")
@click.option("--backend", default="udp", show_default=True, help="the swml worker backend")
@click.option("--switch", default=None, help="the switch's address (swml)")
@click.option("--job", default="bench", show_default=True, help="the swml job name")
@click.option("--rank", type=int, required=True, help="this rank")
@click.option("--world", type=int, required=True, help="ranks in all")
@click.option("--size", type=int, required=True, help="float32 elements a tensor")
@click.option("--k", type=int, default=0, show_default=True, help="the switch's k (for the error check)")
@click.option("--master", default=None, help="rank 0's address (Gloo's rendezvous)")
@click.option("--master-port", type=int, default=GLOO_PORT, show_default=True,
              help="rank 0's port (Gloo's rendezvous)")
@click.option("--iface", default=None, help="the interface towards the switch")
@click.option("--precision", type=click.Choice(["32", "16"]), default="32", show_default=True,
              help="swml: the payload format (16: the 16-bit block format); gloo: 16 reduces "
                   "a float16 copy, as torch's fp16 compression hook")
@click.option("--collective", type=click.Choice(["allreduce", "reduce_scatter"]), default="allreduce",
              show_default=True, help="what is timed: an allreduce, or a reduce_scatter (each rank "
                                      "keeps its shard; swml: Worker.reduce_scatter)")
@click.option("--cpu", is_flag=True, help="sample the machine's CPU times (rank 0)")
@click.option("--check", is_flag=True, help="check the first timed result")
def rank_main(**options) -> None:
    """One rank of `swml-lab bench`: set up, say ready, then run what stdin
    asks, one JSON line each (bench/rank_group.py drives it)."""
    a = SimpleNamespace(**options)

    def say(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    try:
        impl = _SwmlRank(a) if a.system == "swml" else _GlooRank(a)
    except Exception as e:  # noqa: BLE001 - reported to the orchestrator, one line
        say({"error": f"{type(e).__name__}: {e}".splitlines()[0]})
        sys.exit(1)
    say({"ready": True, "impl": impl.name})
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd.get("op") == "quit":
                break
            try:
                say(_run_iterations(a, impl, cmd))
            except Exception as e:  # noqa: BLE001 - reported to the orchestrator, one line
                try:
                    state = {"counters": impl.counters(), "gauges": impl.gauges()}
                except Exception:  # noqa: BLE001 - a broken rank may have none to report
                    state = {}
                say({"error": f"{type(e).__name__}: {e}".splitlines()[0], **state})
                sys.exit(1)
    finally:
        impl.close()


if __name__ == "__main__":
    rank_main()
