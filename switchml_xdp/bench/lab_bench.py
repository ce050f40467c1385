"""`swml-lab bench`: switchml-xdp against what its users would otherwise run,
on an emulated cluster whose links, not its CPUs, are the bottleneck.

One run builds a lab for every worker count (2, 4, 8), rate-limits every
worker link (switchml_xdp/lab/topology.py: the same rate up and down for every
kind of traffic), and times allreduce of the same float32 tensors with:

    swml-afxdp   the XDP switch, workers on the afxdp backend (C engine)
    swml-udp     the XDP switch, workers on the udp backend (kernel sockets)
    userspace    the same protocol served by a plain process in the switch
                 namespace (switchml_xdp/switch/userspace.py), workers on the
                 best swml backend available: what XDP buys
    gloo         ring allreduce of torch.distributed (backend gloo), TCP over the
                 same shaped links

over a sweep of loss (per worker link and direction; swml's UDP through the
lab's loss injector, Gloo's TCP through switchml_xdp/bench/tcp_loss.py) and of
k (elements a packet; Gloo does not depend on it). Every rank is a process of
its own in its worker's namespace; ranks build their tensors from (seed, rank,
iteration) (allreduce_bench.make_input), so every system reduces the same data.
Each timed iteration starts after a barrier; its tensor aggregation time (TAT)
is the slowest rank's; results are medians over iterations. Rank 0 reads
/proc/stat around every timed allreduce, so the CPU use printed beside each
result is the whole machine's while allreduces ran.

Results: bench/results/lab_bench.json, lab_bench.md, and PNG plots
(switchml_xdp/bench/lab_plots.py).

Rank processes are `python -m switchml_xdp.bench.lab_bench rank ...`; they
talk to the orchestrator in JSON lines on stdin/stdout.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import os
import platform
import resource
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from .. import wire

SYSTEMS = ("swml-afxdp", "swml-udp", "userspace", "gloo")
LABELS = {
    "swml-afxdp": "switchml-xdp, afxdp",
    "swml-udp": "switchml-xdp, udp",
    "userspace": "user-space switch",
    "gloo": "Gloo ring (TCP)",
}
DEFAULT_WORKERS = (2, 4, 8)
DEFAULT_LOSSES = (0.0, 0.001, 0.01)
DEFAULT_KS = (64, 256)
DEFAULT_RATE_MBIT = 50.0
DEFAULT_SIZE = 8 << 20
DEFAULT_ITERATIONS = 5
DEFAULT_WARMUP = 1
DEFAULT_OUT = "bench/results"
GLOO_PORT = 29500
WINDOW_MS = 3.0              # job window sized to keep the link busy this long (Bench.job_slots)
MIN_JOB_SLOTS, MAX_JOB_SLOTS = 16, 512
USERSPACE_NICE = -10         # the user-space switch's scheduling priority (see _userspace_switch)
FOREIGN_WARN_PCT = 5.0       # other processes' CPU share above which a result is flagged

# Header-adjusted link bounds (what the shaper counts: the Ethernet frame from
# destination MAC to the end of the payload; no preamble, FCS or gap, which a
# veth does not have).
SWML_HEADERS = wire.HEADERS_LEN                 # Ethernet 14 + IPv4 20 + UDP 8 + swml 16
TCP_MSS = 1448                                  # MTU 1500 - IPv4 20 - TCP 20 - timestamps 12
TCP_FRAME = TCP_MSS + 14 + 20 + 20 + 12         # 1514


def swml_bound_mbps(rate_mbit: float, k: int) -> float:
    """Most tensor bytes a second a worker can reduce through the switch: each
    packet carries 4k payload bytes in 58 + 4k bytes on the link, and a worker
    sends every byte once and receives every byte once, each way at the rate."""
    return rate_mbit * 4 * k / (SWML_HEADERS + 4 * k)


def gloo_bound_mbps(rate_mbit: float, workers: int) -> float:
    """Ring allreduce moves 2(N-1)/N of the tensor over each link direction, in
    TCP segments of 1448 payload bytes in 1514-byte frames."""
    if workers < 2:
        return float("inf")
    return rate_mbit * TCP_MSS / TCP_FRAME * workers / (2 * (workers - 1))


def bound_mbps(system: str, rate_mbit: float, k: int | None, workers: int) -> float:
    return gloo_bound_mbps(rate_mbit, workers) if system == "gloo" else swml_bound_mbps(rate_mbit, k)


# ------------------------------------------------------------------ CPU accounting

CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def read_proc_stat() -> list[int]:
    with open("/proc/stat") as f:
        parts = f.readline().split()
    return [int(x) for x in parts[1:1 + len(CPU_FIELDS)]]


def cpu_summary(ticks: Sequence[int]) -> dict:
    """Shares of the machine (100 % = every core busy) from summed /proc/stat deltas."""
    d = dict(zip(CPU_FIELDS, ticks))
    total = sum(ticks) or 1
    pct = lambda v: round(100.0 * v / total, 1)  # noqa: E731
    return {"busy_pct": pct(total - d["idle"] - d["iowait"]),
            "user_pct": pct(d["user"] + d["nice"]), "system_pct": pct(d["system"]),
            "softirq_pct": pct(d["irq"] + d["softirq"]), "steal_pct": pct(d["steal"]),
            "cores": os.cpu_count()}


def self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def foreign_cpu(ours: set[int]) -> dict[int, float]:
    """CPU seconds of every user process outside the lab and this bench, by
    pid: utime + stime, plus the children it has reaped (cutime + cstime),
    so that a test runner's short-lived children count too. `ours`: inodes of
    the lab's network namespaces. Kernel threads are left out (softirq work
    for the lab runs in ksoftirqd too)."""
    me, out = os.getpid(), {}
    tck = os.sysconf("SC_CLK_TCK")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if os.stat(f"/proc/{entry.name}/ns/net").st_ino in ours:
                continue
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == 2 or int(fields[6]) & 0x00200000:   # kthreadd's children / PF_KTHREAD
            continue
        out[int(entry.name)] = sum(int(x) for x in fields[11:15]) / tck
    return out


class Disturbance:
    """Watches, while a measurement runs, for other people's work on the
    machine: CPU of processes outside the lab (sampled every half second, so
    that short-lived ones are seen too), and network namespaces other than the
    lab's (another lab is up: its traffic costs softirq time no process
    accounting shows)."""

    def __init__(self, lab):
        from ..lab import netns

        self._netns = netns
        self.mine = set(lab.namespaces)
        self.ours = {os.stat(netns.ns_path(ns)).st_ino for ns in lab.namespaces}
        self._stop = None

    def __enter__(self) -> "Disturbance":
        import threading

        self.cpu_s, self.others = 0.0, set()
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._last = foreign_cpu(self.ours)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        now = foreign_cpu(self.ours)
        self.cpu_s += sum(max(0.0, v - self._last.get(pid, 0.0)) for pid, v in now.items())
        self._last = now
        with contextlib.suppress(OSError):
            self.others |= set(self._netns.list_netns()) - self.mine

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            self._sample()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.wall = time.monotonic() - self._t0

    def report(self) -> dict:
        return {"foreign_cpu_pct": round(100 * self.cpu_s / self.wall / (os.cpu_count() or 1), 1),
                "other_netns": sorted(self.others)}


def wait_quiet(lab, max_s: float, busy_pct: float = 8.0, out=None) -> float:
    """Wait (at most max_s) until no other network namespace is up and the
    machine has been under busy_pct busy for three 1-second samples in a row
    (the lab's own processes are idle between measurements). Returns the
    seconds waited."""
    from ..lab import netns

    t0 = time.monotonic()
    mine, calm, told = set(lab.namespaces), 0, False
    while calm < 3 and time.monotonic() - t0 < max_s:
        s0 = read_proc_stat()
        time.sleep(1.0)
        busy = cpu_summary([b - a for a, b in zip(s0, read_proc_stat())])["busy_pct"]
        others = set(netns.list_netns()) - mine
        calm = calm + 1 if busy < busy_pct and not others else 0
        if not calm and not told and out:
            out(f"  (waiting for a quiet machine: {busy:.0f}% busy, "
                f"{len(others)} other namespaces)")
            told = True
    return time.monotonic() - t0


def disturbed(r: dict) -> bool:
    return (r.get("foreign_cpu_pct") or 0) >= FOREIGN_WARN_PCT or bool(r.get("other_netns"))


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process (all threads), in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


# ==================================================================== rank side

class _SwmlRank:
    def __init__(self, a):
        import numpy as np

        from ..worker.api import Worker

        self.np = np
        self.w = Worker(a.switch, a.job, a.rank, a.world, backend=a.backend, verbose=False,
                        join_timeout=120)
        self._one = np.zeros(1, np.int32)
        self.name = self.w.backend_name

    def barrier(self) -> None:
        self._one[0] = 1
        self.w.allreduce(self._one)

    def allreduce(self, a) -> None:
        self.w.allreduce(a)

    GAUGES = ("srtt_us", "rto_us")          # afxdp engine state, not counts

    def counters(self) -> dict:
        s = self.w.stats()
        skip = {"rank", "world", "k", "slots", "job_id", "tensors", "elements", "seconds", *self.GAUGES}
        return {k: v for k, v in s.items() if isinstance(v, int) and k not in skip}

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
        dist.init_process_group("gloo", rank=a.rank, world_size=a.world,
                                timeout=datetime.timedelta(seconds=300))
        self.name = f"gloo (torch {torch.__version__})"

    def barrier(self) -> None:
        self.dist.barrier()

    def allreduce(self, a) -> None:
        self.dist.all_reduce(self.torch.from_numpy(a))

    def counters(self) -> dict:
        return {}

    def gauges(self) -> dict:
        return {}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.dist.destroy_process_group()


def _check_error(a, result, it: int, k: int) -> float:
    """max |result - exact sum| / max |exact sum| (exact in float64)."""
    import numpy as np

    from .allreduce_bench import make_input

    exact = np.zeros(result.size, np.float64)
    for r in range(a.world):
        exact += make_input("float32", result.size, r, it)
    scale = float(np.max(np.abs(exact))) or 1.0
    return float(np.max(np.abs(result.astype(np.float64) - exact))) / scale


def _run_iterations(a, impl, cmd: dict) -> dict:
    import numpy as np

    from .allreduce_bench import make_input

    n = a.size // 4
    iterations, warmup = int(cmd["iterations"]), int(cmd["warmup"])
    ticks = [0] * len(CPU_FIELDS)
    times, cpu_self = [], 0.0
    err = None
    before = impl.counters()
    src = [make_input("float32", n, a.rank, it) for it in range(min(iterations + warmup, 2))]
    buf = np.empty(n, np.float32)
    for it in range(warmup + iterations):
        np.copyto(buf, src[it % len(src)])        # the same tensors for every system
        impl.barrier()
        s0, c0 = read_proc_stat() if a.cpu else None, self_cpu_s()
        t0 = time.perf_counter()
        impl.allreduce(buf)
        dt = time.perf_counter() - t0
        c1, s1 = self_cpu_s(), read_proc_stat() if a.cpu else None
        if it >= warmup:
            times.append(dt)
            cpu_self += c1 - c0
            if a.cpu:
                ticks = [t + (y - x) for t, x, y in zip(ticks, s0, s1)]
        if it == warmup and a.check:
            err = _check_error(a, buf, it % len(src), a.k)
    after = impl.counters()
    return {"rank": a.rank, "times": times, "proc_stat": ticks if a.cpu else None,
            "self_cpu_s": cpu_self, "rel_err": err,
            "counters": {k: after[k] - before.get(k, 0) for k in after}, "gauges": impl.gauges()}


def rank_main(argv: Sequence[str] | None = None) -> None:
    """One rank: set up, say ready, then run what stdin asks, one JSON line each."""
    import argparse

    p = argparse.ArgumentParser(prog="lab_bench rank")
    p.add_argument("--system", choices=("swml", "gloo"), required=True)
    p.add_argument("--backend", default="udp")
    p.add_argument("--switch", default=None)
    p.add_argument("--job", default="bench")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--k", type=int, default=0)
    p.add_argument("--master", default=None)
    p.add_argument("--master-port", type=int, default=GLOO_PORT)
    p.add_argument("--iface", default=None)
    p.add_argument("--cpu", action="store_true", help="sample /proc/stat (rank 0)")
    p.add_argument("--check", action="store_true", help="check the first timed result")
    a = p.parse_args(argv)

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
            except Exception as e:  # noqa: BLE001
                try:
                    state = {"counters": impl.counters(), "gauges": impl.gauges()}
                except Exception:  # noqa: BLE001
                    state = {}
                say({"error": f"{type(e).__name__}: {e}".splitlines()[0], **state})
                sys.exit(1)
    finally:
        impl.close()


# ==================================================================== orchestrator

class RankError(RuntimeError):
    pass


class RankGroup:
    """One process per worker, in the worker's namespace, driven in lockstep."""

    def __init__(self, lab, argv_of: Callable[[int, object], list[str]], timeout: float = 300.0,
                 env: dict | None = None):
        self.lab = lab
        self.procs = []
        self.impl = None
        self.errs = []             # stderr of each rank: a file, so it can never block the rank
        for rank, host in enumerate(lab.workers):
            argv = [sys.executable, "-m", "switchml_xdp.bench.lab_bench", "rank", *argv_of(rank, host)]
            err = tempfile.TemporaryFile("w+")
            self.errs.append(err)
            self.procs.append(lab.popen(host, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=err, text=True, bufsize=1, env=env))
        try:
            replies = self._collect(timeout)
        except BaseException:
            self.close()
            raise
        self.impl = replies[0].get("impl")

    def _collect(self, timeout: float) -> list[dict]:
        """One JSON line from every rank; RankError with the first failure's reason."""
        deadline = time.monotonic() + timeout
        replies: dict[int, dict] = {}
        pending = {p.stdout.fileno(): (r, p) for r, p in enumerate(self.procs)}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RankError(f"rank(s) {sorted(r for r, _ in pending.values())} did not answer "
                                f"within {timeout:g} s")
            ready, _, _ = select.select(list(pending), [], [], min(left, 1.0))
            for fd in ready:
                r, p = pending.pop(fd)
                line = p.stdout.readline()
                if not line:
                    p.wait(timeout=10)
                    self.errs[r].seek(0)
                    err = self.errs[r].read().strip().splitlines()
                    raise RankError(f"rank {r} exited ({p.returncode}): "
                                    f"{err[-1] if err else 'no output'}")
                msg = json.loads(line)
                if "error" in msg:
                    err = RankError(f"rank {r}: {msg['error']}")
                    err.state = {k: v for k, v in msg.items() if k != "error"}
                    raise err
                replies[r] = msg
        return [replies[r] for r in range(len(self.procs))]

    def run(self, iterations: int, warmup: int, timeout: float) -> list[dict]:
        for p in self.procs:
            p.stdin.write(json.dumps({"op": "run", "iterations": iterations, "warmup": warmup}) + "\n")
            p.stdin.flush()
        return self._collect(timeout)

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(Exception):
                if p.poll() is None:
                    p.stdin.write(json.dumps({"op": "quit"}) + "\n")
                    p.stdin.flush()
        deadline = time.monotonic() + 15
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            for f in (p.stdin, p.stdout):
                with contextlib.suppress(Exception):
                    f.close()
        for f in self.errs:
            f.close()

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def __enter__(self) -> "RankGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _status_counters(lab) -> dict:
    """The switch's counters through the control protocol's `status`."""
    import socket

    with lab.enter(lab.switch):
        conn = socket.create_connection((lab.switch.ip, wire.DEFAULT_CONTROL_PORT), timeout=10)
    with conn, conn.makefile("rb") as f:
        conn.sendall(b'{"op":"status"}\n')
        return json.loads(f.readline()).get("counters", {})


def _userspace_switch(lab, args: Sequence[str]):
    """The user-space switch in the lab's switch namespace, as SwitchProcess
    runs the XDP one (same ready line, same stop())."""
    from ..lab.cluster import SwitchProcess

    class UserspaceSwitchProcess(SwitchProcess):
        def __init__(self, lab, args, ready_timeout: float = 60.0):
            import threading

            self.lab, self.iface = lab, lab.switch.iface
            # nice -10: a switch is a box of its own; here it shares two cores with
            # the workers, and the XDP switch's softirq work preempts them anyway.
            argv = ["nice", "-n", str(USERSPACE_NICE), sys.executable, "-m",
                    "switchml_xdp.switch.userspace", "up", self.iface, *args]
            self.started = time.monotonic()
            self.proc = lab.popen(lab.switch, argv, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, bufsize=1)
            self.output = []
            self.ready_line = self._wait_ready(ready_timeout)
            self.startup_s = time.monotonic() - self.started
            self._drain = threading.Thread(target=self._drain_output, daemon=True)
            self._drain.start()

        def _remove_leftovers(self) -> None:
            pass  # nothing pinned, no state file

    return UserspaceSwitchProcess(lab, args)


@dataclasses.dataclass
class BenchConfig:
    workers: Sequence[int] = DEFAULT_WORKERS
    rate_mbit: float = DEFAULT_RATE_MBIT
    size: int = DEFAULT_SIZE
    iterations: int = DEFAULT_ITERATIONS
    warmup: int = DEFAULT_WARMUP
    losses: Sequence[float] = DEFAULT_LOSSES
    ks: Sequence[int] = DEFAULT_KS
    systems: Sequence[str] = SYSTEMS
    out_dir: str = DEFAULT_OUT
    job_slots: int | None = None
    check: bool = True
    plots: bool = True
    command: str = ""
    env: dict = dataclasses.field(default_factory=dict)   # extra environment of every rank
    rto_floor: bool = True     # afxdp: timeout floor from the window's drain time (afxdp_env)
    wait_quiet: float = 0.0    # before each measurement, wait up to this long for a quiet machine


def _quietness() -> dict:
    """Load and the busiest other processes, to record how quiet the machine was."""
    load = os.getloadavg()
    s0 = read_proc_stat()
    time.sleep(1.0)
    idle = cpu_summary([b - a for a, b in zip(s0, read_proc_stat())])
    r = subprocess.run(["ps", "-eo", "pcpu,comm", "--sort=-pcpu", "--no-headers"],
                       capture_output=True, text=True)
    top = [" ".join(line.split()) for line in r.stdout.splitlines()[:5]]
    return {"loadavg": [round(x, 2) for x in load], "busy_pct_1s": idle["busy_pct"], "top": top}


class Bench:
    def __init__(self, cfg: BenchConfig, out: Callable[[str], None] = print):
        self.cfg, self.out = cfg, out
        self.results: list[dict] = []
        self.unavailable: dict[str, str] = {}

    # -- one measurement -------------------------------------------------------
    def _record(self, system: str, workers: int, k: int | None, loss: float,
                ranks: list[dict] | None, impl: str | None = None, status: str = "ok",
                extra: dict | None = None) -> dict:
        cfg = self.cfg
        bound = bound_mbps(system, cfg.rate_mbit, k, workers)
        row = {"system": system, "workers": workers, "k": k, "loss": loss,
               "rate_mbit": cfg.rate_mbit, "size_bytes": cfg.size, "iterations": cfg.iterations,
               "warmup": cfg.warmup, "bound_mbps": round(bound, 3),
               "ideal_tat_s": cfg.size * 8 / (bound * 1e6), "status": status, "impl": impl}
        if ranks:
            per_iter = [max(r["times"][i] for r in ranks) for i in range(len(ranks[0]["times"]))]
            med = statistics.median(per_iter)
            ticks = ranks[0]["proc_stat"]
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
        if k is not None and system != "gloo":
            row["job_slots"] = self.job_slots(k)
        if extra:
            row.update(extra)
        self.results.append(row)
        self._print_row(row)
        return row

    def _print_row(self, r: dict) -> None:
        where = f"N={r['workers']} k={r['k'] or '-':>3} loss={r['loss'] * 100:g}%"
        if r["status"] != "ok":
            self.out(f"  {LABELS[r['system']]:<22} {where:<24} {r['status']}")
            return
        cpu = r["cpu"]
        cpu_s = (f"CPU {cpu['busy_pct']:5.1f}% (softirq {cpu['softirq_pct']:.0f}%, "
                 f"workers {r['workers_cpu_pct']:.0f}%)") if cpu else "CPU ?"
        retx = r["counters"].get("retransmissions")
        if disturbed(r):
            cpu_s += (f"  [disturbed: other processes {r.get('foreign_cpu_pct', 0):.0f}%"
                      + (f", {len(r['other_netns'])} other namespaces" if r.get("other_netns") else "")
                      + "]")
        self.out(f"  {LABELS[r['system']]:<22} {where:<24} TAT {r['tat_median_s'] * 1e3:8.1f} ms "
                 f"[{r['tat_min_s'] * 1e3:.0f}-{r['tat_max_s'] * 1e3:.0f}]  "
                 f"{r['goodput_mbps']:7.1f} Mbit/s = {r['bound_fraction'] * 100:5.1f}% of bound  "
                 f"{cpu_s}" + (f"  retx {retx}" if retx is not None else ""))

    def _phase(self, lab, system: str, k: int | None, argv_of, set_loss,
               extra_of: Callable[[], dict] | None = None, env: dict | None = None) -> bool:
        """Start one rank group and time it at every loss rate. False if it could not start."""
        cfg = self.cfg
        env = {**(env or {}), **cfg.env}
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
                        self._record(system, n, k, rest, None, group.impl, status="failed: see above")
                    break
                extra = extra_of(snap) if extra_of else {}
                extra.update(watch.report())
                if env:
                    extra["rank_env"] = env
                self._record(system, n, k, loss, ranks, group.impl, extra=extra)
            set_loss(0.0)
        return True

    # -- the sweep ---------------------------------------------------------------
    def run(self) -> dict:
        from ..lab import Lab
        from ..lab.cluster import SwitchProcess
        from ..worker.api import _afxdp_unavailable_reason

        cfg = self.cfg
        started = time.time()
        quiet = _quietness()
        self.out(f"machine before the run: load {quiet['loadavg']}, {quiet['busy_pct_1s']}% busy; "
                 f"top: {', '.join(quiet['top'][:3])}")
        reason = _afxdp_unavailable_reason()
        if reason and "swml-afxdp" in cfg.systems:
            self.unavailable["swml-afxdp"] = reason
        torch_reason = None
        if "gloo" in cfg.systems:
            try:
                import torch  # noqa: F401
            except ImportError as e:
                torch_reason = f"torch not installed ({e})"
                self.unavailable["gloo"] = torch_reason

        for n in cfg.workers:
            self.out(f"\n== {n} workers, links {cfg.rate_mbit:g} Mbit/s each way, "
                     f"{cfg.size / 2**20:g} MiB float32, {cfg.warmup} warm-up + "
                     f"{cfg.iterations} iterations")
            with Lab(workers=n, rate_mbit=cfg.rate_mbit) as lab:
                lab.set_loss(0.0)          # attach the loss injector once
                for k in cfg.ks:
                    self._swml_systems(lab, k, SwitchProcess)
                if "gloo" in cfg.systems:
                    if torch_reason:
                        for loss in cfg.losses:
                            self._record("gloo", n, None, loss, None, status=f"unavailable: {torch_reason}")
                    else:
                        self._gloo(lab)
        doc = {"meta": self._meta(started, quiet), "results": self.results}
        self.write(doc)
        return doc

    def _swml_args(self, lab, backend: str, job: str, k: int):
        cfg = self.cfg

        def argv_of(rank, host):
            argv = ["--system", "swml", "--backend", backend, "--switch", lab.switch.ip,
                    "--job", job, "--rank", str(rank), "--world", str(len(lab.workers)),
                    "--size", str(cfg.size), "--k", str(k)]
            if rank == 0:
                argv += ["--cpu"] + (["--check"] if cfg.check else [])
            return argv
        return argv_of

    def job_slots(self, k: int) -> int:
        """The job's window: --job-slots, or sized to the link: the smallest
        power of two of packets that keeps the link busy for WINDOW_MS (a few
        times the lab's round trip when the CPUs are loaded), within
        [MIN_JOB_SLOTS, MAX_JOB_SLOTS]. SwitchML sizes its pool to the
        bandwidth-delay product the same way; a window much larger than that
        only waits in the shaper's queue, which lengthens the round trip, and
        with it the timeouts and the cost of every loss."""
        if self.cfg.job_slots:
            return self.cfg.job_slots
        want = WINDOW_MS / 1e3 * self.cfg.rate_mbit * 1e6 / 8 / (SWML_HEADERS + 4 * k)
        slots = MIN_JOB_SLOTS
        while slots < want and slots < MAX_JOB_SLOTS:
            slots *= 2
        return slots

    def afxdp_env(self, k: int) -> dict:
        """The afxdp engine's retransmission timeout floor (and first timeout)
        for this link: twice the time the link takes to carry a whole window
        (job slots x frame size). A window far larger than the link's
        bandwidth-delay product waits in the shaper's queue, so that is the
        round trip a packet sees; below it, the timer fires on packets that
        are only queued. (One sets SwitchML's timeout for its network the same
        way; a lost packet still costs only its own slot this long, the rest
        of the window keeps the link busy.)"""
        if not self.cfg.rto_floor:
            return {}
        drain = self.job_slots(k) * (SWML_HEADERS + 4 * k) * 8 / (self.cfg.rate_mbit * 1e6)
        floor = f"{max(0.002, 2 * drain):.4f}"
        return {"SWML_AFXDP_RTO_MIN": floor, "SWML_AFXDP_RTO_INITIAL": floor}

    def _switch_args(self, k: int) -> list[str]:
        return ["--elements", str(k), "--job-slots", str(self.job_slots(k))]

    def _swml_systems(self, lab, k: int, SwitchProcess) -> None:
        cfg = self.cfg
        n = len(lab.workers)

        def set_loss(p):
            lab.set_loss(p)

        wanted = [s for s in ("swml-afxdp", "swml-udp") if s in cfg.systems]
        if wanted:
            with SwitchProcess(lab, self._switch_args(k)) as sw:
                for system in wanted:
                    backend = system.split("-")[1]
                    if system in self.unavailable and system == "swml-afxdp":
                        for loss in cfg.losses:
                            self._record(system, n, k, loss, None,
                                         status=f"unavailable: {self.unavailable[system]}")
                        continue
                    self._phase(lab, system, k, self._swml_args(lab, backend, f"{backend}{n}k{k}", k),
                                set_loss, self._switch_counters(sw.iface),
                                env=self.afxdp_env(k) if backend == "afxdp" else None)
                    lab.set_loss(0.0)
                assert sw.proc.poll() is None, "the switch died:\n" + "\n".join(sw.output[-20:])
        if "userspace" in cfg.systems:
            backend = "udp" if "swml-afxdp" in self.unavailable else "afxdp"
            try:
                us = _userspace_switch(lab, self._switch_args(k))
            except RuntimeError as e:
                for loss in cfg.losses:
                    self._record("userspace", n, k, loss, None, status=f"unavailable: {e}")
                return
            with us:
                pid = us.proc.pid

                def switch_cpu(snap=None):
                    now = (time.monotonic(), proc_cpu_s(pid), _status_counters(lab))
                    if snap is None:
                        return now
                    c0, c1 = snap[2], now[2]
                    return {"switch_proc_cpu_pct": round(100 * (now[1] - snap[1]) / (now[0] - snap[0]), 1),
                            "workers_backend": backend,
                            "switch_counters": {k: c1[k] - c0[k] for k in c1 if c1[k] != c0.get(k)}}
                self._phase(lab, "userspace", k,
                            self._swml_args(lab, backend, f"us{n}k{k}", k), set_loss, switch_cpu,
                            env=self.afxdp_env(k) if backend == "afxdp" else None)

    @staticmethod
    def _switch_counters(iface: str):
        """extra_of for the XDP switch: its counters' deltas over a phase."""
        def snap(before=None):
            from ..switch.maps import SwitchMaps
            maps = SwitchMaps(iface)
            try:
                now = maps.read_counters()
            finally:
                maps.close()
            if before is None:
                return now
            return {"switch_counters": {k: now[k] - before[k] for k in now if now[k] != before[k]}}
        return snap

    def _gloo(self, lab) -> None:
        from .tcp_loss import TcpLoss

        cfg = self.cfg
        master = lab.workers[0].ip

        def argv_of(rank, host):
            argv = ["--system", "gloo", "--rank", str(rank), "--world", str(len(lab.workers)),
                    "--size", str(cfg.size), "--master", master, "--master-port", str(GLOO_PORT),
                    "--iface", host.iface]
            if rank == 0:
                argv += ["--cpu"] + (["--check"] if cfg.check else [])
            return argv

        with TcpLoss(lab) as tl:
            def loss_snap(snap=None):
                c = tl.counters()
                if snap is None:
                    return c
                seen = sum(c[d]["seen"] - snap[d]["seen"] for d in c)
                dropped = sum(c[d]["dropped"] - snap[d]["dropped"] for d in c)
                return {"tcp_frames": seen, "tcp_dropped": dropped}
            self._phase(lab, "gloo", None, argv_of, tl.set, loss_snap)

    # -- output --------------------------------------------------------------------
    def _meta(self, started: float, quiet: dict) -> dict:
        cfg = self.cfg
        return {
            "command": cfg.command, "started": _dt.datetime.fromtimestamp(started).isoformat(timespec="seconds"),
            "duration_s": round(time.time() - started, 1),
            "rate_mbit": cfg.rate_mbit, "size_bytes": cfg.size, "iterations": cfg.iterations,
            "warmup": cfg.warmup, "workers": list(cfg.workers), "losses": list(cfg.losses),
            "ks": list(cfg.ks), "systems": list(cfg.systems), "job_slots": cfg.job_slots,
            "rank_env": dict(cfg.env), "afxdp_rto_floor": cfg.rto_floor,
            "wait_quiet_s": cfg.wait_quiet,
            "unavailable": self.unavailable,
            "machine": {"cores": os.cpu_count(), "kernel": platform.release(),
                        "python": platform.python_version(), "quiet_before": quiet},
            "definitions": {
                "tat": "tensor aggregation time of one iteration: the slowest rank's allreduce, "
                       "timed from a barrier; medians over iterations",
                "goodput": "tensor bits / TAT (per worker)",
                "bound_swml": "rate x 4k / (4k + 58): Ethernet 14 + IPv4 20 + UDP 8 + swml 16 "
                              "bytes of headers a packet",
                "bound_gloo": "rate x 1448/1514 x N / (2(N-1)): ring allreduce moves 2(N-1)/N of "
                              "the tensor over each link direction, TCP segments of 1448 bytes "
                              "in 1514-byte frames",
                "cpu": "/proc/stat over the timed allreduces (rank 0's windows), whole machine, "
                       "100% = all cores busy",
                "loss": "per worker link and direction: swml UDP via the lab's loss injector, "
                        "Gloo TCP via xdp/swml_tcp_loss.c",
            },
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


# ------------------------------------------------------------------ summaries

def _find(results, system, workers, k, loss):
    for r in results:
        if (r["system"] == system and r["workers"] == workers and r["loss"] == loss
                and (system == "gloo" or r["k"] == k) and r["status"] == "ok"):
            return r
    return None


def best_swml(results, workers, k, loss):
    """The swml row the comparison uses: afxdp when it ran, else udp."""
    return _find(results, "swml-afxdp", workers, k, loss) or _find(results, "swml-udp", workers, k, loss)


def summary(doc: dict) -> dict:
    """The issue's figures of merit, per k: swml/gloo TAT ratio per N, goodput as a
    fraction of the bound, TAT(max N)/TAT(min N), loss inflation."""
    res, meta = doc["results"], doc["meta"]
    ws, losses = sorted(meta["workers"]), sorted(meta["losses"])
    out = {}
    for k in meta["ks"]:
        s: dict = {"ratio_swml_gloo": {}, "swml_bound_fraction": {}, "swml_system": {},
                   "loss_inflation": {"swml": {}, "gloo": {}}}
        for n in ws:
            sw, gl = best_swml(res, n, k, 0.0), _find(res, "gloo", n, None, 0.0)
            if sw:
                s["swml_system"][n] = sw["system"]
                s["swml_bound_fraction"][n] = sw["bound_fraction"]
            if sw and gl:
                s["ratio_swml_gloo"][n] = round(sw["tat_median_s"] / gl["tat_median_s"], 3)
            for name, row0 in (("swml", sw), ("gloo", gl)):
                for p in losses[1:]:
                    row = best_swml(res, n, k, p) if name == "swml" else _find(res, "gloo", n, None, p)
                    if row and row0:
                        s["loss_inflation"][name].setdefault(n, {})[p] = round(
                            row["tat_median_s"] / row0["tat_median_s"], 3)
        lo, hi = ws[0], ws[-1]
        for name in ("swml", "gloo"):
            a = best_swml(res, lo, k, 0.0) if name == "swml" else _find(res, "gloo", lo, None, 0.0)
            b = best_swml(res, hi, k, 0.0) if name == "swml" else _find(res, "gloo", hi, None, 0.0)
            if a and b and lo != hi:
                s[f"scaling_{name}"] = {"from": lo, "to": hi,
                                        "ratio": round(b["tat_median_s"] / a["tat_median_s"], 3)}
        out[k] = s
    return out


def _ms(r: dict | None) -> str:
    return f"{r['tat_median_s'] * 1e3:.0f}" if r else "–"


def _cell(r: dict | None) -> str:
    if r is None:
        return "–"
    if r["status"] != "ok":
        return r["status"].split(":")[0]
    cpu = r["cpu"]["busy_pct"] if r.get("cpu") else None
    mark = " †" if disturbed(r) else ""
    return (f"{r['tat_median_s'] * 1e3:.0f} ms · {r['bound_fraction'] * 100:.0f}% · "
            f"CPU {cpu:.0f}%" if cpu is not None else f"{r['tat_median_s'] * 1e3:.0f} ms") + mark


def markdown(doc: dict) -> str:
    meta, res = doc["meta"], doc["results"]
    systems = [s for s in SYSTEMS if s in meta["systems"]]
    lines = [
        "# Lab benchmark: allreduce on shaped links",
        "",
        f"`{meta['command']}` ({meta['started']}, {meta['duration_s']:.0f} s): "
        f"{meta['size_bytes'] / 2**20:g} MiB float32, every worker link {meta['rate_mbit']:g} Mbit/s "
        f"each way, {meta['warmup']} warm-up + {meta['iterations']} timed iterations, medians; "
        f"{meta['machine']['cores']} cores, kernel {meta['machine']['kernel']}; "
        f"machine before the run: load {meta['machine']['quiet_before']['loadavg']}.",
        "",
        "Each cell: median tensor aggregation time · goodput as a share of the system's "
        "header-adjusted link bound · machine CPU busy during the timed allreduces "
        "(100% = both cores). † = disturbed: meanwhile other processes used more than "
        f"{FOREIGN_WARN_PCT:g}% of the machine, or another lab's namespaces were up.",
        "",
    ]
    for name, why in meta.get("unavailable", {}).items():
        lines.append(f"- {LABELS[name]}: unavailable: {why}")
    if meta.get("unavailable"):
        lines.append("")
    for k in meta["ks"]:
        lines += [f"## k = {k} ({4 * k} B payload a packet; swml bound "
                  f"{swml_bound_mbps(meta['rate_mbit'], k):.1f} Mbit/s)", "",
                  "| N | loss | " + " | ".join(LABELS[s] for s in systems) + " | swml/gloo |",
                  "|---|---|" + "---|" * len(systems) + "---|"]
        for n in meta["workers"]:
            for p in meta["losses"]:
                rows = {s: _find(res, s, n, k, p) or next(
                    (r for r in res if r["system"] == s and r["workers"] == n and r["loss"] == p
                     and (s == "gloo" or r["k"] == k)), None) for s in systems}
                sw, gl = best_swml(res, n, k, p), _find(res, "gloo", n, None, p)
                ratio = f"{sw['tat_median_s'] / gl['tat_median_s']:.2f}" if sw and gl else "–"
                lines.append(f"| {n} | {p * 100:g}% | " + " | ".join(_cell(rows[s]) for s in systems)
                             + f" | {ratio} |")
        lines.append("")
    lines += ["## Figures of merit", ""]
    for k, s in summary(doc).items():
        lines.append(f"k = {k}:")
        if s["ratio_swml_gloo"]:
            lines.append("- TAT swml/gloo: " + ", ".join(f"N={n}: {v:.2f}" for n, v in s["ratio_swml_gloo"].items()))
        if s["swml_bound_fraction"]:
            lines.append("- swml goodput / bound: " + ", ".join(
                f"N={n}: {v * 100:.1f}% ({s['swml_system'][n]})" for n, v in s["swml_bound_fraction"].items()))
        for name in ("swml", "gloo"):
            sc = s.get(f"scaling_{name}")
            if sc:
                lines.append(f"- {name} TAT({sc['to']})/TAT({sc['from']}): {sc['ratio']:.2f}")
        for name in ("swml", "gloo"):
            infl = s["loss_inflation"][name]
            if infl:
                lines.append(f"- {name} TAT at loss / loss-free: " + "; ".join(
                    f"N={n}: " + ", ".join(f"{p * 100:g}% x{v:.2f}" for p, v in d.items())
                    for n, d in infl.items()))
        lines.append("")
    lines += ["## Definitions", ""] + [f"- **{k}**: {v}" for k, v in meta["definitions"].items()]
    lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------ entry points

def run_bench(cfg: BenchConfig, out: Callable[[str], None] = print) -> dict:
    return Bench(cfg, out).run()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        rank_main(sys.argv[2:])
    else:
        sys.exit("usage: python -m switchml_xdp.bench.lab_bench rank ...  (the bench itself: swml-lab bench)")
