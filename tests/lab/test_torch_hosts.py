"""Several ranks per host through the `swml` backend.

Two lab hosts (network namespaces) run two ranks each, as `torchrun
--nproc_per_node=2` would: the ranks of a host reduce into its leader through
shared memory (in chunks: a small segment), the two leaders are the switch job's two members, and the result
goes back to every rank. Run as a script per rank (`python
tests/test_torch_hosts.py RANK MASTER SWITCH`); the tests read its JSON line.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from lab_jobs import rank_results

torch = pytest.importorskip(
    "torch", reason="PyTorch is an optional extra: pip install -e '.[torch]' (torch==2.13.0)")

# the layout and the model shared with tests/lab/test_staging_lab.py
from two_level import HOSTS, PARAM_ATOL, PER_HOST, RANK_DEADLINE_S, STEPS, WORLD  # noqa: E402 - after the importorskip
from two_level import gather as _gather  # noqa: E402 - after the importorskip
from two_level import model as _model  # noqa: E402 - after the importorskip

MASTER_PORT = 29541
SHM_BYTES = 8192            # 1 KiB slots: the 3000-element sums take 12 chunks


# ------------------------------------------------------------------ rank side

def _train(rank: int, group) -> torch.Tensor:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _model()
    ddp = DDP(model, bucket_cap_mb=0.001, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _rank_main(rank: int, master: str, switch: str) -> dict:
    import gc

    import torch.distributed as dist

    import switchml_xdp.torch as swt
    from switchml_xdp import quant

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{MASTER_PORT}", rank=rank,
                            world_size=WORLD)
    swml = dist.new_group(backend="swml", pg_options=swt.SwmlOptions(switch=switch, backend="udp",
                                                                     shm_bytes=SHM_BYTES))
    res: dict = {"rank": rank, "layout": [list(h) for h in swml.layout.hosts],
                 "leader": swml.layout.is_leader,
                 "job_world": swml.worker.info.world if swml.worker else None,
                 "job_rank": swml.worker.info.rank if swml.worker else None}
    k = 256

    # float32 SUM: the switch quantizes the host sums (each itself a float32 sum)
    gen = torch.Generator().manual_seed(7 + rank)
    x = torch.randn(3000, generator=gen) * 4
    y = x.clone()
    dist.all_reduce(y, group=swml)
    xs = _gather(x)
    host_sums = [np.add(xs[2 * h], xs[2 * h + 1], dtype=np.float32) for h in range(HOSTS)]
    exp_global, _ = quant.global_exponents(host_sums, k)
    bound = quant.error_bound(y.numpy(), exp_global, HOSTS, k)
    exact = np.sum([s.astype(np.float64) for s in host_sums], axis=0)
    res["f32_vs_bound"] = float(np.max(np.abs(y.numpy() - exact) / bound))
    copies = _gather(y)
    res["f32_same_everywhere"] = all(np.array_equal(c, copies[0]) for c in copies)

    xi = torch.arange(1000, dtype=torch.int32) * (rank + 1)
    dist.all_reduce(xi, group=swml)
    res["int32_exact"] = bool(torch.equal(xi, torch.arange(1000, dtype=torch.int32) * 10))
    a = torch.full((100,), float(rank))
    dist.all_reduce(a, op=dist.ReduceOp.AVG, group=swml)
    res["avg"] = float(a[0])

    # MIN/MAX exact, float16/bfloat16 sums within float32's bound plus one
    # rounding to the dtype, against Gloo on the same inputs.
    exact_ops, close = {}, {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32):
        base = (torch.randn(777, generator=gen) * 100).to(dtype)
        for op in (dist.ReduceOp.MIN, dist.ReduceOp.MAX):
            a, b = base.clone(), base.clone()
            dist.all_reduce(a, op=op, group=swml)
            dist.all_reduce(b, op=op)
            exact_ops[f"{dtype}-{op}"] = bool(torch.equal(a, b))
        if dtype in (torch.float16, torch.bfloat16):
            a, b = base.clone(), base.float()
            dist.all_reduce(a, group=swml)
            dist.all_reduce(b)
            ulp = torch.finfo(dtype).eps * b.abs().max().item()
            close[str(dtype)] = float((a.float() - b).abs().max().item() / ulp)
    res["min_max_exact"] = exact_ops
    res["half_sums_in_ulps"] = close
    # broadcast from a rank that is not its host's leader: its bits exactly
    src = torch.randn(1001, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    got = src.clone() if rank == 1 else torch.zeros(1001, dtype=torch.bfloat16)
    dist.broadcast(got, src=1, group=swml)
    res["broadcast_exact"] = bool(torch.equal(got.view(torch.int16), src.view(torch.int16)))
    dist.barrier(group=swml)

    # A call the hosts disagree on (host 0 sends 100 elements, host 1 101):
    # an error on every rank, leaders and the rest, and the group goes on.
    bad = torch.ones(100 + swml.layout.host_index)
    try:
        dist.all_reduce(bad, group=swml)
        res["mismatch"] = "no error"
    except Exception as e:  # noqa: BLE001 - reported
        res["mismatch"] = f"{type(e).__name__}: {e}"
    after = torch.ones(10)
    dist.all_reduce(after, group=swml)
    res["usable_after_mismatch"] = bool(torch.equal(after, torch.full((10,), float(WORLD))))

    params = {"gloo": _train(rank, None), "swml": _train(rank, swml)}
    res["ddp_diff"] = float((params["swml"] - params["gloo"]).abs().max())
    res["fallbacks"] = swml.fallbacks
    res["switch_calls"] = swml.switch_calls
    local = swml.local
    res["local"] = {"transport": local.transport, "chunks": local.chunks, "calls": local.calls,
                    "has_gloo": hasattr(local, "gloo"),
                    "segment_in_dev_shm": os.path.exists(f"/dev/shm/{local.segment_name}")}
    del params
    gc.collect()
    dist.destroy_process_group()
    return res


# ----------------------------------------------------------------- pytest side

@pytest.fixture(scope="module")
def ranks(lab8, switch):
    hosts = lab8.workers[2:2 + HOSTS]
    placements = [(hosts[rank // PER_HOST], [sys.executable, __file__, str(rank), hosts[0].ip,
                                              lab8.switch.ip]) for rank in range(WORLD)]
    return rank_results(lab8, placements, RANK_DEADLINE_S)


def test_one_leader_a_host_joins_the_switch(ranks):
    for r in ranks:
        assert r["layout"] == [[0, 1], [2, 3]]
        assert r["leader"] == (r["rank"] % PER_HOST == 0)
        if r["leader"]:
            assert (r["job_world"], r["job_rank"]) == (HOSTS, r["rank"] // PER_HOST)
        else:
            assert r["job_world"] is None


def test_the_local_reduce_is_through_shared_memory(ranks):
    """No loopback Gloo group: the ranks of a host moved every call's chunks
    through their segment, whose name left /dev/shm once both had mapped it."""
    for r in ranks:
        local = r["local"]
        assert local["transport"] == "shm" and not local["has_gloo"], local
        assert local["calls"] >= r["switch_calls"] and local["chunks"] > local["calls"], local
        assert not local["segment_in_dev_shm"], local


def test_sums_through_two_levels(ranks):
    for r in ranks:
        assert r["f32_vs_bound"] <= 1.0, r
        assert r["f32_same_everywhere"]
        assert r["int32_exact"]
        assert r["avg"] == pytest.approx(sum(range(WORLD)) / WORLD)
        assert r["fallbacks"] == 0 and r["switch_calls"] > 0


def test_ops_dtypes_broadcast_barrier_through_two_levels(ranks):
    for r in ranks:
        assert all(r["min_max_exact"].values()), r["min_max_exact"]
        for dtype, ulps in r["half_sums_in_ulps"].items():
            assert ulps <= 2.0, (dtype, ulps)     # the switch's bound, then one rounding
        assert r["broadcast_exact"]


def test_a_disagreement_reaches_every_rank_of_every_host(ranks):
    for r in ranks:
        assert "CallMismatch" in r["mismatch"], r["mismatch"]
        if not r["leader"]:
            assert "host's leader" in r["mismatch"]
        assert r["usable_after_mismatch"]


def test_ddp_over_the_group_matches_gloo(ranks):
    for r in ranks:
        assert r["ddp_diff"] <= PARAM_ATOL, r


def test_lab_train_with_two_ranks_a_host(tmp_path):
    """`swml-lab train -n 2 --ranks-per-host 2`, briefly: same accuracy as Gloo,
    a job of 2 members, nothing through Gloo."""
    pytest.importorskip("sklearn", reason="the training example needs scikit-learn (python3-sklearn)")
    pytest.importorskip("matplotlib", reason="the training example plots with matplotlib")
    from conftest import NO_LAB
    if NO_LAB:
        pytest.skip(NO_LAB)
    from switchml_xdp.lab.train_example import TrainConfig
    from switchml_xdp.lab.train_runs import run_lab_training

    res = run_lab_training(2, TrainConfig(epochs=2, ranks_per_host=2), "udp",
                           str(tmp_path / "c.png"), out=lambda *_: None)
    assert res["swml"]["world"] == res["gloo"]["world"] == 4
    assert res["swml"]["worker"]["job_world"] == 2
    assert res["swml"]["buckets"] > 0 and res["swml"]["fallback_buckets"] == 0
    assert res["swml"]["param_spread"] == 0.0
    assert abs(res["swml"]["test_acc"][-1] - res["gloo"]["test_acc"][-1]) <= 0.5


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(RANK_DEADLINE_S - 10, exit=True)
    _res = _rank_main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
    print("RESULT " + json.dumps(_res), flush=True)
