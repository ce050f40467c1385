"""The C engine's owner byte of a reduce_scatter's DATA packets
(worker/stream.h, swml_shard_owner) against the rule stated element by
element: packet p names 1 + the rank whose shard holds every element of the
block it carries, or 0. The comparison with its Python twin,
plans.shard_owners, lives with the plans' tests."""
from __future__ import annotations

import numpy as np
import pytest

_engine = pytest.importorskip("switchml_xdp._engine", reason="the C engine is not built")


def owner_by_elements(p: int, n: int, k: int, lag: int, shard: int, world: int) -> int:
    """The rule read literally: the set of ranks whose shard [r*shard,
    (r+1)*shard) holds some element of the block; one rank below world: its
    1 + rank, else 0 (no shard, a straddling block, a block past the last
    rank's shard, or one of the lag packets that carry no block)."""
    if not shard or p < lag:
        return 0
    elements = np.arange((p - lag) * k, min((p - lag + 1) * k, n))
    if not elements.size:
        return 0
    ranks = set((elements // shard).tolist())
    if len(ranks) != 1:
        return 0
    (rank,) = ranks
    return rank + 1 if rank < world else 0


def random_calls(seed: int, count: int):
    """(n, k, lag, shard, world) of random calls: shards of one element to
    several packets, aligned to k or not, some past the end of the array."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        k = int(rng.choice([1, 3, 8, 256, 360]))
        world = int(rng.integers(1, 65))
        shard = int(rng.choice([0, 1, max(k - 1, 1), k, 2 * k, int(rng.integers(1, 5 * k + 2))]))
        n = int(rng.integers(1, max(2, shard * world + 2 * k)))
        lag = int(rng.choice([0, min(int(rng.integers(1, 9)), -(-n // k))]))
        yield n, k, lag, shard, world


@pytest.mark.parametrize("seed", range(6))
def test_shard_owner_is_the_rule_element_by_element(seed):
    for n, k, lag, shard, world in random_calls(seed, 300):
        got = [_engine.shard_owner(p, n, k, lag, shard, world) for p in range(-(-n // k) + lag)]
        want = [owner_by_elements(p, n, k, lag, shard, world) for p in range(len(got))]
        assert got == want, (n, k, lag, shard, world)


def test_reduce_scatter_blocks_aligned_to_k_each_have_their_rank():
    k, world = 256, 4
    shard = 3 * k
    owners = [_engine.shard_owner(p, shard * world, k, 0, shard, world) for p in range(12)]
    assert owners == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    # a quantized float32 sum: the first lag packets carry no block
    lag = 5
    owners = [_engine.shard_owner(p, shard * world, k, lag, shard, world) for p in range(12 + lag)]
    assert owners == [0] * lag + [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]


def test_no_shard_and_bad_arguments():
    assert _engine.shard_owner(0, 1000, 256, 0, 0, 2) == 0  # no shard: nobody owns
    assert _engine.shard_owner(1, 1000, 256, 0, 500, 2) == 0  # [256, 512) straddles 500
    assert _engine.shard_owner(9, 1000, 256, 0, 500, 2) == 0  # past the last element
    with pytest.raises(ValueError, match="world"):
        _engine.shard_owner(0, 1000, 256, 0, 500, 65)
    with pytest.raises(ValueError, match="k must be positive"):
        _engine.shard_owner(0, 1000, 0, 0, 500, 2)
