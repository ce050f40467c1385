"""Nothing hangs: the `swml` backend's waits and failures on 2 lab hosts x 2
ranks (docs/pytorch.md, "When a call fails").

Each scenario runs as a script per rank (`python tests/lab/test_torch_failures.py
SCENARIO RANK MASTER SWITCH`), as `torchrun --nproc_per_node=2` would on two
hosts, with a short process-group timeout; the tests read each rank's JSON line:

- p2p: send/recv then barrier; an isend that its peer receives only after a
  barrier; async Gloo and switch collectives with an async barrier between
  them; a ring of isend/recv across switch all_reduces.
- disagree: the ranks of one host disagree on a length (a non-leader, then a
  leader, then the other host's non-leader): every rank of both hosts raises,
  naming the call, and the next call works on every rank.
- kill_member / kill_leader: a rank exits without a word (os._exit, as a kill
  does: no goodbye to its host or the switch); every other rank raises within
  the timeout, on that call and on the next.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time

import pytest

from lab_jobs import rank_results

torch = pytest.importorskip(
    "torch", reason="PyTorch is an optional extra: pip install -e '.[torch]' (torch==2.13.0)")

from two_level import HOSTS, PER_HOST, WORLD  # noqa: E402 - after the importorskip

SCENARIOS = ("p2p", "disagree", "kill_member", "kill_leader")
MASTER_PORTS = {s: 29581 + i for i, s in enumerate(SCENARIOS)}
TIMEOUT_S = 6.0             # the swml group's timeout
DEADLINE_S = 90             # a rank still running then has hung
SHM_BYTES = 8192


# ------------------------------------------------------------------ rank side

def _swml_group(rank: int, master: str, switch: str, scenario: str):
    import torch.distributed as dist

    import switchml_xdp.torch as swt

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{MASTER_PORTS[scenario]}",
                            rank=rank, world_size=WORLD)
    return dist.new_group(backend="swml", timeout=datetime.timedelta(seconds=TIMEOUT_S),
                          pg_options=swt.SwmlOptions(switch=switch, backend="udp",
                                                     shm_bytes=SHM_BYTES))


def _attempt(fn) -> dict:
    """fn()'s error (type: message) or None, and how long it took."""
    t0 = time.monotonic()
    try:
        fn()
        error = None
    except Exception as e:  # noqa: BLE001 - reported
        error = f"{type(e).__name__}: {e}"
    return {"error": error, "s": round(time.monotonic() - t0, 2)}


def _p2p(rank: int, swml) -> dict:
    import torch.distributed as dist

    res: dict = {}
    base = torch.arange(4, dtype=torch.float32)
    # send/recv between two ranks, then a barrier of all four
    if rank == 0:
        dist.send(base * 7, 1, group=swml)
    elif rank == 1:
        got = torch.zeros(4)
        dist.recv(got, 0, group=swml)
        res["recv"] = got.tolist()
    dist.barrier(group=swml)
    res["barrier_after_send_recv"] = True
    # an isend its peer receives only after the barrier: barrier must not wait for it
    if rank == 2:
        pending = dist.isend(base * 3, 3, group=swml)
    dist.barrier(group=swml)
    if rank == 3:
        got = torch.zeros(4)
        dist.recv(got, 2, group=swml)
        res["late_recv"] = got.tolist()
    if rank == 2:
        pending.wait()
    # async Gloo (all_gather) and switch (all_reduce) work, an async barrier after
    outs = [torch.zeros(2) for _ in range(WORLD)]
    gathered = dist.all_gather(outs, torch.full((2,), float(rank)), group=swml, async_op=True)
    summed = torch.ones(1000)
    reduced = dist.all_reduce(summed, group=swml, async_op=True)
    dist.barrier(group=swml, async_op=True).wait()
    res["done_at_barrier"] = [gathered.is_completed(), reduced.is_completed()]
    gathered.wait()
    reduced.wait()
    res["gathered"] = [o[0].item() for o in outs]
    res["summed"] = [summed.min().item(), summed.max().item()]
    # a ring of isend/recv across switch all_reduces
    ring = dist.isend(torch.full((3,), float(rank)), (rank + 1) % WORLD, group=swml)
    mid = torch.full((10,), 1.0)
    dist.all_reduce(mid, group=swml)
    got = torch.zeros(3)
    dist.recv(got, (rank - 1) % WORLD, group=swml)
    ring.wait()
    dist.barrier(group=swml)
    res["ring"] = got[0].item()
    res["mid"] = mid[0].item()
    return res


def _disagree(rank: int, swml) -> dict:
    import torch.distributed as dist

    rounds = []
    for odd in (1, 0, 3):       # host 0's non-leader, host 0's leader, host 1's non-leader
        bad = torch.ones(100 + (rank == odd))
        failed = _attempt(lambda b=bad: dist.all_reduce(b, group=swml))
        after = torch.full((10,), float(rank + 1))
        nxt = _attempt(lambda a=after: dist.all_reduce(a, group=swml))
        nxt["value"] = after[0].item()
        rounds.append({"odd": odd, "failed": failed, "next": nxt})
    barrier = _attempt(lambda: dist.barrier(group=swml))
    return {"rounds": rounds, "barrier": barrier}


def _kill(rank: int, swml, victim: int) -> dict:
    import torch.distributed as dist

    first = torch.ones(1000)
    dist.all_reduce(first, group=swml)
    if rank == victim:
        print("RESULT " + json.dumps({"rank": rank, "victim": True}), flush=True)
        os._exit(0)
    res = {"first": first[0].item(),
           "call": _attempt(lambda: dist.all_reduce(torch.ones(1000), group=swml)),
           "next": _attempt(lambda: dist.barrier(group=swml))}
    # stay a while: a survivor's exit must not be what fails the others' calls
    time.sleep(TIMEOUT_S + 3)
    return res


def _rank_main(scenario: str, rank: int, master: str, switch: str) -> dict:
    swml = _swml_group(rank, master, switch, scenario)
    if scenario == "p2p":
        res = _p2p(rank, swml)
    elif scenario == "disagree":
        res = _disagree(rank, swml)
    else:
        res = _kill(rank, swml, victim=3 if scenario == "kill_member" else 2)
    res.update(rank=rank, leader=swml.layout.is_leader)
    if not scenario.startswith("kill"):
        import torch.distributed as dist

        dist.destroy_process_group()
    return res


# ----------------------------------------------------------------- pytest side

def _run(lab8, scenario: str) -> list[dict]:
    hosts = lab8.workers[2:2 + HOSTS]
    placements = [(hosts[rank // PER_HOST], [sys.executable, __file__, scenario, str(rank),
                                              hosts[0].ip, lab8.switch.ip])
                  for rank in range(WORLD)]
    return rank_results(lab8, placements, DEADLINE_S)


def test_p2p_mixed_with_switch_collectives_and_barrier(lab8, switch):
    ranks = _run(lab8, "p2p")
    assert ranks[1]["recv"] == [0.0, 7.0, 14.0, 21.0]
    assert ranks[3]["late_recv"] == [0.0, 3.0, 6.0, 9.0]
    for r in ranks:
        assert r["barrier_after_send_recv"]
        assert r["done_at_barrier"] == [True, True], r   # barrier waited for both collectives
        assert r["gathered"] == [0.0, 1.0, 2.0, 3.0]
        assert r["summed"] == [float(WORLD)] * 2
        assert r["ring"] == float((r["rank"] - 1) % WORLD)
        assert r["mid"] == float(WORLD)


def test_a_disagreeing_host_fails_the_call_everywhere_and_the_next_works(lab8, switch):
    ranks = _run(lab8, "disagree")
    for r in ranks:
        for rnd in r["rounds"]:
            failed, nxt = rnd["failed"], rnd["next"]
            assert failed["error"] and "all_reduce" in failed["error"], (r["rank"], rnd)
            assert failed["s"] < TIMEOUT_S, (r["rank"], rnd)
            assert nxt["error"] is None, (r["rank"], rnd)
            assert nxt["value"] == sum(range(1, WORLD + 1)), (r["rank"], rnd)
        assert r["barrier"]["error"] is None, r


@pytest.mark.parametrize("scenario", ["kill_member", "kill_leader"])
def test_a_killed_rank_makes_every_other_rank_raise_within_the_timeout(lab8, switch, scenario):
    victim = 3 if scenario == "kill_member" else 2
    ranks = _run(lab8, scenario)
    for r in ranks:
        if r["rank"] == victim:
            assert r.get("victim"), r
            continue
        assert r["first"] == float(WORLD), r
        for step in ("call", "next"):
            assert r[step]["error"], (r["rank"], step, r[step])
            assert r[step]["s"] <= TIMEOUT_S + 2.0, (r["rank"], step, r[step])


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(DEADLINE_S - 10, exit=True)
    _res = _rank_main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
    print("RESULT " + json.dumps(_res), flush=True)
    if sys.argv[1].startswith("kill"):
        os._exit(0)     # a group with a dead member has nothing left to tear down cleanly
