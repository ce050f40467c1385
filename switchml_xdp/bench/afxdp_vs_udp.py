"""afxdp vs udp backend in the lab: goodput, ATE/s and packet rate.

    sudo .venv/bin/python -m switchml_xdp.bench.afxdp_vs_udp [--workers 1,2,4]
         [--size 64MiB] [--iterations 5] [--profile] [--json]

A lab per world size (a switch + that many workers, links unshaped) and its
switch serve both backends. A run is `world` ranks of one job, each a
`swml-worker bench` process in its own worker namespace (a process per rank, as
on real hosts: no shared GIL), all with the same backend; the table shows the median tensor aggregation
time (TAT) over the ranks' medians, goodput = tensor bytes / TAT, ATE/s =
tensor elements / TAT (per worker: every worker gets the whole tensor reduced),
and the packets per second each worker sent.

--profile turns on kernel.bpf_stats_enabled for the runs and adds the switch
program's and the workers' redirect programs' cost per packet (ns) and the
CPU time the whole machine spent (user/system/softirq/idle from /proc/stat),
which is what limits the lab: every hop is a veth on the same 2 cores, and in
copy mode a worker's sendto() runs the whole path of its packets (veth,
bridge, switch program, XDP_TX, bridge flood, redirect into the UMEM) in its
own softirq. The udp backend sends one packet per Python call.
Retransmissions of afxdp runs with several workers are mostly the first window
of each tensor resent while a peer is still generating its input (the
timer backs off from ~2 ms); they are dropped by the switch as duplicates.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click

from .. import bpf
from ..switch import state_files
from .allreduce_bench import parse_size
from .cpu import cpu_delta, cpu_shares, machine_cpu_times


def _bin(name: str) -> str:
    """The console script next to this interpreter (the venv's), else on PATH."""
    cand = Path(sys.executable).parent / name
    return str(cand) if cand.exists() else name


def _prog_stats(ids: set[int]) -> dict[int, tuple[int, int]]:
    """(run_cnt, run_time_ns) of those of the given programs that still exist."""
    out = {}
    for prog_id in ids:
        try:
            st = bpf.prog_stats(prog_id)
        except bpf.BpfError:
            continue  # its worker exited: the program is gone
        out[prog_id] = (st["run_cnt"], st["run_time_ns"])
    return out


def _attached_prog(ns: str, iface: str) -> int | None:
    try:
        return bpf.attachment(iface, netns=ns).prog_id or None
    except bpf.BpfError:
        return None


class ProgSampler:
    """Run-time stats of the switch program and of the workers' redirect programs.

    The redirect programs live only as long as their worker process, so a
    thread samples them (whatever is attached to the lab's worker interfaces)
    every `period` s and keeps the last reading of each; a program's cost is
    its last reading (it was loaded during the run, from zero)."""

    def __init__(self, lab, switch_prog: int | None, period: float = 0.2):
        import threading

        self.lab, self.period = lab, period
        self.switch_prog = switch_prog
        self.switch_start = _prog_stats({switch_prog}).get(switch_prog, (0, 0)) if switch_prog else (0, 0)
        self.redirect: dict[int, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            ids = {i for w in self.lab.workers if (i := _attached_prog(w.ns, w.iface))}
            self.redirect.update(_prog_stats(ids))

    def finish(self) -> dict:
        self._stop.set()
        self._thread.join()
        end = _prog_stats({self.switch_prog}).get(self.switch_prog, (0, 0)) if self.switch_prog else (0, 0)
        s_runs, s_ns = end[0] - self.switch_start[0], end[1] - self.switch_start[1]
        r_runs = sum(v[0] for v in self.redirect.values())
        r_ns = sum(v[1] for v in self.redirect.values())
        return {"switch_packets": s_runs,
                "switch_ns_per_pkt": s_ns / s_runs if s_runs else float("nan"),
                "redirect_packets": r_runs,
                "redirect_ns_per_pkt": r_ns / r_runs if r_runs else float("nan")}


def run_job(lab, world: int, backend: str, size: int, iterations: int, warmup: int,
            job: str, timeout: float) -> list[dict]:
    """One job of `world` ranks, each a `swml-worker bench` process; their JSON rows."""
    argv = [_bin("swml-worker"), "bench", "--switch", lab.switch.ip, "--job", job,
            "--world", str(world), "--size", str(size), "-n", str(iterations),
            "--warmup", str(warmup), "--backend", backend, "--json", "-q"]
    procs = [lab.popen(lab.workers[r], [*argv, "--rank", str(r)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True) for r in range(world)]
    rows, errors = [], []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            errors.append(f"rank timed out after {timeout:.0f} s")
        if p.returncode:
            errors.append(err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}")
            continue
        rows.append(json.loads(out.strip().splitlines()[-1]))
    if errors:
        raise RuntimeError(f"{backend} world={world}: {'; '.join(errors)}")
    return rows


def summarize(rows: list[dict]) -> dict:
    tat = statistics.median(r["tat_median_s"] for r in rows)
    size = rows[0]["bytes"]
    return {
        "world": rows[0]["world"], "backend": rows[0]["backend"], "bytes": size,
        "tat_s": tat, "tat_min_s": min(r["tat_min_s"] for r in rows),
        "tat_max_s": max(r["tat_max_s"] for r in rows),
        "goodput_gbps": size * 8 / tat / 1e9, "ate_per_s": rows[0]["elements"] / tat,
        "pps_per_worker": statistics.median(r["packets_per_s"] for r in rows),
        "retransmissions": sum(r["retransmissions"] for r in rows),
        "k": rows[0]["k"], "slots": rows[0]["slots"],
    }


def format_table(results: list[dict]) -> str:
    head = (f"{'workers':>7} {'backend':>7} {'MiB':>5} {'TAT median (min-max) ms':>25} "
            f"{'Gbit/s':>7} {'ATE/s/worker':>12} {'kpps/worker':>11} {'retx':>6}")
    lines = [head]
    for r in results:
        tat = f"{r['tat_s'] * 1e3:.0f} ({r['tat_min_s'] * 1e3:.0f}-{r['tat_max_s'] * 1e3:.0f})"
        lines.append(f"{r['world']:>7} {r['backend']:>7} {r['bytes'] / 2**20:>5.0f} {tat:>25} "
                     f"{r['goodput_gbps']:>7.3f} {r['ate_per_s']:>12.3g} "
                     f"{r['pps_per_worker'] / 1e3:>11.1f} {r['retransmissions']:>6}")
        if "profile" in r:
            p = r["profile"]
            cpu = p["cpu"]
            lines.append(f"{'':>7} {'':>7}   switch prog {p['switch_ns_per_pkt']:.0f} ns/pkt, "
                         f"worker redirect prog {p['redirect_ns_per_pkt']:.0f} ns/pkt; machine CPU: "
                         f"user {cpu['user']}% sys {cpu['system']}% softirq {cpu['softirq']}% "
                         f"idle {cpu['idle']}%")
    by = {(r["world"], r["backend"]): r for r in results}
    ratios = [f"{w} worker(s): {by[(w, 'afxdp')]['goodput_gbps'] / by[(w, 'udp')]['goodput_gbps']:.1f}x"
              for w in sorted({r["world"] for r in results})
              if (w, "afxdp") in by and (w, "udp") in by]
    if ratios:
        lines.append("afxdp/udp goodput: " + ", ".join(ratios))
    return "\n".join(lines)


def _size(ctx, param, value: str) -> int:
    try:
        return parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _worlds(ctx, param, value: str) -> list[int]:
    try:
        worlds = [int(w) for w in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"comma-separated world sizes, not {value!r}") from None
    if not all(1 <= w <= 64 for w in worlds):
        raise click.BadParameter("world sizes are 1..64")
    return worlds


@click.command(context_settings={"help_option_names": ["-h", "--help"]},
               help=__doc__.split("\n\n")[0])
@click.option("--workers", default="1,2,4", show_default=True, callback=_worlds,
              help="comma-separated world sizes, a lab for each")
@click.option("--backends", default="afxdp,udp", show_default=True,
              help="comma-separated worker backends to compare")
@click.option("--size", default="64MiB", show_default=True, callback=_size,
              help="tensor size (float32), e.g. 16MiB")
@click.option("--iterations", "-n", default=5, show_default=True, type=click.IntRange(1),
              help="timed iterations of the afxdp backend")
@click.option("--udp-iterations", default=3, show_default=True, type=click.IntRange(1),
              help="timed iterations of the (much slower) udp backend")
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(0),
              help="untimed iterations first")
@click.option("--elements", "-k", default=256, show_default=True, type=click.IntRange(1),
              help="k of the switch")
@click.option("--profile", is_flag=True,
              help="BPF run-time stats of the switch and redirect programs, CPU split")
@click.option("--timeout", default=600.0, show_default=True, type=click.FloatRange(1),
              help="seconds a run may take")
@click.option("--json", "as_json", is_flag=True, help="print the results as JSON")
def main(workers, backends, size, iterations, udp_iterations, warmup, elements, profile,
         timeout, as_json) -> None:
    if os.geteuid() != 0:
        raise click.ClickException("needs root (network namespaces, XDP, AF_XDP)")
    from ..lab import Lab
    from ..lab.cluster import SwitchProcess

    results = []
    for world in workers:
        # A lab per world size: the bridge floods the results' multicast group to
        # every port (no IGMP snooping), so idle workers would cost every packet.
        with Lab(workers=world) as lab, \
                SwitchProcess(lab, ["--elements", str(elements)]) as sw:
            print(sw.ready_line, file=sys.stderr)
            switch_prog = (state_files.read_state(sw.iface) or {}).get("prog_id")
            with bpf.stats_enabled() if profile else contextlib.nullcontext():
                for backend in backends.split(","):
                    iters = iterations if backend == "afxdp" else udp_iterations
                    job = f"b{backend[0]}{world}"
                    print(f"afxdp_vs_udp: {backend} x{world}, {size / 2**20:.0f} MiB, "
                          f"{warmup}+{iters} iterations ...", file=sys.stderr, flush=True)
                    sampler = ProgSampler(lab, switch_prog) if profile else None
                    cpu_before = machine_cpu_times()
                    rows = run_job(lab, world, backend, size, iters, warmup, job, timeout)
                    res = summarize(rows)
                    if sampler:
                        res["profile"] = {"cpu": cpu_shares(cpu_delta(cpu_before, machine_cpu_times())),
                                          **sampler.finish()}
                    results.append(res)
    click.echo(json.dumps(results, indent=1) if as_json else format_table(results))


if __name__ == "__main__":
    main()
