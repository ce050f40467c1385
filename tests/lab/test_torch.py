"""PyTorch integration: the DDP hook and the `swml` backend against Gloo.

torch.distributed wants one rank per process, so the lab part runs this file
as a script (`python tests/lab/test_torch.py RANK ...`) in four of lab8's worker
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

from lab_jobs import rank_results

torch = pytest.importorskip(
    "torch", reason="PyTorch is an optional extra: pip install -e '.[torch]' (torch==2.13.0) "
                    "or scripts/setup.sh --torch")

# the rank side: what each rank checks, run in its own process
from torch_backend_checks import WORLD, check_backend, check_ops, gather  # noqa: E402 - after the importorskip
from torch_hook_checks import check_hook, check_hook_dtypes, make_model, train_steps  # noqa: E402 - after the importorskip

HOOK_PORT = 48870          # the hook's Worker: a job of its own, beside the swml group's
MASTER_PORT = 29531
PARAM_ATOL = 1e-5          # after STEPS steps; observed differences are ~1e-8
BF16_ULPS = 4              # bfloat16 DDP after STEPS steps vs Gloo's, in ulps of the largest parameter
RANK_DEADLINE_S = 90       # the four ranks take ~5-15 s (a loaded machine: more)


# ------------------------------------------------------------------ rank side
# Runs in the worker namespaces: `python tests/test_torch.py RANK WORLD MASTER SWITCH`.


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
    res["backend"] = check_backend(swml, rank, k)
    t_ops = time.monotonic()
    res["ops"] = check_ops(swml, rank, k)
    res["t_ops_only"] = time.monotonic() - t_ops
    with Worker(switch, f"torchhook-{os.environ['SWML_TEST_TOKEN']}", rank, world, backend="udp",
                port=HOOK_PORT, verbose=False) as worker:
        res["hook"] = check_hook(worker, rank, k)
        t_hd = time.monotonic()
        res["hook_dtypes"] = check_hook_dtypes(worker, rank, k)
        res["t_hook_dtypes"] = time.monotonic() - t_hd
        params = {m: train_steps(rank, m, worker, swml) for m in ("gloo", "hook", "backend")}
        fallbacks, t_bf16 = swml.fallbacks, time.monotonic()
        bf16 = {m: train_steps(rank, m, worker, swml, torch.bfloat16)
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
                                                 for p in make_model().parameters()])).abs().max())
    same = {}
    for m, p in params.items():
        copies = gather(p)
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
        import sklearn  # noqa: F401 - imported only to learn whether it is there
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
    return rank_results(lab8, placements, RANK_DEADLINE_S, env)


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
    and int32 exact; reduce_scatter as Gloo's, through the Worker's; int32 AVG
    refused on every rank, the job going on."""
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
        assert o["reduce_scatter"] == {"int32 SUM": True, "float32 MAX": True,
                                       "worker_reduce_scatters": 2}, r["rank"]
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
        # every call above went through the switch: 12 float + 3 int32 + 2
        # reduce_scatters + 1 after the refusal + 1 coalesced + 6 broadcasts + 2 on
        # parameters + 1 barrier (Gloo did the comparisons)
        assert o["fallbacks"] == 0
        assert o["switch_calls"] == 28


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
    from switchml_xdp.lab.train_runs import plot_curves, summary_lines

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
