"""Everyday torch on the `swml` backend, in one run, as a user's script mixes it
(docs/pytorch.md): two lab hosts of two ranks, `init_process_group("swml")`,
then in turn:

- all_reduce (int32, exact) and an async float32 all_reduce;
- a ring of isend/irecv between switch all_reduces, then barrier;
- a subgroup (one rank a host) with its own all_reduce, destroyed;
- DDP with gradient accumulation under no_sync;
- torch.compile of a DDP model;
- FSDP2 (fully_shard over the group);
- broadcast.

Every value is checked; every rank ends with the same parameters; no call the
switch can do fell back to Gloo, and no fallback warning was printed. Run as a
script per rank (`python tests/lab/test_torch_everyday.py RANK MASTER SWITCH`).
"""
from __future__ import annotations

import contextlib
import io
import json
import sys
import warnings

import pytest

from lab_jobs import rank_results

torch = pytest.importorskip(
    "torch", reason="PyTorch is an optional extra: pip install -e '.[torch]' (torch==2.13.0)")

from two_level import HOSTS, PER_HOST, RANK_DEADLINE_S, WORLD, model  # noqa: E402 - after the importorskip

MASTER_PORT = 29563
N = 3000


def _same_everywhere(t) -> bool:
    """`t` equal on every rank (compared through the group's MAX and MIN)."""
    import torch.distributed as dist

    hi, lo = t.clone(), t.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    return bool(torch.equal(hi, lo))


def _params(m):
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1)
                      for p in m.parameters()])


def _batch(rank: int, step: int):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 32, generator=g), torch.randint(0, 4, (8,), generator=g)


def _train(m, steps: int, rank: int, accumulate: int = 1, no_sync=None) -> list[float]:
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        for micro in range(accumulate):
            x, y = _batch(rank, step * accumulate + micro)
            ctx = no_sync() if no_sync is not None and micro < accumulate - 1 else \
                contextlib.nullcontext()
            with ctx:
                loss = torch.nn.functional.cross_entropy(m(x), y)
                loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _collectives(rank: int, res: dict) -> None:
    import torch.distributed as dist

    x = torch.arange(N, dtype=torch.int32) * (rank + 1)
    dist.all_reduce(x)
    res["all_reduce"] = bool(torch.equal(x, torch.arange(N, dtype=torch.int32) * 10))
    f = torch.full((N,), float(rank))
    work = dist.all_reduce(f, async_op=True)
    work.wait()
    res["async_all_reduce"] = bool(torch.allclose(f, torch.full((N,), 6.0), rtol=1e-3))
    # A ring of point-to-point transfers between switch collectives, then barrier.
    send = torch.full((16,), float(rank))
    recv = torch.empty(16)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % WORLD),
           dist.P2POp(dist.irecv, recv, (rank - 1) % WORLD)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    y = torch.ones(N, dtype=torch.int32)
    dist.all_reduce(y)
    dist.barrier()
    res["p2p"] = bool(torch.equal(recv, torch.full((16,), float((rank - 1) % WORLD))))
    res["after_p2p"] = bool(torch.equal(y, torch.full((N,), WORLD, dtype=torch.int32)))
    b = torch.arange(N, dtype=torch.float32) if rank == 2 else torch.zeros(N)
    dist.broadcast(b, src=2)
    res["broadcast"] = bool(torch.equal(b, torch.arange(N, dtype=torch.float32)))


def _subgroup(rank: int, res: dict) -> None:
    import torch.distributed as dist

    members = [0, PER_HOST]   # one rank a host
    g = dist.new_group(members)
    if rank in members:
        x = torch.full((N,), rank + 1, dtype=torch.int32)
        dist.all_reduce(x, group=g)
        res["subgroup"] = bool(torch.equal(x, torch.full((N,), 1 + PER_HOST + 1,
                                                         dtype=torch.int32)))
    dist.destroy_process_group(g)


def _models(rank: int, res: dict) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model())
    res["no_sync_losses"] = _train(ddp, 3, rank, accumulate=2, no_sync=ddp.no_sync)
    res["no_sync_same"] = _same_everywhere(_params(ddp))
    compiled_ddp = DDP(model())
    res["compiled_losses"] = _train(torch.compile(compiled_ddp, backend="eager"), 3, rank)
    res["compiled_same"] = _same_everywhere(_params(compiled_ddp))
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    sharded = model()
    for layer in sharded:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    res["fsdp2_losses"] = _train(sharded, 3, rank)
    res["fsdp2_same"] = _same_everywhere(_params(sharded))


def _rank_main(rank: int, master: str, switch: str) -> dict:
    import torch.distributed as dist

    import switchml_xdp.torch as swt

    torch.set_num_threads(1)
    said = io.StringIO()
    res: dict = {"rank": rank}
    with contextlib.redirect_stderr(said), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.init_process_group("swml", init_method=f"tcp://{master}:{MASTER_PORT}", rank=rank,
                                world_size=WORLD,
                                pg_options=swt.SwmlOptions(switch=switch, backend="udp"))
        _collectives(rank, res)
        _subgroup(rank, res)
        _models(rank, res)
        res["stats"] = {k: v for k, v in swt.stats().items() if isinstance(v, (int, str, type(None)))}
        res["fallback_reasons"] = swt.stats()["fallback_reasons"]
        dist.destroy_process_group()
    res["said"] = said.getvalue().splitlines() + [str(w.message) for w in caught]
    return res


# ----------------------------------------------------------------- pytest side

@pytest.fixture(scope="module")
def everyday(lab8, switch):
    hosts = lab8.workers[:HOSTS]
    return rank_results(lab8, [(hosts[rank // PER_HOST],
                                [sys.executable, __file__, str(rank), hosts[0].ip, lab8.switch.ip])
                               for rank in range(WORLD)], RANK_DEADLINE_S)


def test_every_value_is_right(everyday):
    for r in everyday:
        for key in ("all_reduce", "async_all_reduce", "p2p", "after_p2p", "broadcast",
                    "no_sync_same", "compiled_same", "fsdp2_same"):
            assert r[key] is True, (r["rank"], key)
        if r["rank"] in (0, PER_HOST):
            assert r["subgroup"] is True, r["rank"]
        for key in ("no_sync_losses", "compiled_losses", "fsdp2_losses"):
            assert all(v == v and v < 10 for v in r[key]), (r["rank"], key, r[key])


def test_nothing_the_switch_can_do_fell_back(everyday):
    for r in everyday:
        assert r["stats"]["fallbacks"] == 0, (r["rank"], r["fallback_reasons"])
        assert r["stats"]["switch_calls"] > 0
        assert not [line for line in r["said"] if "fall" in line.lower()], r["said"]


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(RANK_DEADLINE_S - 10, exit=True)
    _res = _rank_main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
    print("RESULT " + json.dumps(_res), flush=True)
