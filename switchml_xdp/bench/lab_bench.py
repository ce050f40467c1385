"""`swml-lab bench`: switchml-xdp against what its users would otherwise run,
on an emulated cluster whose links, not its CPUs, are the bottleneck.

One run builds a lab for every worker count (2, 4, 8), rate-limits every
worker link both ways (switchml_xdp/lab/shaping.py), and times allreduce of
the same float32 tensors with:

    swml-afxdp   the XDP switch, workers on the afxdp backend (C engine)
    swml-udp     the XDP switch, workers on the udp backend (kernel sockets)
    userspace    the protocol served by a process in the switch's namespace
                 (switch/userspace.py), the best swml backend: what XDP buys
    gloo         torch.distributed's gloo ring allreduce, TCP, same links

over a sweep of loss (per worker link and direction; swml's UDP through the
lab's loss injector, Gloo's TCP through switchml_xdp/bench/tcp_loss.py; both
attached only where a rate is above 0) and of k (elements a packet). Every
rank is a process in its worker's namespace; ranks build their tensors from
(seed, rank, iteration) (allreduce_bench.make_input), so every system reduces
the same data. Each timed iteration starts after a barrier; its tensor
aggregation time (TAT) is the slowest rank's; results are medians. Rank 0
reads the machine's CPU times around every timed allreduce.

This module is the orchestrator (labs, switches, the sweep, the rows); its
parts: constants.py (systems, defaults, bounds), cpu.py (CPU accounting),
rank.py and rank_group.py (the ranks), report.py and lab_plots.py (output:
bench/results/lab_bench.json, lab_bench.md, PNG plots).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..lab.burst import BurstModel, sweep_meta
from . import raw_lab
from .constants import (
    DEFAULT_ITERATIONS,
    DEFAULT_KS,
    DEFAULT_LOSSES,
    DEFAULT_OUT,
    DEFAULT_RATE_MBIT,
    DEFAULT_SIZE,
    DEFAULT_SYSTEMS,
    DEFAULT_WARMUP,
    DEFAULT_WORKERS,
    DEFINITIONS,
    GLOO_PORT,
    GLOO_SYSTEMS,
    SWML_HEADERS,
    SYSTEMS,
    bound_mbps,
)
from .cpu import Disturbance, cpu_summary, proc_cpu_s, quietness, wait_quiet
from .cpu_per_gib import BoxCpu, compare_to_gloo, per_gib
from .lab_switch import switch_counters, userspace_switch
from .rank_group import RankError, RankGroup
from .report import SKIPPED, boxes_label, markdown, row_line

__all__ = ["SYSTEMS", "DEFAULT_RATE_MBIT", "BenchConfig", "Bench", "run_bench"]

WINDOW_MS = 8.0              # the job's slots cover this long of sending (Bench.job_slots)
MIN_JOB_SLOTS, MAX_JOB_SLOTS = 16, 512


@dataclasses.dataclass
class BenchConfig:
    workers: Sequence[int] = DEFAULT_WORKERS
    rate_mbit: float = DEFAULT_RATE_MBIT
    queue_packets: int | None = None   # shaped queues' depth in packets (None: TBF's 20 ms)
    size: int = DEFAULT_SIZE
    iterations: int = DEFAULT_ITERATIONS
    warmup: int = DEFAULT_WARMUP
    losses: Sequence[float] = DEFAULT_LOSSES
    ks: Sequence[int] = DEFAULT_KS
    systems: Sequence[str] = DEFAULT_SYSTEMS
    out_dir: str = DEFAULT_OUT
    job_slots: int | None = None
    check: bool = True
    plots: bool = True
    command: str = ""
    env: dict = dataclasses.field(default_factory=dict)   # extra environment of every rank
    wait_quiet: float = 0.0    # before each measurement, wait up to this long for a quiet machine
    fanout: str = "multicast"  # the XDP switch's `--fanout` (the user-space one has multicast only)
    collective: str = "allreduce"  # or "reduce_scatter": each rank keeps its shard
    boxes: Sequence[int] = (1,)    # box counts: a lab each, the swml systems over all its boxes
    box_rate_mbit: float | None = None   # every box's port, each way (None: unshaped)
    ports: int = 1                 # >1: one box of that many ports (Lab(ports=P)), bound as P boxes
    burst: float | None = None     # mean burst length: swml's loss in bursts (lab/burst.py)
    mtu: int | None = None         # every lab link's MTU (None: 1500; lab/link_mtu.py)
    link_queues: int = 1           # every lab link's queues (for --env SWML_LANES=Q)
    port_hooks: str = "every"      # which bridge ports run the lab's XDP hook (lab/wiring.py PORT_HOOKS)

    @property
    def lossy(self) -> bool:
        """Any loss above 0: only then are the loss hooks attached (at 0% they cost a frame)."""
        return any(loss > 0 for loss in self.losses)


class Bench:
    def __init__(self, cfg: BenchConfig, out: Callable[[str], None] = print):
        self.cfg, self.out = cfg, out
        self.results: list[dict] = []
        self.unavailable: dict[str, str] = {}
        self.boxes = cfg.boxes[0]     # the current lab's

    # -- one measurement -------------------------------------------------------
    def _record(self, system: str, workers: int, k: int | None, loss: float,
                ranks: list[dict] | None, impl: str | None = None, status: str = "ok",
                extra: dict | None = None) -> dict:
        cfg = self.cfg
        box_rates = [cfg.box_rate_mbit] * max(self.boxes, cfg.ports)
        bound = bound_mbps(system, cfg.rate_mbit, k, workers, cfg.collective, box_rates, cfg.mtu)
        row = {"system": system, "workers": workers, "k": k, "loss": loss,
               "rate_mbit": cfg.rate_mbit, "size_bytes": cfg.size, "iterations": cfg.iterations,
               "warmup": cfg.warmup, "bound_mbps": round(bound, 3),
               "ideal_tat_s": cfg.size * 8 / (bound * 1e6), "status": status, "impl": impl}
        if cfg.burst and system not in GLOO_SYSTEMS:
            row["burst"] = BurstModel.of(loss, cfg.burst).describe() if loss else None
        if ranks:
            per_iter = [max(r["times"][i] for r in ranks) for i in range(len(ranks[0]["times"]))]
            med = statistics.median(per_iter)
            ticks = ranks[0]["cpu_times"]
            counters: dict[str, int] = {}
            for r in ranks:
                for key, v in r["counters"].items():
                    counters[key] = counters.get(key, 0) + v
            timed = sum(ranks[0]["times"])
            row.update({
                "tat_s": per_iter, "tat_median_s": med, "tat_min_s": min(per_iter),
                "tat_max_s": max(per_iter),
                "goodput_mbps": round(cfg.size * 8 / med / 1e6, 3),
                "bound_fraction": round(cfg.size * 8 / med / 1e6 / bound, 4),
                "cpu": cpu_summary(ticks) if ticks else None,
                "workers_cpu_pct": round(100 * sum(r["self_cpu_s"] for r in ranks) / timed
                                         / (os.cpu_count() or 1), 1) if timed else None,
                "rel_err": ranks[0].get("rel_err"),
                "counters": counters,
                "gauges": [r.get("gauges") for r in ranks],
            })
        if system not in GLOO_SYSTEMS:
            row.update(boxes=self.boxes, box_rate_mbit=cfg.box_rate_mbit, ports=cfg.ports)
        if k is not None and system != "gloo":
            row["job_slots"] = self.job_slots(k)
        row.update(extra or {})
        if ranks:
            row["cpu_s_per_gib"] = per_gib(ranks, cfg.size, row.get("box_cpu_s"), row.get("box_calls", 0))
        self.results.append(row)
        self.out(row_line(row))
        if ranks and system == "gloo" and (vs := compare_to_gloo(self.results, row)):
            self.out(vs)
        return row

    def _phase(self, lab, system: str, k: int | None, argv_of, set_loss,
               extra_of: Callable[[], dict] | None = None, box: BoxCpu | None = None) -> bool:
        """Start one rank group and time it at every loss rate (then one call for the box's
        CPU: cpu_per_gib.py). False if it could not start."""
        cfg = self.cfg
        env = cfg.env
        n = len(lab.workers)
        timeout = 120 + 60 * (cfg.iterations + cfg.warmup) * max(1.0, cfg.size * 8 / 1e6 / cfg.rate_mbit)
        try:
            group = RankGroup(lab, argv_of, timeout=300, env={**os.environ, **env} if env else None)
        except RankError as e:
            for loss in cfg.losses:
                self._record(system, n, k, loss, None, status=f"unavailable: {e}")
            self.unavailable[system] = str(e)
            return False
        with group:
            for i, loss in enumerate(cfg.losses):
                set_loss(loss)
                snap = extra_of() if extra_of else None
                if cfg.wait_quiet:
                    wait_quiet(lab, cfg.wait_quiet, out=self.out)
                watch = Disturbance(lab)
                try:
                    with watch:
                        ranks = group.run(cfg.iterations, cfg.warmup, timeout)
                except RankError as e:
                    diag = {"rank_state": getattr(e, "state", None)}
                    with contextlib.suppress(Exception):
                        diag.update(extra_of(snap) if extra_of else {})
                    self._record(system, n, k, loss, None, group.impl, status=f"failed: {e}",
                                 extra=diag)
                    for rest in cfg.losses[i + 1:]:
                        self._record(system, n, k, rest, None, group.impl,
                                     status=f"{SKIPPED}: the run at loss {loss * 100:g}% failed")
                    break
                extra = {**(extra_of(snap) if extra_of else {}), **watch.report()}
                extra.update(box.over_call(group, timeout) if box else {})
                if env:
                    extra["rank_env"] = env
                self._record(system, n, k, loss, ranks, group.impl, extra=extra)
            set_loss(0.0)
        return True

    # -- the sweep ---------------------------------------------------------------
    def run(self) -> dict:
        from ..client.api import _afxdp_unavailable_reason
        from ..lab import Lab

        cfg = self.cfg
        started = time.time()
        quiet = quietness()
        self.out(f"machine before the run: load {quiet['loadavg']}, {quiet['busy_pct_1s']}% busy; "
                 f"top: {', '.join(quiet['top'][:3])}")
        reason = _afxdp_unavailable_reason()
        if reason and {"swml-afxdp", "swml-afxdp16", "userspace"} & set(cfg.systems):
            self.unavailable["swml-afxdp"] = reason
        torch_reason = None
        if set(GLOO_SYSTEMS) & set(cfg.systems):
            try:
                import torch  # noqa: F401 - only whether it is installed
            except ImportError as e:
                torch_reason = f"torch not installed ({e})"
                self.unavailable["gloo"] = torch_reason

        for n, m in ((n, m) for n in cfg.workers for m in cfg.boxes):
            queue = f" ({cfg.queue_packets}-packet queues)" if cfg.queue_packets else ""
            self.out(f"\n== {n} workers, links {cfg.rate_mbit:g} Mbit/s each way{queue}, "
                     f"{boxes_label(m, cfg.box_rate_mbit, cfg.ports)}, "
                     f"{cfg.size / 2**20:g} MiB float32 "
                     f"{cfg.collective}, fan-out {cfg.fanout}{f', MTU {cfg.mtu}' if cfg.mtu else ''}"
                     f"{', XDP hooks on box ports only' if cfg.port_hooks == 'boxes' else ''}, "
                     f"{cfg.warmup} warm-up + {cfg.iterations} iterations")
            self.boxes = m
            with Lab(workers=n, rate_mbit=cfg.rate_mbit, queue_packets=cfg.queue_packets,
                     boxes=m, box_rate_mbit=cfg.box_rate_mbit, ports=cfg.ports, mtu=cfg.mtu,
                     link_queues=cfg.link_queues, port_hooks=cfg.port_hooks) as lab:
                if cfg.lossy:
                    lab.set_loss(0.0)      # attach the loss injector once
                for k in cfg.ks:   # the raw path's ceiling first, then the swml systems
                    raw_lab.around(self, lab, k)
                # Gloo's ring uses no box: one run a worker count, the peer of every box count.
                for system in (s for s in GLOO_SYSTEMS if s in cfg.systems and m == cfg.boxes[0]):
                    if torch_reason:
                        for loss in cfg.losses:
                            self._record(system, n, None, loss, None, status=f"unavailable: {torch_reason}")
                    else:
                        self._gloo(lab, system)
        doc = {"meta": self._meta(started, quiet), "results": self.results}
        self.write(doc)
        return doc

    def _swml_args(self, lab, backend: str, job: str, k: int, precision: str = "32"):
        cfg = self.cfg

        def argv_of(rank, host):
            argv = ["--system", "swml", "--backend", backend,
                    "--switch", ",".join(box.ip for box in lab.switches),
                    "--job", job, "--rank", str(rank), "--world", str(len(lab.workers)),
                    "--size", str(cfg.size), "--k", str(k), "--precision", precision,
                    "--collective", cfg.collective]
            if rank == 0:
                argv += ["--cpu"] + (["--check"] if cfg.check else [])
            return argv
        return argv_of

    def job_slots(self, k: int) -> int:
        """The job's slots: --job-slots, or sized to the link: the smallest
        power of two of packets that covers WINDOW_MS of sending, within
        [MIN_JOB_SLOTS, MAX_JOB_SLOTS]. The congestion window, not the slots,
        bounds what is in flight; the slots bound how far a round whose packet
        was lost can fall behind before it holds up the stream (packet p waits
        for p - slots: slot reuse, and the exponent a float32 block needs), so
        they should cover its recovery: the 2 ms RTO floor, doubled once, and a
        round trip (docs/transport.md, "The job's slots: room for a lost
        round", has the measurements). More costs a little: a float32 call sends
        `slots` exponent-only packets first (0.8% of an 8 MiB call at 64)."""
        if self.cfg.job_slots:
            return self.cfg.job_slots
        want = WINDOW_MS / 1e3 * self.cfg.rate_mbit * 1e6 / 8 / (SWML_HEADERS + 4 * k)
        slots = MIN_JOB_SLOTS
        while slots < want and slots < MAX_JOB_SLOTS:
            slots *= 2
        return slots

    def _switch_args(self, k: int) -> list[str]:
        from ..lab.box_runs import capacity_args

        return ["--elements", str(k), "--job-slots", str(self.job_slots(k)),
                *capacity_args(self.cfg.box_rate_mbit)]

    def _swml_systems(self, lab, k: int) -> None:
        from ..lab.box_runs import switches_on_every_box

        cfg = self.cfg
        n = len(lab.workers)

        def set_loss(loss: float) -> None:   # in bursts with --burst (none at loss 0)
            if cfg.lossy:
                lab.set_loss(loss, burst=cfg.burst)
        wanted = [s for s in ("swml-afxdp", "swml-udp", "swml-afxdp16") if s in cfg.systems]
        if wanted:
            with contextlib.ExitStack() as stack:
                sws = switches_on_every_box(stack, lab, [*self._switch_args(k), "--fanout", cfg.fanout])
                box = BoxCpu.of_switches(sws)
                for system in wanted:
                    backend = "udp" if system == "swml-udp" else "afxdp"
                    precision = "16" if system.endswith("16") else "32"
                    if "swml-afxdp" in self.unavailable and backend == "afxdp":
                        for loss in cfg.losses:
                            self._record(system, n, k, loss, None,
                                         status=f"unavailable: {self.unavailable['swml-afxdp']}")
                        continue
                    job = f"{backend}{precision}n{n}k{k}"
                    self._phase(lab, system, k, self._swml_args(lab, backend, job, k, precision),
                                set_loss, self._counter_deltas(lab), box)
                    set_loss(0.0)
                for sw in sws:
                    assert sw.proc.poll() is None, "a switch died:\n" + "\n".join(sw.output[-20:])
        if "userspace" in cfg.systems:
            backend = "udp" if "swml-afxdp" in self.unavailable else "afxdp"
            with contextlib.ExitStack() as stack:
                try:
                    pids = [stack.enter_context(userspace_switch(lab, self._switch_args(k), b)).proc.pid
                            for b in range(len(lab.switches))]
                except RuntimeError as e:
                    for loss in cfg.losses:
                        self._record("userspace", n, k, loss, None, status=f"unavailable: {e}")
                    return

                def switch_cpu(snap=None):
                    now = (time.monotonic(), sum(map(proc_cpu_s, pids)), switch_counters(lab))
                    if snap is None:
                        return now
                    c0, c1 = snap[2], now[2]
                    return {"switch_proc_cpu_pct": round(100 * (now[1] - snap[1]) / (now[0] - snap[0]), 1),
                            "workers_backend": backend,
                            "switch_counters": {k: c1[k] - c0[k] for k in c1 if c1[k] != c0.get(k)}}
                self._phase(lab, "userspace", k, self._swml_args(lab, backend, f"us{n}k{k}", k),
                            set_loss, switch_cpu, BoxCpu(pids=pids))

    @staticmethod
    def _counter_deltas(lab):
        """extra_of for the XDP switch: its counters' deltas over a phase."""
        def snap(before=None):
            now = switch_counters(lab)
            if before is None:
                return now
            return {"switch_counters": {k: now[k] - before[k] for k in now if now[k] != before[k]}}
        return snap

    def _gloo(self, lab, system: str = "gloo") -> None:
        from .tcp_loss import TcpLoss

        cfg = self.cfg
        master = lab.workers[0].ip
        precision = "16" if system == "gloo-fp16" else "32"

        def argv_of(rank, host):
            argv = ["--system", "gloo", "--rank", str(rank), "--world", str(len(lab.workers)),
                    "--size", str(cfg.size), "--master", master, "--master-port", str(GLOO_PORT),
                    "--iface", host.iface, "--precision", precision, "--collective", cfg.collective]
            if rank == 0:
                argv += ["--cpu"] + (["--check"] if cfg.check else [])
            return argv

        with TcpLoss(lab) if cfg.lossy else contextlib.nullcontext() as tl:  # BenchConfig.lossy
            self._phase(lab, system, None, argv_of, tl.set if tl else lambda loss: None,
                        tl.deltas if tl else None)

    # -- output --------------------------------------------------------------------
    def _meta(self, started: float, quiet: dict) -> dict:
        cfg = self.cfg
        return {
            "command": cfg.command,
            "started": _dt.datetime.fromtimestamp(started).isoformat(timespec="seconds"),
            "duration_s": round(time.time() - started, 1),
            "rate_mbit": cfg.rate_mbit, "queue_packets": cfg.queue_packets, "fanout": cfg.fanout,
            "collective": cfg.collective, "size_bytes": cfg.size, "iterations": cfg.iterations,
            "warmup": cfg.warmup, "workers": list(cfg.workers), "losses": list(cfg.losses),
            "loss_hooks": cfg.lossy, "ks": list(cfg.ks), "systems": list(cfg.systems),
            "job_slots": cfg.job_slots, "rank_env": dict(cfg.env), "mtu": cfg.mtu,
            "link_queues": cfg.link_queues, "port_hooks": cfg.port_hooks,
            "wait_quiet_s": cfg.wait_quiet,
            "unavailable": self.unavailable,
            "machine": {"cores": os.cpu_count(), "kernel": platform.release(),
                        "python": platform.python_version(), "quiet_before": quiet},
            "boxes": list(cfg.boxes), "box_rate_mbit": cfg.box_rate_mbit, "ports": cfg.ports,
            "burst": sweep_meta(cfg.losses, cfg.burst),
            "definitions": DEFINITIONS,
        }

    def write(self, doc: dict) -> dict[str, Path]:
        out = Path(self.cfg.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"json": out / "lab_bench.json", "md": out / "lab_bench.md"}
        paths["json"].write_text(json.dumps(doc, indent=1) + "\n")
        paths["md"].write_text(markdown(doc))
        if self.cfg.plots:
            from .lab_plots import plot_all
            paths.update(plot_all(doc, out))
        self.out("\nwrote " + ", ".join(str(p) for p in paths.values()))
        return paths


def run_bench(cfg: BenchConfig, out: Callable[[str], None] = print) -> dict:
    return Bench(cfg, out).run()
