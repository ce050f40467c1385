"""What unicast fan-out costs against multicast (`swml-switch up --fanout`),
in the lab, at several worker counts: tensor aggregation time (TAT) and the
switch's kernel programs' time (kernel BPF stats).

    python -m switchml_xdp.bench.fanout_cost [--workers 2,4,8] [--size 4MiB] [--iterations 5] [--json]

For each worker count one lab, then one switch per fan-out on it in turn;
the workers are threads of this process, each in its namespace, reducing a
float32 tensor (exactness checked once). Reported per run: the job's median
TAT (the largest of the ranks' medians), the XDP program's ns per DATA
packet, and with unicast the tc fan-out program's ns per RESULT (its
bpf_clone_redirect calls, one a member, included). What neither counts: the
skb that XDP_PASS makes for the fan-out; TAT has everything.
"""
from __future__ import annotations

import statistics
import time

import click
import numpy as np

from .. import bpf
from ..lab import Lab
from ..lab.cluster import SwitchProcess, run_ranks
from ..switch.dataplane import FANOUTS
from ..switch.state_files import read_state
from .allreduce_bench import parse_size
from .bpf_stats import ProgCost
from .output import echo_rows


def measure(lab: Lab, fanout: str, elements: int, iterations: int, warmup: int,
            backend: str) -> dict:
    from .. import Worker, quant

    n = len(lab.workers)
    data = [np.random.default_rng([7, r]).standard_normal(elements).astype(np.float32)
            for r in range(n)]
    expected = quant.simulate_allreduce(data, 256)
    with SwitchProcess(lab, ["--fanout", fanout]) as sw:
        st = read_state(sw.iface)

        def rank_body(rank, host):
            times = []
            with Worker(lab.switch.ip, f"fan{fanout}", rank, n, backend=backend,
                        verbose=False) as w:
                for i in range(warmup + iterations):
                    x = data[rank].copy()
                    t0 = time.perf_counter()
                    w.allreduce(x)
                    if i >= warmup:
                        times.append(time.perf_counter() - t0)
                    if i == 0:
                        assert np.array_equal(x.view(np.uint32), expected.view(np.uint32))
                stats = w.stats()
            return statistics.median(times), stats

        with bpf.stats_enabled():
            xdp = ProgCost(st["prog_id"])
            tc = ProgCost(st["fanout_prog_id"]) if st.get("fanout_prog_id") else None
            per_rank = run_ranks(lab, lab.workers, rank_body, timeout=600)
            x, t = xdp.since(), tc.since() if tc else None
    return {"fanout": fanout, "workers": n, "backend": per_rank[0][1]["backend"],
            "elements": elements, "tat_median_s": max(m for m, _ in per_rank),
            "retransmissions": sum(s["retransmissions"] for _, s in per_rank),
            "shadow_replies": sum(s["shadow_replies"] for _, s in per_rank),
            "xdp_ns_per_packet": x["ns_per_packet"], "xdp_packets": x["packets"],
            "tc_ns_per_result": t["ns_per_packet"] if t else None,
            "tc_runs": t["packets"] if t else 0}


@click.command()
@click.option("--workers", default="2,4,8", show_default=True,
              help="worker counts, comma-separated")
@click.option("--size", default="4MiB", show_default=True, help="float32 tensor size")
@click.option("--iterations", default=5, show_default=True, type=click.IntRange(1, None))
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(0, None))
@click.option("--backend", default="afxdp", show_default=True,
              type=click.Choice(["auto", "afxdp", "udp"]))
@click.option("--runs", default=1, show_default=True, type=click.IntRange(1, 20),
              help="alternate the two fan-outs this many times on each lab")
@click.option("--json", "as_json", is_flag=True, help="print the results as JSON")
def main(workers, size, iterations, warmup, backend, runs, as_json):
    try:
        counts = [int(w) for w in workers.split(",")]
        elements = parse_size(size) // 4
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    rows = []
    for n in counts:
        with Lab(workers=n) as lab:
            for run in range(runs):
                for fanout in FANOUTS:
                    click.echo(f"measuring {n} workers, fanout {fanout} (run {run + 1}) ...",
                               err=True)
                    rows.append(measure(lab, fanout, elements, iterations, warmup, backend))
    def line(r: dict) -> str:
        tc = "-" if r["tc_ns_per_result"] is None else f"{r['tc_ns_per_result']:.0f}"
        return (f"{r['workers']:>7} {r['fanout']:>9} {r['backend']:>7} "
                f"{r['tat_median_s'] * 1e3:>8.1f} {r['retransmissions']:>6} "
                f"{r['xdp_ns_per_packet']:>10.0f} {tc:>12}")

    echo_rows(rows, as_json,
              f"{'workers':>7} {'fanout':>9} {'backend':>7} {'TAT ms':>8} {'retx':>6} "
              f"{'XDP ns/pkt':>10} {'tc ns/RESULT':>12}", line,
              f"{elements * 4 / 2**20:g} MiB float32, {iterations} iterations after {warmup} "
              f"warm-up; TAT: the job's median tensor aggregation time; XDP ns/pkt and tc "
              f"ns/RESULT: kernel BPF stats of the switch program and of the fan-out.")

if __name__ == "__main__":
    main()
