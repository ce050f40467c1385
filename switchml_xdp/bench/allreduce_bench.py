"""The allreduce benchmark one rank runs (`swml-worker bench`): one size, or
a sweep of sizes printed as nccl-tests prints its all_reduce_perf table
(time, algbw, busbw), so that the figures compare with what users know.

Every rank builds its tensors from (seed, rank, iteration), so with --verify
each rank can recompute every other rank's input and check every element of
its result: exactly for int32 and for float32 min/max, and bit for bit against
the numpy reference of the quantized sum for float32 (docs/quantization.md).
"""
from __future__ import annotations

import re
import statistics
import textwrap
import time

import numpy as np

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
          "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30}


def parse_size(text: str) -> int:
    """'64MiB', '1M', '4096' -> bytes (a multiple of 4: one int32/float32 each)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (try 64MiB, 1M, 4096)")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n < 4:
        raise ValueError(f"size {text!r} is smaller than one element (4 bytes)")
    return n - n % 4


def make_input(dtype: str, n: int, rank: int, iteration: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng([seed, rank, iteration])
    if dtype == "int32":
        return rng.integers(-(1 << 20), 1 << 20, size=n, dtype=np.int32)
    return rng.standard_normal(n, dtype=np.float32)


def expected(dtype: str, n: int, world: int, iteration: int, k: int, op: str = "sum",
             precision: str = "32") -> np.ndarray:
    inputs = [make_input(dtype, n, r, iteration) for r in range(world)]
    if op != "sum":  # exact; the inputs have no NaN and no zeros of either sign
        return (np.min if op == "min" else np.max)(np.stack(inputs), axis=0)
    if dtype == "int32":
        return np.sum(np.stack(inputs).astype(np.int64), axis=0).astype(np.uint32).view(np.int32)
    if precision == "16":
        from ..quant16 import simulate_allreduce16
        return simulate_allreduce16(inputs, k)
    from ..quant import simulate_allreduce
    return simulate_allreduce(inputs, k)


def run(worker, size_bytes: int, iterations: int, warmup: int, dtype: str = "float32",
        verify: bool = False, progress: bool = True, op: str = "sum",
        precision: str = "32") -> dict:
    """Time `iterations` allreduces of one tensor with `op` (after `warmup`
    untimed ones)."""
    n = size_bytes // 4
    info = worker.info
    times: list[float] = []
    bad = 0
    total = warmup + iterations
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=total, desc=f"rank {info.rank} allreduce {size_bytes / 2**20:.1f} MiB",
                   unit="it", leave=False)
    before = dict(worker.stats())
    for it in range(total):
        if it == warmup:
            before = dict(worker.stats())  # packets and retransmissions of the timed part
        a = make_input(dtype, n, info.rank, it)
        t0 = time.perf_counter()
        worker.allreduce(a, op=op, precision=precision)
        dt = time.perf_counter() - t0
        if it >= warmup:
            times.append(dt)
        if verify and not np.array_equal(a, expected(dtype, n, info.world, it, info.k, op,
                                                      precision),
                                         equal_nan=True):
            bad += 1
        if bar:
            bar.update()
    if bar:
        bar.close()
    after = worker.stats()
    med = statistics.median(times)
    row = {
        "rank": info.rank, "world": info.world, "backend": after["backend"],
        "loop": after.get("loop"), "lanes": info.lanes, "dtype": dtype,
        "op": op, "precision": precision,
        "bytes": n * 4, "elements": n, "k": info.k, "slots": info.slots, "iterations": iterations,
        "tat_min_s": min(times), "tat_median_s": med, "tat_max_s": max(times),
        "tat_mean_s": statistics.fmean(times),
        "goodput_gbps": n * 4 * 8 / med / 1e9, "ate_per_s": n / med,
        "packets_per_s": (after["packets_sent"] - before["packets_sent"]) / sum(times),
        "retransmissions": after["retransmissions"] - before["retransmissions"],
        "forged": after["forged"] - before["forged"],
        "verified": (iterations + warmup - bad) if verify else None,
        "verify_failures": bad if verify else None,
    }
    if "boxes" in after:   # a job over several boxes: each box's part of the timed calls
        row["boxes"] = [{**{key: b[key] for key in ("box", "backend", "capacity_bps")},
                         **{key: b[key] - a[key] for key in ("packets_sent", "retransmissions")}}
                        for a, b in zip(before["boxes"], after["boxes"])]
    return row


#: What the columns of format_table mean: printed under the table and in `--help`.
COLUMNS = (
    ("backend", "the rank's backend; udp/Q: in Q lanes (--lanes)"),
    ("TAT", "tensor aggregation time: one allreduce, from this rank's call to its result "
            "(min/median/max over the timed iterations)"),
    ("Gbit/s", "goodput: tensor bits / median TAT (payload only, no headers)"),
    ("ATE/s", "aggregated tensor elements a second: elements / median TAT"),
    ("retx", "packets this rank sent again after a timeout (timed iterations)"),
    ("verify", "ok: every element equal to the exact reference; '-': not checked"),
)
_SPREAD = ("Each rank times its own calls: a rank that reaches a call later than the "
           "others waits less, so per-rank medians differ by how far apart the ranks run; "
           "the job's time is the largest median.")


def _legend(width: int = 78) -> str:
    def wrap(first: str, text: str) -> str:
        return textwrap.fill(text, width, initial_indent=first, subsequent_indent=" " * 10)
    return "\n".join([*(wrap(f"  {name:<7} ", text) for name, text in COLUMNS),
                      textwrap.fill(_SPREAD, width, initial_indent="  ", subsequent_indent="  ")])


COLUMNS_LEGEND = _legend()
COLUMNS_HELP = "\b\nColumns of the table:\n" + COLUMNS_LEGEND


def format_table(rows: list[dict]) -> str:
    head = (f"{'rank':>4} {'backend':>7} {'dtype':>7} {'MiB':>7} {'TAT min/median/max (ms)':>25} "
            f"{'Gbit/s':>7} {'ATE/s':>10} {'retx':>6} {'verify':>8}")
    lines = [head]
    for r in sorted(rows, key=lambda r: r["rank"]):
        tat = f"{r['tat_min_s'] * 1e3:.1f}/{r['tat_median_s'] * 1e3:.1f}/{r['tat_max_s'] * 1e3:.1f}"
        ver = "-" if r["verified"] is None else ("ok" if not r["verify_failures"] else
                                                  f"{r['verify_failures']} BAD")
        backend = r["backend"] + (f"/{r['lanes']}" if r.get("lanes", 1) > 1 else "")
        lines.append(f"{r['rank']:>4} {backend:>7} {r['dtype']:>7} {r['bytes'] / 2**20:>7.2f} "
                     f"{tat:>25} {r['goodput_gbps']:>7.3f} {r['ate_per_s']:>10.3g} "
                     f"{r['retransmissions']:>6} {ver:>8}")
    for r in sorted(rows, key=lambda r: r["rank"]):
        if r.get("forged"):
            lines.append(f"rank {r['rank']} refused {r['forged']} forged RESULT(s): not signed "
                         "with the job's result key (someone on the network sent them; "
                         "docs/security.md)")
    return "\n".join(lines)


# --- the size sweep (`swml-worker bench --sweep MIN:MAX[:FACTOR]`) -----------------

DEFAULT_SWEEP = "4KiB:256MiB"


def parse_sweep(text: str) -> list[int]:
    """'4KiB:256MiB' -> [4096, 8192, ..., 268435456]: MIN, then each size
    FACTOR (default 2, as nccl-tests' -f) times the one before, up to MAX."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"not a sweep: {text!r} (try 4KiB:256MiB, or 4KiB:64MiB:4)")
    lo, hi = parse_size(parts[0]), parse_size(parts[1])
    try:
        factor = int(parts[2]) if len(parts) == 3 else 2
    except ValueError:
        raise ValueError(f"sweep factor {parts[2]!r} is not an integer") from None
    if factor < 2:
        raise ValueError(f"sweep factor must be at least 2, not {factor}")
    if hi < lo:
        raise ValueError(f"sweep {text!r}: MAX is smaller than MIN")
    sizes = [lo]
    while sizes[-1] * factor <= hi:
        sizes.append(sizes[-1] * factor)
    return sizes


def bus_factor(world: int) -> float:
    """busbw / algbw for allreduce, as nccl-tests defines it: 2(n-1)/n, the
    share of the data each rank's link carries in each direction in a ring
    (so that busbw compares with the link's speed whatever the world size)."""
    return 2 * (world - 1) / world


def run_sweep(worker, sizes: list[int], iterations: int, warmup: int, dtype: str = "float32",
              verify: bool = False, progress: bool = True, op: str = "sum",
              precision: str = "32") -> list[dict]:
    """run() at each size; each row gains algbw and busbw (GB/s, 1e9 bytes, of
    the mean time, as nccl-tests)."""
    rows = []
    for size in sizes:
        r = run(worker, size, iterations, warmup, dtype, verify, progress, op, precision)
        algbw = r["bytes"] / r["tat_mean_s"] / 1e9
        rows.append({**r, "algbw_gbs": algbw, "busbw_gbs": algbw * bus_factor(r["world"])})
    return rows


def format_sweep(rows: list[dict]) -> str:
    """nccl-tests' table (in-place only: allreduce works in place here), plus
    the retransmissions of each size."""
    r0 = rows[0]
    lines = [f"# swml allreduce sweep: rank {r0['rank']} of {r0['world']}, "
             f"backend {r0['backend']}, k={r0['k']}, {r0['iterations']} iterations a size",
             f"#{'size':>11} {'count':>12} {'type':>7} {'redop':>6} {'time':>10} {'algbw':>7} "
             f"{'busbw':>7} {'#wrong':>6} {'retx':>7}",
             f"#{'(B)':>11} {'(elements)':>12} {'':>7} {'':>6} {'(us)':>10} {'(GB/s)':>7} "
             f"{'(GB/s)':>7} {'':>6} {'':>7}"]
    for r in rows:
        wrong = "N/A" if r["verified"] is None else str(r["verify_failures"])
        lines.append(f" {r['bytes']:>11} {r['elements']:>12} {r['dtype']:>7} {r['op']:>6} "
                     f"{r['tat_mean_s'] * 1e6:>10.1f} {r['algbw_gbs']:>7.3f} "
                     f"{r['busbw_gbs']:>7.3f} {wrong:>6} {r['retransmissions']:>7}")
    avg = statistics.fmean(r["busbw_gbs"] for r in rows)
    lines += [f"# Avg bus bandwidth    : {avg:.4f} GB/s",
              "# time: mean over the iterations; algbw = size / time; "
              f"busbw = algbw * 2(n-1)/n = algbw * {bus_factor(r0['world']):.3f} (allreduce, n = "
              f"{r0['world']}), as nccl-tests; GB/s = 1e9 bytes/s; retx: packets sent again"]
    return "\n".join(lines)
