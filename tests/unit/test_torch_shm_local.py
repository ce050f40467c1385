"""The shared-memory local group of one host's ranks (switchml_xdp/torch/shm_local.py),
without a switch: processes of this machine that meet through a FileStore
(switchml_xdp/bench/local_procs.py). The two-level path through the switch is
tests/test_torch_hosts.py's."""
from __future__ import annotations

import os
import secrets
import time

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is an optional extra: pip install -e '.[torch]' (torch==2.13.0)")

from switchml_xdp.bench.local_procs import run_on_host  # noqa: E402 - after the importorskip
from switchml_xdp.torch.shm_segment import NAME_PREFIX, SHM_DIR  # noqa: E402 - after the importorskip

SMALL_REGION = 4096            # two slots of 2 KiB: 512 float32 elements a chunk
SIZES = (0, 1, 511, 512, 513, 5000)
OPS = {"SUM": torch.add, "MIN": torch.minimum, "MAX": torch.maximum}


def _input(rank: int, n: int, dtype: torch.dtype, case: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * case + rank)
    x = torch.randn(n, generator=g) * 1000
    return x.to(dtype)


# ------------------------------------------------------------------ rank side

def _reduce_all_cases(group, rank: int, n_ranks: int) -> list:
    """Every op, dtype and size against the same reduction done here (the
    float32 sum in rank order, as the leader adds); the cases that differ."""
    wrong, case = [], 0
    for dtype in (torch.float32, torch.int32):
        for n in SIZES:
            for op, fn in OPS.items():
                case += 1
                x = _input(rank, n, dtype, case)
                want = _input(0, n, dtype, case)
                for r in range(1, n_ranks):
                    want = fn(want, _input(r, n, dtype, case))
                group.reduce_to_leader(x, op)
                group.share(x, None)
                if not torch.equal(x, want):
                    wrong.append((str(dtype), n, op))
    return wrong


def _all_cases_through_shm(group, rank: int, n_ranks: int) -> dict:
    return {"wrong": _reduce_all_cases(group, rank, n_ranks), "transport": group.transport,
            "segment": group.segment_name, "chunks": group.chunks, "calls": group.calls,
            "name_left": os.path.exists(os.path.join(SHM_DIR, group.segment_name))}


def _all_cases_and_transport(group, rank: int, n_ranks: int) -> tuple[list, str]:
    return _reduce_all_cases(group, rank, n_ranks), group.transport


def _failures(group, rank: int) -> dict:
    """A leader's error in share (after a chunked reduce), then a call the
    ranks disagree on; the group goes on after each."""
    out = {}

    def ok_call() -> bool:
        x = torch.full((3000,), float(rank + 1))
        group.reduce_to_leader(x, "SUM")
        group.share(x, None)
        return bool(torch.equal(x, torch.full((3000,), 6.0)))

    x = torch.ones(3000)
    try:
        group.reduce_to_leader(x, "SUM")
        group.share(x, ValueError("boom") if rank == 0 else None)
        out["leader_error"] = "no error"
    except Exception as e:  # noqa: BLE001 - reported
        out["leader_error"] = f"{type(e).__name__}: {e}"
    out["ok_after_error"] = ok_call()
    try:
        y = torch.ones(1000 + rank)             # rank 2 has 1002 elements in 2 chunks
        group.reduce_to_leader(y, "SUM")
        group.share(y, None)
        out["disagreement"] = "no error"
    except Exception as e:  # noqa: BLE001 - reported
        out["disagreement"] = f"{type(e).__name__}: {e}"
    out["ok_after_disagreement"] = ok_call()
    return out


def _late_rank(group, rank: int) -> str:
    """Rank 1 comes 3 s late to a group whose timeout is 1 s."""
    if rank == 1:
        time.sleep(3)
    x = torch.ones(10)
    group.reduce_to_leader(x, "SUM")
    group.share(x, None)
    return "no error"


def _leader_exits(group, rank: int) -> str:
    if rank == 0:
        os._exit(0)
    start = time.monotonic()
    x = torch.ones(10)
    try:
        group.reduce_to_leader(x, "SUM")
        group.share(x, None)
    except Exception as e:  # noqa: BLE001 - reported
        return f"{time.monotonic() - start:.1f} s {type(e).__name__}: {e}"
    return "no error"


# ----------------------------------------------------------------- pytest side

def test_sum_min_max_of_float32_and_int32_in_chunks():
    stale = os.path.join(SHM_DIR, NAME_PREFIX + secrets.token_hex(8))
    with open(stale, "wb") as f:                  # as a crashed run would leave one
        f.write(b"\0" * 64)
    try:
        res = run_on_host(_all_cases_through_shm, 3, (3,), region_bytes=SMALL_REGION)
    finally:
        os.unlink(stale)
    assert len({r["segment"] for r in res}) == 1
    for r in res:
        assert r["wrong"] == [], r["wrong"]
        assert r["transport"] == "shm"
        assert r["calls"] == 2 * len(SIZES) * len(OPS)
        assert r["chunks"] > r["calls"]        # 513 and 5000 elements take several chunks
        assert not r["name_left"], "the name stays in /dev/shm after every rank mapped it"
    assert not os.path.exists(os.path.join(SHM_DIR, res[0]["segment"]))


def test_a_leader_error_and_a_disagreement_raise_on_every_rank_and_the_group_goes_on():
    res = run_on_host(_failures, 3, region_bytes=SMALL_REGION)
    assert res[0]["leader_error"] == "ValueError: boom"
    for r in res[1:]:
        assert r["leader_error"] == ("RuntimeError: the host's leader (rank 0) failed this "
                                     "call: ValueError: boom")
    assert res[0]["disagreement"].startswith("LocalGroupError: the ranks of a host disagree")
    assert "rank 1 (3, 1001, 1, 1)" in res[0]["disagreement"], res[0]["disagreement"]
    for r in res[1:]:
        assert r["disagreement"].startswith("RuntimeError: the host's leader (rank 0) failed "
                                            "this call: the ranks of a host disagree")
    for r in res:
        assert r["ok_after_error"] and r["ok_after_disagreement"], r


def test_a_rank_that_does_not_come_times_out_naming_it():
    res = run_on_host(_late_rank, 2, timeout_s=1.0, expect_errors=True)
    assert res[0].startswith("LocalGroupError: rank 0 waited 1.0 s for its part of local call 1: "
                             "rank 1 of this host did not come within 1 s"), res[0]
    assert res[1].startswith("RuntimeError: the host's leader (rank 0) failed this call: "
                             "rank 0 waited"), res[1]


def test_an_exited_leader_is_noticed_before_the_timeout():
    res = run_on_host(_leader_exits, 2, timeout_s=60.0, expect_errors=True)
    assert "without a result" in res[0]
    took, _, error = res[1].partition(" s ")
    assert error.startswith("LocalGroupError: rank 1 waited") and error.endswith(
        "the host's leader (rank 0) has exited"), res[1]
    assert float(took) < 5.0


def test_without_room_for_the_segment_the_host_falls_back_to_loopback():
    """A region of 1 TiB a rank does not fit in /dev/shm: the leader cannot
    create the segment, and every rank of the host takes Gloo on loopback."""
    res = run_on_host(_all_cases_and_transport, 2, (2,), region_bytes=1 << 40)
    for wrong, transport in res:
        assert wrong == []
        assert transport == "gloo-loopback"
