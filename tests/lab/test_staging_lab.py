"""The staging pipeline (switchml_xdp/torch/staging.py) through the real switch
(udp datapath): `python tests/lab/test_staging_lab.py RANK MASTER SWITCH DEVICE`
in four lab hosts, two ranks a host, through the `swml` backend and the hook.
On the CPU the ranks set `stage_cpu_tensors`, so CPU tensors take the CUDA
tensors' road; with DEVICE=cuda (a GPU machine) the same checks run on CUDA
tensors, DDP included. The pipeline alone: tests/unit/test_staging.py.
"""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from lab_jobs import rank_results

torch = pytest.importorskip(
    "torch", reason="PyTorch is an optional extra: pip install -e '.[torch]' (torch==2.13.0)")

from switchml_xdp import quant  # noqa: E402 - after the importorskip
from switchml_xdp.torch.staging import StagingConfig  # noqa: E402 - after the importorskip
from two_level import HOSTS, PARAM_ATOL, PER_HOST, RANK_DEADLINE_S, STEPS, WORLD  # noqa: E402 - after the importorskip
from two_level import gather as _gather_cpu  # noqa: E402 - after the importorskip
from two_level import model as _cpu_model  # noqa: E402 - after the importorskip

NO_CUDA = "no CUDA device: torch.cuda.is_available() is false here (CI never has a GPU)"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

MASTER_PORT = 29561
HOOK_PORT = 48874


def _gather(t):
    return _gather_cpu(t.cpu())


def _model(device):
    return _cpu_model().to(device)


def _train(rank, device, mode, group=None, worker=None):
    """A few SGD steps of DDP over `group`: plain (Gloo, on the CPU: the
    reference), with the swml hook, or over the swml group ("backend"), on
    `device`."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from switchml_xdp.torch import register_hook

    model = _model("cpu" if mode == "gloo" else device)
    ddp = DDP(model, bucket_cap_mb=0.001, process_group=group)
    if mode == "hook":
        state = register_hook(ddp, worker, staging=StagingConfig(chunk_elements=300, buffers=2))
        state.stage_cpu_tensors = True          # CUDA buckets are staged anyway
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)
        opt.zero_grad()
        on = next(model.parameters()).device
        torch.nn.functional.cross_entropy(ddp(x.to(on)), y.to(on)).backward()
        opt.step()
    if mode == "hook":
        assert state.buckets > 0 and state.fallback_buckets == 0
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])


def _rank_main(rank: int, master: str, switch: str, device: str) -> dict:
    import gc
    import os

    import torch.distributed as dist

    import switchml_xdp.torch as swt
    from switchml_xdp import Worker

    torch.set_num_threads(1)
    res: dict = {"rank": rank, "device": device}
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{MASTER_PORT}", rank=rank,
                            world_size=WORLD)
    swml = dist.new_group(backend="swml", pg_options=swt.SwmlOptions(
        switch=switch, backend="udp", staging=StagingConfig(chunk_elements=500, buffers=2)))
    swml.stage_cpu_tensors = True       # CPU tensors take the CUDA tensors' road
    leaders = dist.new_group([h * PER_HOST for h in range(HOSTS)])
    k = swml.k
    res["leader"] = swml.worker is not None

    # Every rank quantizes its own tensor for all WORLD ranks; the int32
    # payloads add up on the host leaders, then the switch: the result is
    # simulate_allreduce over the four ranks, bit for bit.
    gen = torch.Generator().manual_seed(500 + rank)
    cases = {}
    for dt in DTYPES:
        x = (torch.randn(1300, generator=gen) * 4.0).to(dt)
        xs = _gather(x.float())
        for op in ("SUM", "AVG", "MAX"):
            y = x.to(device, copy=True)
            dist.all_reduce(y, op=getattr(dist.ReduceOp, op), group=swml)
            if op == "MAX":
                want = torch.from_numpy(np.maximum.reduce(xs)).to(dt)
            else:
                total = torch.from_numpy(quant.simulate_allreduce(xs, k))
                want = (total / WORLD if op == "AVG" else total).to(dt)
            cases[f"{dt} {op}"] = bool(torch.equal(y.cpu().view(torch.uint8), want.view(torch.uint8)))
    xi = torch.randint(-2**20, 2**20, (777,), generator=gen, dtype=torch.int32)
    yi = xi.to(device, copy=True)
    dist.all_reduce(yi, group=swml)
    exact = np.sum(_gather(xi), axis=0).astype(np.int32)
    cases["int32 SUM"] = bool(torch.equal(yi.cpu(), torch.from_numpy(exact)))
    work = dist.all_reduce(torch.ones(5, device=device), group=swml, async_op=True)
    cases["async"] = bool(torch.equal(work.get_future().wait()[0].cpu(), torch.full((5,), 4.0)))
    root = torch.arange(11, dtype=torch.float64) * 1.5
    b = (root if rank == 1 else torch.zeros(11, dtype=torch.float64)).to(device)
    dist.broadcast(b, src=1, group=swml)
    cases["broadcast"] = bool(torch.equal(b.cpu(), root))
    res["cases"] = cases

    params = {"gloo": _train(rank, device, "gloo"),
              "backend": _train(rank, device, "backend", group=swml)}
    res["backend_steps"] = float((params["backend"] - params["gloo"]).abs().max())
    res["moved"] = float((params["gloo"] - torch.cat([p.detach().reshape(-1)
                                                       for p in _model("cpu").parameters()])).abs().max())
    # The hook: one Worker a host (a job's members are hosts), so DDP over the
    # host leaders; the others wait at the barrier.
    if rank % PER_HOST == 0:
        job = f"stagehook-{os.environ['SWML_TEST_TOKEN']}"
        with Worker(switch, job, rank // PER_HOST, HOSTS, backend="udp", port=HOOK_PORT,
                    verbose=False) as worker:
            hook = _train(rank, device, "hook", group=leaders, worker=worker)
        ref = _train(rank, device, "gloo", group=leaders)
        res["hook_steps"] = float((hook - ref).abs().max())
    dist.barrier()
    res["fallbacks"] = swml.fallbacks
    res["switch_calls"] = swml.switch_calls
    res["staged_chunks"] = sum(p.chunks for p in swml._staging.values())
    del params
    gc.collect()
    dist.destroy_process_group()
    return res


def _lab_ranks(lab8, device):
    import secrets

    hosts = lab8.workers[0:HOSTS]
    placements = [(hosts[rank // PER_HOST], [sys.executable, __file__, str(rank), hosts[0].ip,
                                              lab8.switch.ip, device]) for rank in range(WORLD)]
    env = {"SWML_TEST_TOKEN": secrets.token_hex(3)}
    return rank_results(lab8, placements, RANK_DEADLINE_S, env)


def _check_lab(results):
    for r in results:
        assert all(r["cases"].values()), (r["rank"], r["cases"])
        assert r["fallbacks"] == 0 and r["switch_calls"] > 0 and r["staged_chunks"] > 0
        assert r["moved"] > 1e-2
        assert r["backend_steps"] <= PARAM_ATOL, r
        if r["rank"] % PER_HOST == 0:
            assert r["hook_steps"] <= PARAM_ATOL, r
    assert [r["leader"] for r in results] == [True, False, True, False]


def test_lab_staged_route_through_the_switch_two_ranks_a_host(lab8, switch):
    """The CUDA tensors' road with CPU tensors (stage_cpu_tensors), through the
    real switch: backend all_reduce/broadcast bit for bit simulate_allreduce
    over all four ranks, DDP over the swml group and with the hook equal to
    Gloo's within the quantization's tolerance."""
    _check_lab(_lab_ranks(lab8, "cpu"))


@needs_cuda
def test_lab_cuda_model_through_the_switch(lab8, switch):
    """The same with CUDA tensors and a CUDA DDP model (all ranks on cuda:0)."""
    _check_lab(_lab_ranks(lab8, "cuda"))


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(RANK_DEADLINE_S - 10, exit=True)
    _res = _rank_main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
    print("RESULT " + json.dumps(_res), flush=True)
