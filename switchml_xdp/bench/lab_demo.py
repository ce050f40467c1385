"""`swml-lab demo` and `swml-lab vm`: the allreduce benchmark (`swml-worker
bench`) run as every rank of one job in a lab, then its table and a summary.

run_demo: the namespace lab (switchml_xdp/lab/namespace_lab.py) with the real
XDP switch, each rank a separate process in its worker namespace.
run_vm_demo: the VM lab (switchml_xdp/lab/vm.py), each rank in a worker VM.
Both labs know nothing of the benchmark's results: this module formats them."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time

from ..lab import Lab, LabError
from ..lab.box_runs import box_lines, switches_on_every_box
from .allreduce_bench import COLUMNS_LEGEND, format_table


def run_demo(workers: int, size: int, iterations: int, warmup: int, dtype: str, backend: str,
             verify: bool, rate: float | None, out=print, fanout: str = "multicast",
             boxes: int = 1, box_rate: float | None = None, ports: int = 1) -> list[dict]:
    """fanout: the switch's --fanout; "unicast" also takes multicast off the lab's
    bridge (Lab(multicast=False)), to show it working where there is none.
    boxes: the job over that many boxes, each port shaped to box_rate Mbit/s;
    ports: the switch a box with that many ports, each on a segment of its own."""
    unicast = fanout == "unicast"
    with Lab(workers=workers, rate_mbit=rate, multicast=not unicast, boxes=boxes,
             box_rate_mbit=box_rate, ports=ports) as lab:
        addresses = ",".join(box.ip for box in lab.switches)
        out(f"lab {lab.prefix}: {'boxes' if boxes > 1 else 'switch'} {addresses} + {workers} "
            + (f"workers on {ports} segments, one a port of the switch" if ports > 1 else
               "workers on a bridge") + (f", links shaped to {rate:g} Mbit/s" if rate else "")
            + (f", box ports to {box_rate:g} Mbit/s" if box_rate else "")
            + (", no multicast" if unicast else ""))
        with contextlib.ExitStack() as stack:
            for sw in switches_on_every_box(stack, lab, ["--fanout", fanout], box_rate):
                out(sw.ready_line)
            return bench_every_rank(lab, lambda host: addresses, size, iterations, warmup, dtype,
                                    backend, verify, out)


def run_racks_demo(per_rack: list[int], layout: str, size: int, iterations: int, warmup: int,
                   dtype: str, backend: str, verify: bool, rate: float | None,
                   uplink_rate: float | None, loss: float | None = None,
                   out=print) -> list[dict]:
    """The same through racks (switchml_xdp/lab/racks.py): each rank joins its
    rack's box (tree) or the parent across the core (flat)."""
    from ..lab.racks import RacksLab, switches_of_the_racks

    with RacksLab(None, per_rack, layout, rate_mbit=rate, uplink_rate_mbit=uplink_rate,
                  loss=loss) as lab:
        out(f"lab {lab.prefix}: racks of {','.join(map(str, per_rack))} workers, {layout}, "
            f"parent {lab.switch.ip}"
            + (f", rack boxes {', '.join(p.ip for p in lab.rack_ports)}" if layout == "tree" else "")
            + (f", worker links {rate:g} Mbit/s" if rate else "")
            + (f", uplinks {uplink_rate:g} Mbit/s" if uplink_rate else "")
            + (f", {100 * loss:g}% loss on every worker link and uplink" if loss else ""))
        with contextlib.ExitStack() as stack:
            for sw in switches_of_the_racks(stack, lab):
                out(sw.ready_line)
            return bench_every_rank(lab, lambda host: lab.box_of(host).ip, size, iterations,
                                    warmup, dtype, backend, verify, out)


def bench_every_rank(lab, boxes_of, size: int, iterations: int, warmup: int, dtype: str,
                     backend: str, verify: bool, out=print) -> list[dict]:
    """`swml-worker bench` as every rank of one job, each in its worker's
    namespace joining boxes_of(host) (its boxes' addresses); the switches
    are up. Prints the table and the summary; returns each rank's result."""
    workers = len(lab.workers)
    procs = []
    # The job's token, through the environment (argv is visible to every user).
    env = {**os.environ, "SWML_TOKEN": secrets.token_hex(16)}
    for rank, host in enumerate(lab.workers):
        argv = [sys.executable, "-m", "switchml_xdp.cli.worker", "bench",
                "--switch", boxes_of(host), "--job", "demo", "--rank", str(rank),
                "--world", str(workers), "--size", str(size), "--iterations", str(iterations),
                "--warmup", str(warmup), "--dtype", dtype, "--backend", backend, "--json"]
        if verify:
            argv.append("--verify")
        if rank != 0:
            argv.append("--quiet")
        # rank 0 shows its progress bar on our terminal
        procs.append(lab.popen(host, argv, env=env, stdout=subprocess.PIPE,
                               stderr=None if rank == 0 else subprocess.PIPE, text=True))
    t0 = time.monotonic()
    results, errors = [], []
    for rank, p in enumerate(procs):
        stdout, stderr = p.communicate(timeout=1800)
        if p.returncode != 0:
            errors.append(f"rank {rank} failed: {(stderr or stdout).strip()}")
            continue
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    if errors:
        raise RuntimeError("\n".join(errors))
    wall = time.monotonic() - t0
    out("")
    for line in summary(results, workers, wall):
        out(line)
    return results


def summary(results: list[dict], workers: int, wall: float) -> list[str]:
    """The per-rank bench table and what its columns mean, then one line of
    figures (also `swml-lab vm`'s)."""
    med = max(r["tat_median_s"] for r in results)
    r0 = results[0]
    return [format_table(results), COLUMNS_LEGEND, "",
            f"{workers} workers, {r0['dtype']} tensor of {r0['bytes'] / 2**20:.1f} MiB, "
            f"k={r0['k']}, {r0['slots']} slots, backend {r0['backend']}: "
            f"median tensor aggregation time {med * 1e3:.1f} ms, "
            f"goodput {r0['bytes'] * 8 / med / 1e9:.3f} Gbit/s per worker, "
            f"{r0['elements'] / med:.3g} ATE/s; wall {wall:.1f} s",
            *box_lines([r.get("boxes") for r in results], "all ranks' timed calls")]



def run_vm_demo(workers: int, size: str, iterations: int, warmup: int, dtype: str, verify: bool,
                accel: str = "auto", out=print) -> list[dict]:
    """`swml-lab vm`: boot, bench, print the table and the lab's timings, remove everything."""
    from ..lab.vm import VmLab
    from ..lab.vm_boot import VmBootError

    t0 = time.monotonic()
    with VmLab(workers, accel=accel, out=out) as lab:
        try:
            results = lab.bench(size, iterations, warmup, dtype, verify)
        except VmBootError as e:
            raise LabError(str(e)) from None
        wall = time.monotonic() - t0
        boots = [v for k, v in lab.timings.items() if k.startswith("boot_")]
        out("")
        for line in summary(results, workers, lab.timings["bench_s"]):
            out(line)
        out(f"VMs ({lab.accel.upper()}): booted in {min(boots):.1f}-{max(boots):.1f} s (guest uptime "
            f"at stage two); switch up (native XDP) {lab.timings['switch_ready_s']:.1f} s after "
            f"qemu started; bench {lab.timings['bench_s']:.1f} s; {wall:.1f} s in all")
    return results
