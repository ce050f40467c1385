"""The `swml` backend as the default process group of torch's own parallelism:
torch.compile of a DDP model, FSDP2 (`fully_shard`) and FSDP1, the stats API
and the datapath line.

Two lab hosts run two ranks each (as `torchrun --nproc_per_node=2` would),
with `init_process_group("swml")`; each rank runs this file as a script
(`python tests/lab/test_torch_compile_fsdp.py RANK MASTER SWITCH`) and
prints one JSON line that the tests read. Every model is trained twice, over
the swml group and over a Gloo group on the same data: the losses must fall
and agree within the switch's quantization.
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

from two_level import HOSTS, PER_HOST, RANK_DEADLINE_S, WORLD  # noqa: E402 - after the importorskip
from two_level import model as _model  # noqa: E402 - after the importorskip

MASTER_PORT = 29561
STEPS = 6
LOSS_RTOL = 1e-3       # swml's loss vs Gloo's after STEPS steps (quantization: ~1e-6)


# ------------------------------------------------------------------ rank side

def _batches(rank: int):
    """The same batch every step (a rank's own): the loss must fall."""
    g = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)
    for _ in range(STEPS):
        yield x, y


def _losses(model, forward) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    out = []
    for x, y in _batches_for_rank():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(forward(x), y)
        loss.backward()
        opt.step()
        out.append(float(loss))
    return out


def _batches_for_rank():
    import torch.distributed as dist

    return _batches(dist.get_rank())


def _compiled_ddp(group) -> list[float]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(_model(), process_group=group)
    return _losses(ddp, torch.compile(ddp, backend="eager"))


def _fsdp2(group) -> list[float]:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, "cpu")
    m = _model()
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return _losses(m, m)


def _fsdp1(group) -> list[float]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    m = FSDP(_model(), process_group=group, use_orig_params=True, device_id=torch.device("cpu"))
    return _losses(m, m)


def _both(fn, swml, gloo) -> dict:
    """fn over the swml group then over Gloo: their losses, or the error."""
    out = {}
    for name, group in (("swml", swml), ("gloo", gloo)):
        try:
            out[name] = fn(group)
        except Exception as e:  # noqa: BLE001 - reported
            out[name] = f"{type(e).__name__}: {str(e)[:300]}"
    return out


def _rank_main(rank: int, master: str, switch: str) -> dict:
    import torch.distributed as dist

    import switchml_xdp.torch as swt

    torch.set_num_threads(1)
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        dist.init_process_group("swml", init_method=f"tcp://{master}:{MASTER_PORT}", rank=rank,
                                world_size=WORLD,
                                pg_options=swt.SwmlOptions(switch=switch, backend="udp"))
    swml = dist.group.WORLD
    swml.reduce_scatter_min_bytes = 0   # the tiny model's reduce_scatters through the switch too
    gloo = dist.new_group(backend="gloo")
    res: dict = {"rank": rank, "said": said.getvalue().splitlines()}
    try:
        res["group_name"] = swml.group_name
    except Exception as e:  # noqa: BLE001 - reported
        res["group_name"] = f"{type(e).__name__}: {e}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res["compiled_ddp"] = _both(_compiled_ddp, swml, gloo)
        before = swt.stats(swml)
        res["fsdp2"] = _both(_fsdp2, swml, gloo)
        after = swt.stats(swml)
        res["fsdp1"] = _both(_fsdp1, swml, gloo)
    res["warnings"] = [str(w.message) for w in caught]
    res["fsdp2_switch_calls"] = after["switch_calls"] - before["switch_calls"]
    res["stats"] = swt.stats()
    res["stats_of_gloo"] = ""
    try:
        swt.stats(gloo)
    except ValueError as e:
        res["stats_of_gloo"] = str(e)
    dist.destroy_process_group()
    return res


# ----------------------------------------------------------------- pytest side

@pytest.fixture(scope="module")
def ranks(lab8, switch):
    hosts = lab8.workers[6:6 + HOSTS]
    placements = [(hosts[rank // PER_HOST], [sys.executable, __file__, str(rank), hosts[0].ip,
                                              lab8.switch.ip]) for rank in range(WORLD)]
    return rank_results(lab8, placements, RANK_DEADLINE_S)


def _trains_as_gloo(case: dict) -> None:
    swml, gloo = case["swml"], case["gloo"]
    assert isinstance(swml, list), swml
    assert isinstance(gloo, list), gloo
    assert swml[-1] < swml[0], swml
    assert swml == pytest.approx(gloo, rel=LOSS_RTOL), (swml, gloo)


def test_the_group_has_its_name(ranks):
    for r in ranks:
        assert r["group_name"] == "0", r["group_name"]


def test_compiled_ddp_trains_as_gloo(ranks):
    for r in ranks:
        _trains_as_gloo(r["compiled_ddp"])


def test_fsdp2_trains_as_gloo_with_reduce_scatter_through_the_switch(ranks):
    for r in ranks:
        _trains_as_gloo(r["fsdp2"])
        assert r["fsdp2_switch_calls"] > 0


def test_fsdp1_trains_as_gloo(ranks):
    for r in ranks:
        _trains_as_gloo(r["fsdp1"])


def test_where_each_collective_goes_is_said_once(ranks):
    for r in ranks:
        lines = [w for w in r["warnings"] if "goes through" in w or "go through" in w]
        assert lines, r["warnings"]
        assert len(lines) == len(set(lines)), lines


def test_the_datapath_line_on_rank_0_only(ranks):
    for r in ranks:
        lines = [s for s in r["said"] if "datapath" in s]
        if r["rank"] == 0:
            assert len(lines) == 1, r["said"]
            assert "udp datapath" in lines[0] and "k=256" in lines[0] and "slots=" in lines[0]
            assert f"{HOSTS} hosts x {PER_HOST} ranks" in lines[0]
        else:
            assert lines == [], r["said"]


def test_stats_reachable_from_the_group(ranks):
    for r in ranks:
        s = r["stats"]
        assert s["switch_calls"] > 0 and s["switch_bytes"] > 0
        assert s["datapath"] == "udp" and s["k"] == 256
        assert s["fallbacks"] == 0 and s["fallback_reasons"] == {}
        assert "not a swml group" in r["stats_of_gloo"]
        if r["rank"] % PER_HOST == 0:
            assert s["packets"] > 0 and s["retransmissions"] >= 0
        else:
            assert s["packets"] is None


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(RANK_DEADLINE_S - 10, exit=True)
    _res = _rank_main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
    print("RESULT " + json.dumps(_res), flush=True)
