"""What each rank of tests/lab/test_torch.py checks of the `swml` backend: all_reduce
against the exact sum and Gloo's (within quant.error_bound), dtypes and ops,
broadcast and barrier, fallbacks; run inside the ranks' processes."""
from __future__ import annotations

import time

import numpy as np
import torch


def bound_sum(xs: list[np.ndarray], result: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(bound of |result - exact|, exact sum) for the switch's result of sum(xs)."""
    from switchml_xdp import quant

    exp_global, _ = quant.global_exponents(xs, k)
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    return quant.error_bound(result, exp_global, len(xs), k), exact


def gloo_slack(xs: list[np.ndarray]) -> np.ndarray:
    """Gloo adds float32 in some order: each addition rounds by at most 2**-24
    of a partial sum, which is at most sum |x|."""
    return len(xs) * 2.0 ** -24 * np.sum([np.abs(x.astype(np.float64)) for x in xs], axis=0)


def gather(t):
    import torch.distributed as dist

    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return [o.numpy() for o in out]


def ratio(err: np.ndarray, bound: np.ndarray) -> float:
    return float(np.max(err / bound)) if err.size else 0.0


def check_backend(swml, rank: int, k: int) -> dict:
    import warnings

    import torch.distributed as dist

    out: dict = {"float_cases": []}
    gen = torch.Generator().manual_seed(100 + rank)
    for n in (1, 255, 257, 3000):
        # magnitudes spread over several binades, so blocks mix large and small values
        x = torch.randn(n, generator=gen) * torch.exp2(torch.randint(-12, 4, (n,), generator=gen).float())
        ys, yg = x.clone(), x.clone()
        dist.all_reduce(ys, group=swml)
        dist.all_reduce(yg)
        xs = gather(x)
        bound, exact = bound_sum(xs, ys.numpy(), k)
        slack = gloo_slack(xs)
        copies = gather(ys)
        out["float_cases"].append({
            "n": n,
            "vs_exact": ratio(np.abs(ys.numpy() - exact), bound),
            "vs_gloo": ratio(np.abs(ys.numpy().astype(np.float64) - yg.numpy()), bound + slack),
            "same_on_all_ranks": all(np.array_equal(c, copies[0]) for c in copies)})

    xi = torch.randint(-2**20, 2**20, (1000,), generator=gen, dtype=torch.int32)
    ys, yg = xi.clone(), xi.clone()
    dist.all_reduce(ys, group=swml)
    dist.all_reduce(yg)
    out["int32_equal"] = bool(torch.equal(ys, yg))

    x = torch.randn(600, generator=gen)
    ya, ys = x.clone(), x.clone()
    dist.all_reduce(ya, op=dist.ReduceOp.AVG, group=swml)
    dist.all_reduce(ys, group=swml)
    out["avg_is_sum_over_world"] = bool(torch.equal(ya, ys / WORLD))

    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) * (rank + 1)
    nc = base.t()                                   # not contiguous
    dist.all_reduce(nc, group=swml)
    out["noncontiguous_ok"] = bool(torch.equal(nc, torch.arange(24.).reshape(4, 6).t() * 10))
    work = dist.all_reduce(torch.full((50,), 1.0), group=swml, async_op=True)
    out["async_ok"] = bool(torch.equal(work.get_future().wait()[0], torch.full((50,), 4.0)))

    before = swml.fallbacks
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fb = {}
        for name, t, op in [("int64", torch.arange(10) * (rank + 1), dist.ReduceOp.SUM),
                            ("int64 again", torch.arange(10) * (rank + 1), dist.ReduceOp.SUM),
                            ("product", torch.randn(10, generator=gen), dist.ReduceOp.PRODUCT)]:
            a, b = t.clone(), t.clone()
            dist.all_reduce(a, op=op, group=swml)
            dist.all_reduce(b, op=op)
            fb[name] = bool(torch.equal(a, b))
    out["fallback_equal"] = fb
    out["fallback_count"] = swml.fallbacks - before
    ours = [str(w.message) for w in caught if "falls back to gloo" in str(w.message)]
    out["fallback_warnings"] = ours
    out["warning_points_at_caller"] = all(w.filename == __file__ for w in caught
                                          if "falls back to gloo" in str(w.message))
    return out


SIGNIFICAND_BITS = {torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}


def cast_bound(y: torch.Tensor) -> np.ndarray:
    """|y - z| for y = z rounded to y's dtype (from a float32 z): half an ulp,
    at most 2^-p |y| (p significand bits) or half the smallest subnormal."""
    p, sub = SIGNIFICAND_BITS[y.dtype], MIN_SUBNORMAL_LOG2[y.dtype]
    mag = np.abs(y.float().numpy().astype(np.float64))
    return np.maximum(np.ldexp(mag, -p), np.ldexp(1.0, sub - 1))


def check_reduce_scatter(swml, xi: torch.Tensor, xf: torch.Tensor) -> dict:
    """reduce_scatter_tensor through the switch (one rank a host: the
    Worker's reduce_scatter, each DATA packet naming its shard's owner) equal
    to Gloo's where exact: int32 SUM and float32 MAX."""
    import torch.distributed as dist

    sharded = []
    worker_scatter = swml.worker.reduce_scatter
    swml.worker.reduce_scatter = lambda *a, **kw: sharded.append(1) or worker_scatter(*a, **kw)
    swml.reduce_scatter_min_bytes = 0
    out = {}
    try:
        for name, x, op in (("int32 SUM", xi, dist.ReduceOp.SUM), ("float32 MAX", xf, dist.ReduceOp.MAX)):
            x = x[:x.numel() // WORLD * WORLD]
            ys, yg = (torch.empty(x.numel() // WORLD, dtype=x.dtype) for _ in range(2))
            dist.reduce_scatter_tensor(ys, x.clone(), op=op, group=swml)
            dist.reduce_scatter_tensor(yg, x.clone(), op=op)
            out[name] = bool(torch.equal(ys, yg))
    finally:
        swml.reduce_scatter_min_bytes = None
        swml.worker.reduce_scatter = worker_scatter
    out["worker_reduce_scatters"] = len(sharded)
    return out


def check_ops(swml, rank: int, k: int) -> dict:
    """float16/bfloat16, AVG/MIN/MAX, broadcast and barrier through the switch."""
    import torch.distributed as dist

    R = dist.ReduceOp
    out: dict = {"float": [], "int32": {}}
    before = (swml.fallbacks, swml.switch_calls)
    gen = torch.Generator().manual_seed(200 + rank)
    n = 700
    base = torch.randn(n, generator=gen) * torch.exp2(torch.randint(-6, 3, (n,), generator=gen).float())
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        x = base.to(dt)
        xs = gather(x.float())
        for op in ("SUM", "AVG", "MIN", "MAX"):
            ys, yg = x.clone(), x.clone()
            dist.all_reduce(ys, op=getattr(R, op), group=swml)
            dist.all_reduce(yg, op=getattr(R, op))
            case = {"dtype": str(dt), "op": op, "dtype_kept": ys.dtype == dt,
                    "same_on_all_ranks": all(np.array_equal(c, gather(ys.float())[0])
                                             for c in gather(ys.float()))}
            if op in ("MIN", "MAX"):
                want = torch.stack([torch.from_numpy(c) for c in xs]).to(dt)
                want = want.min(0).values if op == "MIN" else want.max(0).values
                case["exact"] = bool(torch.equal(ys, want)) and bool(torch.equal(ys, yg))
            else:
                scale = WORLD if op == "AVG" else 1     # AVG = SUM / WORLD (a power of 2: exact)
                y32 = ys.float().numpy() * scale
                bound, exact = bound_sum(xs, y32, k)
                bound = bound / scale + cast_bound(ys) * (1 + 2.0 ** -6)
                got = ys.float().numpy().astype(np.float64)
                # Gloo adds in the dtype: each addition rounds by 2^-p of a partial sum
                slack = (WORLD * 2.0 ** -SIGNIFICAND_BITS[dt]
                         * np.sum([np.abs(c.astype(np.float64)) for c in xs], axis=0)) / scale
                case["vs_exact"] = ratio(np.abs(got - exact / scale), bound)
                case["vs_gloo"] = ratio(np.abs(got - yg.float().numpy()), bound + slack)
            out["float"].append(case)

    xi = torch.randint(-2**20, 2**20, (333,), generator=gen, dtype=torch.int32)
    for op in ("SUM", "MIN", "MAX"):
        ys, yg = xi.clone(), xi.clone()
        dist.all_reduce(ys, op=getattr(R, op), group=swml)
        dist.all_reduce(yg, op=getattr(R, op))
        out["int32"][op] = bool(torch.equal(ys, yg))
    out["reduce_scatter"] = check_reduce_scatter(swml, xi, base)
    try:
        dist.all_reduce(xi.clone(), op=R.AVG, group=swml)
        out["int32_avg_error"] = None
    except ValueError as e:
        out["int32_avg_error"] = str(e)
    one = torch.ones(3, dtype=torch.int32)     # the job goes on after the refusal
    dist.all_reduce(one, group=swml)
    out["after_error_ok"] = bool(torch.equal(one, torch.full((3,), WORLD, dtype=torch.int32)))

    # coalesced bfloat16 MAX: exact, like Gloo's
    a = [torch.randn(5, generator=gen).bfloat16(), torch.randn(3, 4, generator=gen).bfloat16()]
    b = [t.clone() for t in a]
    dist.all_reduce_coalesced(a, op=R.MAX, group=swml)
    dist.all_reduce_coalesced(b, op=R.MAX)
    out["coalesced_max_equal"] = all(torch.equal(p, q) for p, q in zip(a, b))

    # broadcast: the root's bits (NaN payloads, odd byte counts, a transposed target)
    root = 1
    bits = torch.Generator().manual_seed(7)     # the same on every rank: the expected bits
    cases = {"float32": torch.randint(-2**31, 2**31 - 1, (7,), generator=bits,
                                      dtype=torch.int32).view(torch.float32),
             "bfloat16": torch.randint(-2**15, 2**15 - 1, (5,), generator=bits,
                                       dtype=torch.int16).view(torch.bfloat16),
             "int64": torch.randint(-2**62, 2**62, (3,), generator=bits, dtype=torch.int64),
             "uint8": torch.randint(0, 256, (5,), generator=bits, dtype=torch.uint8),
             "scalar": torch.tensor(3.25, dtype=torch.float64),
             "transposed": torch.randn(3, 5, generator=bits).t()}
    out["broadcast"] = {}
    for name, want in cases.items():
        t = want.clone() if rank == root else torch.full_like(want, 0).view(want.dtype)
        if name == "transposed" and rank != root:
            t = torch.zeros(3, 5).t()
        dist.broadcast(t, src=root, group=swml)
        out["broadcast"][name] = bool(torch.equal(t.contiguous().reshape(-1).view(torch.uint8),
                                                  want.contiguous().reshape(-1).view(torch.uint8)))

    # parameters (leaves that require grad) are written in place, as Gloo writes them
    param = torch.nn.Parameter(torch.full((4,), float(rank)))
    dist.all_reduce(param, op=R.AVG, group=swml)
    avg_ok = torch.equal(param.detach(), torch.full((4,), sum(range(WORLD)) / WORLD))
    param = torch.nn.Parameter(torch.full((3,), float(rank)))
    dist.broadcast(param, src=root, group=swml)
    out["parameters_ok"] = bool(avg_ok and torch.equal(param.detach(), torch.full((3,), float(root))))

    # barrier: the ranks leave it together (rank 0 comes late)
    if rank == 0:
        time.sleep(0.5)
    t0 = time.monotonic()
    dist.barrier(group=swml)
    out["barrier_waited_s"] = time.monotonic() - t0
    out["fallbacks"] = swml.fallbacks - before[0]
    out["switch_calls"] = swml.switch_calls - before[1]
    return out


WORLD = 4


STEPS = 5


LR = 0.1


MIN_SUBNORMAL_LOG2 = {torch.float32: -149, torch.float16: -24, torch.bfloat16: -133}
