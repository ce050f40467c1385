"""PyTorch integration: the DDP hook and the `swml` backend against Gloo.

torch.distributed wants one rank per process, so the lab part runs this file
as a script (`python tests/test_torch.py RANK ...`) in four of lab8's worker
namespaces, all at once, against the shared switch (udp datapath). Every
rank checks what it can see and prints one JSON line; the tests below read
those. Per rank:

* backend: all_reduce through the swml group vs the Gloo group on the same
  inputs; float32 within quant.error_bound of the exact sum (and of Gloo's,
  allowing Gloo its own float32 rounding), bit-identical on every rank; int32
  exact; AVG; non-contiguous and async calls; fallbacks (int64, MAX) equal to
  Gloo with one warning per kind.
* hook: every DDP bucket averaged through the switch vs DDP's built-in Gloo
  allreduce, within the bound (divided by the world size, as averaged);
  float64 buckets go to Gloo instead, with one warning.
* steps: a few SGD steps with DDP + the swml hook and DDP over the swml
  process group end with parameters within tolerance of plain Gloo DDP's.
* the `swml-lab train` rank code for two epochs, both modes.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import pytest

from switchml_xdp.lab.cluster import RanksFailed, rank_result, run_rank_processes

torch = pytest.importorskip(
    "torch", reason="PyTorch is an optional extra: pip install -e '.[torch]' (torch==2.13.0) "
                    "or scripts/setup.sh --torch")

WORLD = 4
HOOK_PORT = 48870          # the hook's Worker: a job of its own, beside the swml group's
MASTER_PORT = 29531
STEPS = 5
LR = 0.1
PARAM_ATOL = 1e-5          # after STEPS steps; observed differences are ~1e-8
BF16_ULPS = 4              # bfloat16 DDP after STEPS steps vs Gloo's, in ulps of the largest parameter
RANK_DEADLINE_S = 90       # the four ranks take ~5-15 s (a loaded machine: more)


# ------------------------------------------------------------------ rank side
# Runs in the worker namespaces: `python tests/test_torch.py RANK WORLD MASTER SWITCH`.

def _bound_sum(xs: list[np.ndarray], result: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(bound of |result - exact|, exact sum) for the switch's result of sum(xs)."""
    from switchml_xdp import quant

    exp_global, _ = quant.global_exponents(xs, k)
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    return quant.error_bound(result, exp_global, len(xs), k), exact


def _gloo_slack(xs: list[np.ndarray]) -> np.ndarray:
    """Gloo adds float32 in some order: each addition rounds by at most 2**-24
    of a partial sum, which is at most sum |x|."""
    return len(xs) * 2.0 ** -24 * np.sum([np.abs(x.astype(np.float64)) for x in xs], axis=0)


def _gather(t):
    import torch.distributed as dist

    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return [o.numpy() for o in out]


def _ratio(err: np.ndarray, bound: np.ndarray) -> float:
    return float(np.max(err / bound)) if err.size else 0.0


def _check_backend(swml, rank: int, k: int) -> dict:
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
        xs = _gather(x)
        bound, exact = _bound_sum(xs, ys.numpy(), k)
        slack = _gloo_slack(xs)
        copies = _gather(ys)
        out["float_cases"].append({
            "n": n,
            "vs_exact": _ratio(np.abs(ys.numpy() - exact), bound),
            "vs_gloo": _ratio(np.abs(ys.numpy().astype(np.float64) - yg.numpy()), bound + slack),
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


_SIGNIFICAND_BITS = {torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}
_MIN_SUBNORMAL_LOG2 = {torch.float32: -149, torch.float16: -24, torch.bfloat16: -133}


def _cast_bound(y: torch.Tensor) -> np.ndarray:
    """|y - z| for y = z rounded to y's dtype (from a float32 z): half an ulp,
    at most 2^-p |y| (p significand bits) or half the smallest subnormal."""
    p, sub = _SIGNIFICAND_BITS[y.dtype], _MIN_SUBNORMAL_LOG2[y.dtype]
    mag = np.abs(y.float().numpy().astype(np.float64))
    return np.maximum(np.ldexp(mag, -p), np.ldexp(1.0, sub - 1))


def _check_ops(swml, rank: int, k: int) -> dict:
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
        xs = _gather(x.float())
        for op in ("SUM", "AVG", "MIN", "MAX"):
            ys, yg = x.clone(), x.clone()
            dist.all_reduce(ys, op=getattr(R, op), group=swml)
            dist.all_reduce(yg, op=getattr(R, op))
            case = {"dtype": str(dt), "op": op, "dtype_kept": ys.dtype == dt,
                    "same_on_all_ranks": all(np.array_equal(c, _gather(ys.float())[0])
                                             for c in _gather(ys.float()))}
            if op in ("MIN", "MAX"):
                want = torch.stack([torch.from_numpy(c) for c in xs]).to(dt)
                want = want.min(0).values if op == "MIN" else want.max(0).values
                case["exact"] = bool(torch.equal(ys, want)) and bool(torch.equal(ys, yg))
            else:
                scale = WORLD if op == "AVG" else 1     # AVG = SUM / WORLD (a power of 2: exact)
                y32 = ys.float().numpy() * scale
                bound, exact = _bound_sum(xs, y32, k)
                bound = bound / scale + _cast_bound(ys) * (1 + 2.0 ** -6)
                got = ys.float().numpy().astype(np.float64)
                # Gloo adds in the dtype: each addition rounds by 2^-p of a partial sum
                slack = (WORLD * 2.0 ** -_SIGNIFICAND_BITS[dt]
                         * np.sum([np.abs(c.astype(np.float64)) for c in xs], axis=0)) / scale
                case["vs_exact"] = _ratio(np.abs(got - exact / scale), bound)
                case["vs_gloo"] = _ratio(np.abs(got - yg.float().numpy()), bound + slack)
            out["float"].append(case)

    xi = torch.randint(-2**20, 2**20, (333,), generator=gen, dtype=torch.int32)
    for op in ("SUM", "MIN", "MAX"):
        ys, yg = xi.clone(), xi.clone()
        dist.all_reduce(ys, op=getattr(R, op), group=swml)
        dist.all_reduce(yg, op=getattr(R, op))
        out["int32"][op] = bool(torch.equal(ys, yg))
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


class _Bucket:
    """What allreduce_hook and torch's compression wrappers use of a GradBucket."""

    def __init__(self, t: torch.Tensor):
        self._t = t

    def buffer(self) -> torch.Tensor:
        return self._t

    def set_buffer(self, t: torch.Tensor) -> None:
        self._t = t


def _check_hook_dtypes(worker, rank: int, k: int) -> dict:
    """The hook on float16/bfloat16 buckets, at precision "16", and wrapped in
    torch's fp16/bf16 compression wrappers: each average vs the exact one."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh

    from switchml_xdp import quant, quant16
    from switchml_xdp.torch import HookState, allreduce_hook

    gen = torch.Generator().manual_seed(300 + rank)
    x = torch.randn(1500, generator=gen) * torch.exp2(torch.randint(-6, 3, (1500,), generator=gen).float())
    s32, s16 = HookState(worker), HookState(worker, precision="16")
    out = {}
    for name, state, dt, hook in [("bfloat16", s32, torch.bfloat16, allreduce_hook),
                                  ("float16", s32, torch.float16, allreduce_hook),
                                  ("p16 float32", s16, torch.float32, allreduce_hook),
                                  ("p16 bfloat16", s16, torch.bfloat16, allreduce_hook),
                                  ("fp16 wrapper", s32, torch.float32,
                                   dh.fp16_compress_wrapper(allreduce_hook)),
                                  ("bf16 wrapper", s32, torch.float32,
                                   dh.bf16_compress_wrapper(allreduce_hook))]:
        inp = x.to(dt)
        # what the switch reduced: the bucket as the hook (after any wrapper) got it, in float32
        sent = {"fp16 wrapper": inp.half(), "bf16 wrapper": inp.bfloat16()}.get(name, inp).float()
        got = hook(state, _Bucket(inp.clone())).wait()
        xs = _gather(sent)
        y32 = got.float().numpy() * WORLD
        if state is s16:
            exp_global, _ = quant.global_exponents(xs, k)
            bound = quant16.error_bound16(y32, exp_global, WORLD, k)
            exact = np.sum([c.astype(np.float64) for c in xs], axis=0)
        else:
            bound, exact = _bound_sum(xs, y32, k)
        # the hook's one rounding of the float32 average to the bucket's dtype
        # (the wrappers hand back their float16/bfloat16 bucket)
        bound = bound / WORLD + _cast_bound(got) * (1 + 2.0 ** -6)
        out[name] = {"dtype": str(got.dtype),
                     "vs_exact": _ratio(np.abs(got.float().numpy().astype(np.float64) - exact / WORLD),
                                        bound)}
    out["buckets"] = s32.buckets + s16.buckets
    out["fallback_buckets"] = s32.fallback_buckets + s16.fallback_buckets
    return out


def _make_model(seed: int = 0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def _batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)


def _check_hook(worker, rank: int, k: int) -> dict:
    """Bucket by bucket: the swml hook's averages vs DDP's built-in Gloo hook's."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from switchml_xdp.torch import HookState, allreduce_hook

    records: dict[str, dict] = {"swml": {}, "gloo": {}}

    def recording(kind, inner, state):
        def hook(_, bucket):  # unannotated: DDP checks annotations, these would be strings
            idx, before = bucket.index(), bucket.buffer().clone()

            def keep(fut):
                records[kind][idx] = (before, fut.value().clone())
                return fut.value()
            return inner(state, bucket).then(keep)
        return hook

    state = HookState(worker)
    models = {}
    for kind in ("swml", "gloo"):
        ddp = DDP(_make_model(), bucket_cap_mb=0.001)   # two buckets: 650 and 4160 elements
        hook = (recording("swml", allreduce_hook, state) if kind == "swml"
                else recording("gloo", default_hooks.allreduce_hook, None))
        ddp.register_comm_hook(None, hook)
        models[kind] = ddp
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(2):          # step 0 builds the buckets, step 1 uses the rebuilt ones
        x, y = _batch(rank, step)
        for ddp in models.values():
            ddp.zero_grad()
            loss_fn(ddp(x), y).backward()
    out = {"buckets": [], "grads_match_buckets": True}
    for idx in sorted(records["swml"]):
        before, got = records["swml"][idx]
        gloo_before, gloo_got = records["gloo"][idx]
        xs = _gather(before)
        bound, exact = _bound_sum(xs, got.numpy() * WORLD, k)
        bound, exact = bound / WORLD, exact / WORLD            # averages; /4 is exact
        slack = _gloo_slack(xs) / WORLD
        out["buckets"].append({
            "index": idx, "numel": got.numel(),
            "same_input": bool(torch.equal(before, gloo_before)),
            "vs_exact": _ratio(np.abs(got.numpy() - exact), bound),
            "vs_gloo": _ratio(np.abs(got.numpy().astype(np.float64) - gloo_got.numpy()), bound + slack)})
    # and DDP put those averages into .grad
    flat = torch.cat([p.grad.reshape(-1) for p in models["swml"].module.parameters()])
    bucket_vals = torch.cat([records["swml"][i][1] for i in sorted(records["swml"])])
    out["grads_match_buckets"] = bool(torch.equal(torch.sort(flat).values, torch.sort(bucket_vals).values))
    out["hook_buckets"] = state.buckets

    # float64 buckets cannot go through the switch: the hook hands them to Gloo
    # (as the built-in hook would), warning once.
    import warnings

    grads = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for kind in ("swml", "gloo"):
            ddp = DDP(_make_model().double(), bucket_cap_mb=0.001)
            if kind == "swml":
                ddp.register_comm_hook(state, allreduce_hook)
            for step in range(2):
                x, y = _batch(rank, step)
                ddp.zero_grad()
                loss_fn(ddp(x.double()), y).backward()
            grads[kind] = torch.cat([p.grad.reshape(-1) for p in ddp.module.parameters()])
    out["float64_fallback_buckets"] = state.fallback_buckets
    out["float64_equal_to_gloo"] = bool(torch.equal(grads["swml"], grads["gloo"]))
    out["float64_warnings"] = sum("cannot go through the switch" in str(w.message) for w in caught)
    return out


def _train_steps(rank: int, mode: str, worker=None, swml=None,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """mode: gloo, hook (the swml hook), hook16 (at precision "16"), backend
    (DDP over the swml group)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from switchml_xdp.torch import register_hook

    model = _make_model().to(dtype)
    ddp = DDP(model, bucket_cap_mb=0.001, process_group=swml if mode == "backend" else None)
    if mode.startswith("hook"):
        register_hook(ddp, worker, precision="16" if mode == "hook16" else "32")
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(STEPS):
        x, y = _batch(rank, step)
        opt.zero_grad()
        loss_fn(ddp(x.to(dtype)), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _rank_main(rank: int, world: int, master: str, switch: str) -> dict:
    import gc

    import torch.distributed as dist

    import switchml_xdp.torch as swt
    from switchml_xdp import Worker
    from switchml_xdp.lab.train_example import TrainConfig, train_rank

    torch.set_num_threads(1)
    res: dict = {"rank": rank}
    t0 = time.monotonic()
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{MASTER_PORT}", rank=rank,
                            world_size=world)
    swml = dist.new_group(backend="swml", pg_options=swt.SwmlOptions(switch=switch, backend="udp"))
    res["swml_group"] = type(swml).__name__
    res["backend_name"] = dist.get_backend(swml)
    k = swml.worker.info.k
    res["backend"] = _check_backend(swml, rank, k)
    t_ops = time.monotonic()
    res["ops"] = _check_ops(swml, rank, k)
    res["t_ops_only"] = time.monotonic() - t_ops
    with Worker(switch, f"torchhook-{os.environ['SWML_TEST_TOKEN']}", rank, world, backend="udp",
                port=HOOK_PORT, verbose=False) as worker:
        res["hook"] = _check_hook(worker, rank, k)
        t_hd = time.monotonic()
        res["hook_dtypes"] = _check_hook_dtypes(worker, rank, k)
        res["t_hook_dtypes"] = time.monotonic() - t_hd
        params = {m: _train_steps(rank, m, worker, swml) for m in ("gloo", "hook", "backend")}
        fallbacks, t_bf16 = swml.fallbacks, time.monotonic()
        bf16 = {m: _train_steps(rank, m, worker, swml, torch.bfloat16)
                for m in ("gloo", "hook", "hook16", "backend")}
        res["bf16_fallbacks"] = swml.fallbacks - fallbacks
        res["t_bf16_steps"] = time.monotonic() - t_bf16
    res["t_ops"] = time.monotonic() - t_ops
    ref = params["gloo"]
    res["steps"] = {m: float((p - ref).abs().max()) for m, p in params.items() if m != "gloo"}
    ref16 = bf16["gloo"].float()
    res["bf16_steps"] = {m: float((p.float() - ref16).abs().max()) for m, p in bf16.items() if m != "gloo"}
    res["bf16_ulp"] = float(ref16.abs().max()) * 2.0 ** -7   # one ulp at the largest parameter
    res["steps_moved"] = float((ref - torch.cat([p.detach().reshape(-1)
                                                 for p in _make_model().parameters()])).abs().max())
    same = {}
    for m, p in params.items():
        copies = _gather(p)
        same[m] = all(np.array_equal(c, copies[0]) for c in copies)
    res["params_same_on_all_ranks"] = same
    res["switch_calls"] = swml.switch_calls
    del params
    gc.collect()  # every DDP gone before its group (see train_example.train_rank)
    dist.destroy_process_group()
    res["left_job_on_destroy"] = swml.worker._closed
    res["t_checks"] = time.monotonic() - t0

    # the example's rank code, briefly, both ways (train_rank makes its own groups)
    try:
        import sklearn  # noqa: F401
    except ImportError:
        res["train"] = None
        return res
    cfg = TrainConfig(epochs=2)
    job = f"torchtrain-{os.environ['SWML_TEST_TOKEN']}"
    res["train"] = {m: train_rank(rank, world, m, master, switch, job, "udp", cfg) for m in ("gloo", "swml")}
    res["t_total"] = time.monotonic() - t0
    return res


# ----------------------------------------------------------------- pytest side

@pytest.fixture(scope="module")
def ranks(lab8, switch):
    """Run the four ranks once; their JSON results in rank order."""
    import secrets

    hosts = lab8.workers[4:4 + WORLD]
    token = secrets.token_hex(3)
    env = {"SWML_TEST_TOKEN": token}
    placements = [(host, [sys.executable, __file__, str(rank), str(WORLD), hosts[0].ip,
                          lab8.switch.ip]) for rank, host in enumerate(hosts)]
    try:
        outs = run_rank_processes(lab8, placements, RANK_DEADLINE_S, env)
    except RanksFailed as e:
        pytest.fail(str(e))
    results = [rank_result(out) for out, _ in outs]
    assert all(results), "a rank printed no result"
    return results


def test_backend_all_reduce_within_quantization_bound_of_gloo(ranks):
    for r in ranks:
        assert r["swml_group"] == "ProcessGroupSwml" and r["backend_name"] == "swml"
        b = r["backend"]
        for case in b["float_cases"]:
            assert case["vs_exact"] <= 1.0, (r["rank"], case)
            assert case["vs_gloo"] <= 1.0, (r["rank"], case)
            assert case["same_on_all_ranks"], (r["rank"], case)
        assert b["int32_equal"]
        assert b["avg_is_sum_over_world"]
        assert b["noncontiguous_ok"]
        assert b["async_ok"]


def test_backend_falls_back_to_gloo_with_one_warning_per_kind(ranks):
    for r in ranks:
        b = r["backend"]
        assert b["fallback_equal"] == {"int64": True, "int64 again": True, "product": True}
        assert b["fallback_count"] == 3
        assert len(b["fallback_warnings"]) == 2, b["fallback_warnings"]   # int64 once, PRODUCT once
        assert any("torch.int64" in w for w in b["fallback_warnings"])
        assert any("PRODUCT" in w for w in b["fallback_warnings"])
        assert b["warning_points_at_caller"]


def test_backend_dtypes_and_ops_through_the_switch(ranks):
    """float32/float16/bfloat16 SUM and AVG within the bound (the switch's, plus
    the one rounding to the dtype) of the exact result and of Gloo's; MIN/MAX
    and int32 exact; int32 AVG refused on every rank, the job going on."""
    for r in ranks:
        o = r["ops"]
        assert len(o["float"]) == 12
        for case in o["float"]:
            assert case["dtype_kept"] and case["same_on_all_ranks"], (r["rank"], case)
            if case["op"] in ("MIN", "MAX"):
                assert case["exact"], (r["rank"], case)
            else:
                assert case["vs_exact"] <= 1.0, (r["rank"], case)
                assert case["vs_gloo"] <= 1.0, (r["rank"], case)
        assert o["int32"] == {"SUM": True, "MIN": True, "MAX": True}
        assert "integer average is not exact" in o["int32_avg_error"]
        assert o["after_error_ok"]
        assert o["coalesced_max_equal"]


def test_backend_broadcast_bit_exact_and_barrier_through_the_switch(ranks):
    for r in ranks:
        o = r["ops"]
        assert all(o["broadcast"].values()), (r["rank"], o["broadcast"])
        if r["rank"] != 0:
            assert o["barrier_waited_s"] >= 0.3, o["barrier_waited_s"]   # rank 0 came 0.5 s late
        assert o["parameters_ok"]
        # every call above went through the switch: 12 float + 3 int32 + 1 after the
        # refusal + 1 coalesced + 6 broadcasts + 2 on parameters + 1 barrier (Gloo
        # did the comparisons)
        assert o["fallbacks"] == 0
        assert o["switch_calls"] == 26


def test_hook_gradients_within_quantization_bound_of_gloo(ranks):
    for r in ranks:
        h = r["hook"]
        assert [b["numel"] for b in h["buckets"]] == [650, 4160]
        for b in h["buckets"]:
            assert b["same_input"], b
            assert b["vs_exact"] <= 1.0, (r["rank"], b)
            assert b["vs_gloo"] <= 1.0, (r["rank"], b)
        assert h["grads_match_buckets"]
        assert h["hook_buckets"] >= 3   # 1 bucket in the first step, 2 after DDP rebuilt them
        assert h["float64_fallback_buckets"] == 3 and h["float64_equal_to_gloo"]
        assert h["float64_warnings"] == 1


def test_hook_float16_bfloat16_precision16_and_torch_wrappers(ranks):
    for r in ranks:
        h = r["hook_dtypes"]
        for name in ("bfloat16", "float16", "p16 float32", "p16 bfloat16", "fp16 wrapper", "bf16 wrapper"):
            assert h[name]["vs_exact"] <= 1.0, (r["rank"], name, h[name])
        assert h["bfloat16"]["dtype"] == "torch.bfloat16" and h["float16"]["dtype"] == "torch.float16"
        assert h["p16 float32"]["dtype"] == "torch.float32"
        assert h["buckets"] == 6 and h["fallback_buckets"] == 0


def test_ddp_bfloat16_steps_within_tolerance_of_gloo(ranks):
    for r in ranks:
        for mode, diff in r["bf16_steps"].items():
            assert diff <= BF16_ULPS * r["bf16_ulp"], (r["rank"], mode, diff, r["bf16_ulp"])
        assert r["bf16_fallbacks"] == 0


def test_ddp_steps_end_within_tolerance_of_gloo(ranks):
    for r in ranks:
        assert r["steps_moved"] > 1e-2             # the steps did change the parameters
        for mode, diff in r["steps"].items():
            assert diff <= PARAM_ATOL, (r["rank"], mode, diff)
        assert all(r["params_same_on_all_ranks"].values()), r["params_same_on_all_ranks"]
    assert ranks[0]["switch_calls"] > 0
    assert all(r["left_job_on_destroy"] for r in ranks)


def test_training_example_rank_code(ranks, tmp_path):
    pytest.importorskip("sklearn", reason="the training example needs scikit-learn (python3-sklearn)")
    pytest.importorskip("matplotlib", reason="the training example plots with matplotlib")
    from switchml_xdp.lab.train_example import plot_curves, summary_lines

    train = ranks[0]["train"]
    assert all(ranks[i]["train"] == {"gloo": None, "swml": None} for i in range(1, WORLD))
    for mode in ("gloo", "swml"):
        assert len(train[mode]["test_acc"]) == 2
        assert train[mode]["test_acc"][-1] > 80.0
        assert train[mode]["param_spread"] == 0.0
    assert train["swml"]["buckets"] > 0 and train["swml"]["fallback_buckets"] == 0
    assert abs(train["swml"]["test_acc"][-1] - train["gloo"]["test_acc"][-1]) <= 0.5
    png = tmp_path / "curves.png"
    plot_curves(train, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = summary_lines(train)
    assert lines[1].startswith("gloo") and lines[2].startswith("swml")


if __name__ == "__main__":
    import faulthandler

    # A rank stuck past the fixture's deadline says where, in what the fixture reports.
    faulthandler.dump_traceback_later(RANK_DEADLINE_S - 10, exit=True)
    _rank, _world, _master, _switch = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    _res = _rank_main(int(_rank), int(_world), _master, _switch)
    print("RESULT " + json.dumps(_res), flush=True)
