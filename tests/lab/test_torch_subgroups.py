"""Subgroups of the `swml` backend (docs/pytorch.md, "Subgroups").

Two lab hosts run two ranks each, as `torchrun --nproc_per_node=2` would, with
`swml` as the default backend. Overlapping subgroups (one rank a host, several
ranks on a host, every rank) each get their own switch job and their own UDP
port, chosen by the group; all_reduce in each is exact (int32); groups are
destroyed (job left, port free, nothing in /dev/shm) and made again, in
another order. All of it once with one lane a Worker and once with two
($SWML_LANES=2: each group holds a block of ports, and no two groups' blocks
overlap on a host). A switch with slots for one job only: the subgroup that cannot
start raises the same error on each of its members, and WORLD goes on. Run as
a script per rank (`python tests/lab/test_torch_subgroups.py SCENARIO RANK
MASTER SWITCH`); the tests read its JSON line.
"""
from __future__ import annotations

import json
import os
import socket
import sys

import pytest

from lab_jobs import rank_results

torch = pytest.importorskip(
    "torch", reason="PyTorch is an optional extra: pip install -e '.[torch]' (torch==2.13.0)")

from two_level import HOSTS, PER_HOST, RANK_DEADLINE_S, WORLD  # noqa: E402 - after the importorskip

MASTER_PORT = 29561
SHM_BYTES = 8192
N = 1000
# Made in this order on every rank (torch requires one order); the second
# round makes them again, in another order, after destroying the first's.
GROUPS = {"pair": [0, 2], "three": [0, 1, 3], "host1_and_1": [1, 2, 3]}
SECOND_ORDER = ["host1_and_1", "pair", "three"]


# ------------------------------------------------------------------ rank side

def _exact_sum(group, members: list[int], rank: int) -> bool:
    """int32 all_reduce in `group`: rank r gives (r + 1) * arange(N)."""
    import torch.distributed as dist

    x = torch.arange(N, dtype=torch.int32) * (rank + 1)
    dist.all_reduce(x, group=group)
    return bool(torch.equal(x, torch.arange(N, dtype=torch.int32) * sum(r + 1 for r in members)))


def _port_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _describe(group) -> dict:
    w = group.worker
    return {"job": w.info.name if w else None, "port": w.info.port if w else None,
            "lanes": w.lanes if w else None, "segment": getattr(group.local, "segment_name", None)}


def _round(order: list[str], rank: int, res: dict, tag: str) -> dict:
    """Make the groups in `order`, all_reduce in each and in WORLD, in one
    order on every rank (a rank skips the groups it is not in)."""
    import torch.distributed as dist

    made = {name: dist.new_group(GROUPS[name]) for name in order}
    for name in order + order:
        if rank in GROUPS[name]:
            res[f"{tag}/{name}"] = _exact_sum(made[name], GROUPS[name], rank)
        res[f"{tag}/world-after-{name}"] = _exact_sum(None, list(range(WORLD)), rank)
    res[f"{tag}/groups"] = {n: _describe(g) for n, g in made.items() if rank in GROUPS[n]}
    return made


def _subgroups(rank: int, switch: str) -> dict:
    import torch.distributed as dist

    res: dict = {"rank": rank, "lanes_asked": int(os.environ.get("SWML_LANES", "1"))}
    made = _round(list(GROUPS), rank, res, "first")
    for name in list(GROUPS):
        dist.destroy_process_group(made[name])
    gone = res["first/groups"]
    res["freed"] = {n: (g["port"] is None or all(_port_free(g["port"] + q) for q in range(g["lanes"]))) and
                    (g["segment"] is None or not os.path.exists(f"/dev/shm/{g['segment']}"))
                    for n, g in gone.items()}
    res["jobs_left"] = _jobs_left(switch, [g["job"] for g in gone.values() if g["job"]])
    _round(SECOND_ORDER, rank, res, "second")
    return res


def _jobs_left(switch: str, jobs: list[str]) -> bool:
    """None of `jobs` is on the switch any more (it takes a moment to notice)."""
    import time

    from switchml_xdp.client.control import ControlClient

    deadline = time.monotonic() + 10
    while True:
        c = ControlClient(switch)
        try:
            names = {j["name"] for j in c.status()["jobs"]}
        finally:
            c.close()
        if not names & set(jobs) or time.monotonic() > deadline:
            return not names & set(jobs)
        time.sleep(0.2)


def _no_slots(rank: int, switch: str) -> dict:
    """WORLD holds the switch's only job's slots: new_group([0, 2]) cannot start."""
    import torch.distributed as dist

    res: dict = {"rank": rank}
    try:
        g = dist.new_group([0, 2])
        res["error"] = None if rank in (0, 2) else ("non-member" if g is dist.GroupMember.NON_GROUP_MEMBER
                                                    else "a group")
    except Exception as e:  # noqa: BLE001 - reported
        res["error"] = f"{type(e).__name__}: {e}"
    res["world_after"] = _exact_sum(None, list(range(WORLD)), rank)
    return res


def _rank_main(scenario: str, rank: int, master: str, switch: str) -> dict:
    import torch.distributed as dist

    import switchml_xdp.torch as swt

    torch.set_num_threads(1)
    dist.init_process_group("swml", init_method=f"tcp://{master}:{MASTER_PORT}", rank=rank,
                            world_size=WORLD, pg_options=swt.SwmlOptions(
                                switch=switch, backend="udp", shm_bytes=SHM_BYTES))
    res = {"subgroups": _subgroups, "no_slots": _no_slots}[scenario](rank, switch)
    dist.destroy_process_group()
    return res


# ----------------------------------------------------------------- pytest side

def _placements(lab, hosts, scenario: str) -> list:
    return [(hosts[rank // PER_HOST], [sys.executable, __file__, scenario, str(rank), hosts[0].ip,
                                       lab.switch.ip]) for rank in range(WORLD)]


@pytest.fixture(scope="module", params=[1, 2], ids=["one-lane", "two-lanes"])
def subgroups(request, lab8, switch):
    hosts = lab8.workers[4:4 + HOSTS]
    return rank_results(lab8, _placements(lab8, hosts, "subgroups"), RANK_DEADLINE_S,
                        env={"SWML_LANES": str(request.param)})


def test_every_subgroup_and_world_sum_exactly(subgroups):
    for r in subgroups:
        for tag in ("first", "second"):
            for name, members in GROUPS.items():
                if r["rank"] in members:
                    assert r[f"{tag}/{name}"] is True, (r["rank"], tag, name)
                assert r[f"{tag}/world-after-{name}"] is True, (r["rank"], tag, name)


def test_each_group_its_own_job_and_port(subgroups):
    """A host's leaders of different groups hold different ports (with
    lanes, blocks that do not overlap); the ports were picked by the groups
    (the default one is WORLD's)."""
    for tag in ("first", "second"):
        jobs, by_host = set(), {}
        for r in subgroups:
            for g in r[f"{tag}/groups"].values():
                if g["job"]:
                    jobs.add(g["job"])
                    assert g["lanes"] == r["lanes_asked"], (tag, g)
                    block = range(g["port"], g["port"] + g["lanes"])
                    by_host.setdefault(r["rank"] // PER_HOST, []).extend(block)
        assert len(jobs) == len(GROUPS), jobs
        for host, ports in by_host.items():
            assert len(ports) == len(set(ports)), (tag, host, ports)


def test_destroyed_groups_leave_the_switch_and_free_ports_and_shm(subgroups):
    for r in subgroups:
        assert all(r["freed"].values()), r["freed"]
        assert r["jobs_left"]


@pytest.mark.lab_workers(HOSTS)
def test_a_group_without_slots_fails_alike_on_every_member(fresh_lab):
    from switchml_xdp.lab.cluster import SwitchProcess

    with SwitchProcess(fresh_lab, ["--slots", "8", "--job-slots", "8", "--lease", "2"]):
        res = rank_results(fresh_lab, _placements(fresh_lab, fresh_lab.workers[:HOSTS], "no_slots"),
                           RANK_DEADLINE_S)
    errors = {r["rank"]: r["error"] for r in res}
    assert errors[1] == errors[3] == "non-member"
    assert errors[0] and errors[0] == errors[2], errors
    assert "slot" in errors[0] and "48864" not in errors[0], errors[0]
    assert all(r["world_after"] for r in res)


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(RANK_DEADLINE_S - 10, exit=True)
    _res = _rank_main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
    print("RESULT " + json.dumps(_res), flush=True)
