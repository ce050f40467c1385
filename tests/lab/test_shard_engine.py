"""The afxdp engine's reduce_scatter through a switch with `--fanout unicast`
(docs/protocol.md, "Shards"): every DATA packet names the rank whose shard
holds its block, the switch sends that rank the sum and the others the header
alone. Each rank's shard is the allreduce's, bit for bit; every packet of
another rank's shard completes on a header-only RESULT (counted
`header_only`), which writes nothing: those blocks still hold the rank's own
input. Blocks that straddle two shards come whole to every rank.

A lab and a switch of this module's own: the session's switch runs with the
default (multicast) fan-out.
"""
from __future__ import annotations

import numpy as np
import pytest

from switchml_xdp import quant, quant16

_engine = pytest.importorskip("switchml_xdp._engine", reason="the AF_XDP engine is not built")

from lab_jobs import K, run_job, skip_without_afxdp  # noqa: E402 - after the importorskip
from requires import NO_LAB  # noqa: E402
from switchml_xdp.client.calls import op_code  # noqa: E402

pytestmark = pytest.mark.skipif(NO_LAB is not None, reason=NO_LAB or "")

WORLD = 3
SHARD = 10 * K + 100  # not a multiple of k: some blocks straddle two shards
# (dtype, op, precision): each of the engine's codings
CASES = [("float32", "sum", "32"), ("float32", "sum", "16"), ("int32", "sum", "32"),
         ("float32", "max", "32")]


@pytest.fixture(scope="module")
def lab():
    from switchml_xdp.lab import Lab

    with Lab(workers=WORLD) as lab:
        yield lab


@pytest.fixture(scope="module")
def switch(lab):
    from switchml_xdp.lab.cluster import SwitchProcess

    # Two members a program: the third one's copies go through the fan-out's
    # tail call (xdp/swml_fanout.c, SWML_FANOUT_CHUNK).
    with SwitchProcess(lab, ["--fanout", "unicast"], env={"SWML_FANOUT_CHUNK": "2"}) as sw:
        yield sw


def rank_input(rank: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng([251, rank])
    n = SHARD * WORLD
    if dtype == "int32":
        return rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)  # sums wrap
    scale = (10.0 ** rng.integers(-20, 20, -(-n // K))).repeat(K)[:n]
    return (rng.standard_normal(n) * scale).astype(np.float32)


def reference(xs: list[np.ndarray], op: str, precision: str) -> np.ndarray:
    if xs[0].dtype == np.int32:
        return np.sum(np.stack(xs).astype(np.int64), axis=0).astype(np.uint32).view(np.int32)
    if op == "max":
        return np.max(np.stack(xs), axis=0)
    if precision == "16":
        return quant16.simulate_allreduce16(xs, K)
    return quant.simulate_allreduce(xs, K)


def bits(a: np.ndarray) -> np.ndarray:
    """The 32-bit patterns of a float32 or int32 array, to compare exactly."""
    return np.ascontiguousarray(a).view(np.uint32)


def packet_owners(n: int, dtype: str, op: str, slots: int) -> list[int]:
    """The owner byte of each packet of the call, as the engine writes it."""
    is_float = dtype == "float32"
    packets = _engine.packets(n, K, slots, is_float, op_code(op))
    lag = min(slots, -(-n // K)) if is_float and op == "sum" else 0
    return [_engine.shard_owner(p, n, K, lag, SHARD, WORLD) for p in range(packets)]


@pytest.mark.parametrize("backends", [["afxdp"] * WORLD, ["afxdp", "udp", "afxdp"]],
                         ids=["afxdp", "mixed"])
def test_a_reduce_scatter_on_afxdp_takes_header_only_results_for_other_shards(lab, switch,
                                                                             backends):
    """Mixed with a udp rank, the engine and plans.shard_owners must name the
    same owners: the udp rank's shard and counts are held to the same rule."""
    skip_without_afxdp(backends)

    def body(rank, w):
        out = []
        for dtype, op, precision in CASES:
            before = w.stats()
            x = rank_input(rank, dtype)
            shard = w.reduce_scatter(x, op, precision)
            after = w.stats()
            delta = {key: after[key] - before[key]
                     for key in ("header_only", "results", "retransmissions", "ignored")}
            out.append((x, shard.copy(), delta, w.info.slots))
        return out

    per_rank = run_job(lab, f"shard-{backends[1]}", backends, body)
    for i, (dtype, op, precision) in enumerate(CASES):
        xs = [rank_input(r, dtype) for r in range(WORLD)]
        with np.errstate(invalid="ignore", over="ignore"):
            want = reference(xs, op, precision)
        for rank, results in enumerate(per_rank):
            x, shard, delta, slots = results[i]
            case = f"rank {rank} ({backends[rank]}), {dtype} {op} at {precision} bits"
            mine = slice(rank * SHARD, (rank + 1) * SHARD)
            assert np.array_equal(bits(shard), bits(want[mine])), case
            owners = packet_owners(x.size, dtype, op, slots)
            others = sum(1 for o in owners if o and o != rank + 1)
            assert delta["results"] == len(owners), (case, delta)
            # A header-only RESULT is taken for every packet of another
            # rank's shard, unless a retransmission got the full shadow reply.
            assert 0 < delta["header_only"] <= others, (case, delta, others)
            if not delta["retransmissions"]:
                assert delta["header_only"] == others, (case, delta, others)
            if backends[rank] != "afxdp":
                continue  # the rest of a udp rank's array is unspecified
            # The engine writes nothing for them: those blocks still hold
            # this rank's input.
            lag = len(owners) - -(-x.size // K)
            for p, owner in enumerate(owners):
                if owner and owner != rank + 1:
                    b = slice((p - lag) * K, (p - lag + 1) * K)
                    assert np.array_equal(bits(x[b]), bits(xs[rank][b])), (case, p)
