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
    "torch", reason="PyTorch is an optional extra: pip install 'switchml-xdp[torch]' (torch==2.13.0)")

WORLD = 4
HOOK_PORT = 48870          # the hook's Worker: a job of its own, beside the swml group's
MASTER_PORT = 29531
STEPS = 5
LR = 0.1
PARAM_ATOL = 1e-5          # after STEPS steps; observed differences are ~1e-8
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
                            ("max", torch.randn(10, generator=gen), dist.ReduceOp.MAX)]:
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


def _make_model(seed: int = 0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def _batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)


def _check_hook(worker, rank: int, k: int) -> dict:
    """Bucket by bucket: the swml hook's averages vs DDP's built-in Gloo hook's."""
    import torch.distributed as dist
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


def _train_steps(rank: int, mode: str, worker=None, swml=None) -> torch.Tensor:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from switchml_xdp.torch import register_hook

    model = _make_model()
    ddp = DDP(model, bucket_cap_mb=0.001, process_group=swml if mode == "backend" else None)
    if mode == "hook":
        register_hook(ddp, worker)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(STEPS):
        x, y = _batch(rank, step)
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _rank_main(rank: int, world: int, master: str, switch: str) -> dict:
    import gc

    import torch.distributed as dist

    import switchml_xdp.torch as swt
    from switchml_xdp import Worker
    from switchml_xdp.torch.train_example import TrainConfig, train_rank

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
    with Worker(switch, f"torchhook-{os.environ['SWML_TEST_TOKEN']}", rank, world, backend="udp",
                port=HOOK_PORT, verbose=False) as worker:
        res["hook"] = _check_hook(worker, rank, k)
        params = {m: _train_steps(rank, m, worker, swml) for m in ("gloo", "hook", "backend")}
    ref = params["gloo"]
    res["steps"] = {m: float((p - ref).abs().max()) for m, p in params.items() if m != "gloo"}
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


def test_backend_registered_as_swml():
    import torch.distributed as dist

    import switchml_xdp.torch  # noqa: F401

    assert "swml" in dist.Backend.backend_list
    assert dist.Backend.SWML == "swml"


def test_backend_without_switch_address_says_how_to_give_it(monkeypatch):
    from switchml_xdp.torch import SwmlOptions

    monkeypatch.delenv("SWML_SWITCH", raising=False)
    with pytest.raises(ValueError, match="SWML_SWITCH"):
        SwmlOptions().resolved()
    monkeypatch.setenv("SWML_SWITCH", "10.9.9.9")
    assert SwmlOptions().resolved().switch == "10.9.9.9"


def test_hook_refuses_a_state_that_is_not_a_worker():
    from switchml_xdp.torch import allreduce_hook

    with pytest.raises(TypeError, match="HookState or a Worker"):
        allreduce_hook(object(), None)


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
        assert b["fallback_equal"] == {"int64": True, "int64 again": True, "max": True}
        assert b["fallback_count"] == 3
        assert len(b["fallback_warnings"]) == 2, b["fallback_warnings"]   # int64 once, MAX once
        assert any("torch.int64" in w for w in b["fallback_warnings"])
        assert any("MAX" in w for w in b["fallback_warnings"])
        assert b["warning_points_at_caller"]


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
    from switchml_xdp.torch.train_example import plot_curves, summary_lines

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
