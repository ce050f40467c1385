"""What the switch costs: ns per packet of the XDP program under load (kernel
BPF stats) at k=64 and k=256, and how long `swml-switch up` takes to serve.

    python -m switchml_xdp.bench.switch_cost [--workers 2] [--seconds 3] [--runs 1]
                                             [--dtype float32,int32] [--json]

Load comes from real workers in the lab reducing tensors through the switch
(the best backend available: afxdp where built, else udp): float32 sums, as
training sends them (SWML_FMT_OFFSET32: the switch adds two elements at a
time), and/or int32 sums (SWML_FMT_INT32: one at a time). The flood sends
crafted packets of the same format. The program alone, path by path, without
the noise of a shared machine: switchml_xdp/bench/switch_micro.py
(docs/performance.md).
"""
from __future__ import annotations

import socket
import struct
import threading
import time

import click
import numpy as np

from .. import bpf, quant, wire
from ..lab import Lab
from ..lab.cluster import SwitchProcess, run_ranks
from ..switch.state_files import read_state
from .bpf_stats import ProgCost
from .output import echo_rows

#: The payload format each dtype's sums travel in (calls.Call.fmt).
FMT_OF = {"float32": wire.FMT_OFFSET32, "int32": wire.FMT_INT32}


def measure(k: int, workers: int, seconds: float, backend: str, dtype: str = "float32") -> dict:
    from .. import Worker

    with Lab(workers=workers) as lab, SwitchProcess(lab, ["--elements", str(k)]) as sw:
        prog_id = read_state(sw.iface)["prog_id"]
        stop = threading.Event()
        n = 512 * k  # 512 packets a tensor

        def rank_body(rank, host):
            a = np.ones(n, dtype=dtype)
            calls = 0
            with Worker(lab.switch.ip, f"cost{k}", rank, workers, backend=backend,
                        verbose=False) as w:
                w.allreduce(a)  # warm-up
                while not stop.is_set():
                    a[:] = 1
                    w.allreduce(a)
                    calls += 1
                    # Every rank must make the same calls: agree on when to stop.
                    flag = np.array([1 if stop.is_set() else 0], dtype=np.int32)
                    w.allreduce(flag)
                    if flag[0]:
                        break
                assert a[0] == workers, "the load itself must be exact"
                return calls, w.backend_name

        with bpf.stats_enabled():
            cost = ProgCost(prog_id)
            t0 = time.monotonic()
            timer = threading.Timer(seconds, stop.set)
            timer.start()
            results = run_ranks(lab, lab.workers, rank_body, timeout=seconds + 120)
            elapsed = time.monotonic() - t0
            c = cost.since()
        return {"k": k, "workers": workers, "backend": results[0][1], "startup_s": sw.startup_s,
                "packets": c["packets"], "pps": c["packets"] / elapsed,
                "ns_per_packet": c["ns_per_packet"], "dtype": dtype}


def measure_flood(k: int, seconds: float, dtype: str = "float32") -> dict:
    """The data plane alone: two hand-driven ranks send pre-built DATA packets
    (rank 0 then rank 1 for each packet index, so every pair completes a slot)
    as fast as one Python thread can, with no worker logic in the way."""
    from ..client.control import ControlClient

    with Lab(workers=2) as lab, SwitchProcess(lab, ["--elements", str(k)]) as sw:
        prog_id = read_state(sw.iface)["prog_id"]
        port = wire.DEFAULT_PORT

        def join(rank, host):
            c = ControlClient(lab.switch.ip)
            info = c.join("flood", 2, rank, host.ip, port, host.mac, timeout=30)
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("0.0.0.0", port))  # RESULTs land here (and are never read)
            return c, info, s

        joined = run_ranks(lab, lab.workers, join)
        info = joined[0][1]
        S = info.slots
        vals = np.ones(k, dtype=np.int32)
        if dtype == "float32":
            vals = quant.to_offset(vals, 2)
        rounds = [[bytearray(wire.datagram(wire.TYPE_DATA, info.job_id, r, i % S, i, vals,
                                           flags=(i // S) & 1, key=info.key, fmt=FMT_OF[dtype]))
                   for r in (0, 1)]
                  for i in range(2 * S)]
        # Each pass is two newer rounds of every slot: seq moves on (a packet
        # with its round's seq again would be a retransmission, not a sum).
        seq_at, seq_fmt = wire.HDR_DTYPE.fields["seq"][1], struct.Struct("!I")
        dest = (lab.switch.ip, wire.DEFAULT_PORT)
        socks = [j[2] for j in joined]
        sent = 0
        with bpf.stats_enabled():
            cost = ProgCost(prog_id)
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                for i, pair in enumerate(rounds):
                    seq = (sent // 2 + i) & 0xFFFFFFFF
                    seq_fmt.pack_into(pair[0], seq_at, seq)
                    seq_fmt.pack_into(pair[1], seq_at, seq)
                    socks[0].sendto(pair[0], dest)
                    socks[1].sendto(pair[1], dest)
                sent += 2 * len(rounds)
            elapsed = time.monotonic() - t0
            c = cost.since()
        for client, _, s in joined:
            client.leave()
            client.close()
            s.close()
        return {"k": k, "workers": 2, "backend": "flood", "startup_s": sw.startup_s,
                "packets": c["packets"], "pps": c["packets"] / elapsed,
                "ns_per_packet": c["ns_per_packet"], "dtype": dtype}


def median_run(runs: list[dict]) -> dict:
    """The run with the median ns/packet (the lower of the two middle ones),
    with every run's ns/packet under ns_per_packet_runs."""
    ordered = sorted(runs, key=lambda r: r["ns_per_packet"])
    return {**ordered[(len(ordered) - 1) // 2],
            "ns_per_packet_runs": [r["ns_per_packet"] for r in runs]}


@click.command()
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 8),
              help="workers streaming through the switch in each measurement")
@click.option("--seconds", default=3.0, show_default=True, type=click.FloatRange(0.5, 600),
              help="how long each measurement streams")
@click.option("--backend", default="auto", show_default=True, type=click.Choice(["auto", "afxdp", "udp"]),
              help="the workers' datapath (make bench: afxdp)")
@click.option("--runs", default=1, show_default=True, type=click.IntRange(1, 20),
              help="measure everything this many times, alternating; each row is then the median "
                   "run, with every run's ns/packet beside it (on a shared machine one run moves "
                   "by 25%)")
@click.option("--dtype", "dtypes", default="float32", show_default=True,
              help="what the load sums, comma-separated: float32 (as training: offset binary, "
                   "two elements an add) and/or int32 (one element an add)")
@click.option("--json", "as_json", is_flag=True, help="print the results as JSON")
def main(workers, seconds, backend, runs, dtypes, as_json):
    dtypes = [d.strip() for d in dtypes.split(",")]
    for d in dtypes:
        if d not in FMT_OF:
            raise click.BadParameter(f"{d!r}: one of {', '.join(FMT_OF)}", param_hint="--dtype")
    runs_of: dict[tuple, list[dict]] = {}
    for run in range(runs):
        for k in (64, 256):
            for dtype in dtypes:
                tag = f" (run {run + 1} of {runs})" if runs > 1 else ""
                click.echo(f"measuring k={k}, {dtype}: a flood of crafted packets for "
                           f"{seconds:g} s{tag} ...", err=True)
                r = measure_flood(k, seconds, dtype)
                runs_of.setdefault((k, dtype, "flood"), []).append(r)
                click.echo(f"measuring k={k}, {dtype}: {workers} {backend} workers for "
                           f"{seconds:g} s{tag} ...", err=True)
                r = measure(k, workers, seconds, backend, dtype)
                runs_of.setdefault((k, dtype, "workers"), []).append(r)
    rows = [median_run(rs) for rs in runs_of.values()]
    def line(r: dict) -> str:
        every = "" if runs == 1 else "  runs: " + ", ".join(f"{x:.0f}"
                                                           for x in r["ns_per_packet_runs"])
        return (f"{r['k']:>4} {r['dtype']:>8} {r['backend']:>8} {r['workers']:>7} "
                f"{r['packets']:>9} {r['pps']:>9.0f} {r['ns_per_packet']:>10.0f} "
                f"{r['startup_s']:>11.2f}s{every}")

    echo_rows(rows, as_json,
              f"{'k':>4} {'dtype':>8} {'backend':>8} {'workers':>7} {'packets':>9} {'pkt/s':>9} "
              f"{'ns/packet':>10} {'up->serving':>12}", line,
              "ns/packet: kernel BPF stats (run_time_ns / run_cnt) of the switch program; "
              "up->serving: from starting `swml-switch up` to its 'up on' line.")

if __name__ == "__main__":
    main()
