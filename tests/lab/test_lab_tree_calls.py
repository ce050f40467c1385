"""Calls through a tree of boxes (needs root; docs/scale-out.md, "A tree of
boxes"): every collective the client makes comes out exact through rack
boxes and their parent, multicast and unicast fan-out alike (rack 1's
members keep their ranks in the whole job: 2 and 3, the fan-out's loop over
a rank mask; and the ranks streaming in two lanes to their rack boxes,
whose uplinks stream one); int32 MAX and a reduce_scatter (its owner
cleared on the way up); and precision '16', which cannot go up a tree, is
refused in one line on every rank while the job goes on."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from requires import NO_LAB

if NO_LAB:
    pytest.skip(f"lab tests: {NO_LAB}", allow_module_level=True)

from lab_jobs import skip_without_afxdp
from switchml_xdp.lab.cluster import run_ranks
from switchml_xdp.lab.racks import RacksLab, switches_of_the_racks

SIZE = 4 * 2560   # elements: 40 packets a rank at k=256, divisible by the world


@pytest.mark.parametrize("fanout, backend, lanes", [("multicast", "afxdp", 1), ("unicast", "udp", 1),
                                                    ("multicast", "udp", 2)])
def test_every_call_is_exact_through_the_tree(fanout, backend, lanes):
    from switchml_xdp import Worker

    skip_without_afxdp([backend])
    world = 4
    floats = [np.arange(SIZE, dtype=np.float32) % 31 * (r + 1) - 7 for r in range(world)]
    ints = [np.random.default_rng(r).integers(-2**30, 2**30, SIZE).astype(np.int32)
            for r in range(world)]

    def body(rank, host):
        with Worker(lab.box_of(host).ip, f"calls-{fanout}", rank, world, backend=backend,
                    verbose=False, stall_timeout=30, lanes=lanes) as w:
            with pytest.raises(ValueError, match="precision '16' cannot go through a tree of "
                                                 f"boxes: the rack box {lab.box_of(host).ip}"):
                w.allreduce(floats[rank].copy(), precision="16")
            return (w.allreduce(floats[rank].copy()), w.allreduce(ints[rank].copy(), op="max"),
                    w.reduce_scatter(floats[rank].copy()), w.stats())

    with RacksLab(2, 2, "tree") as lab, contextlib.ExitStack() as stack:
        switches_of_the_racks(stack, lab, ["--fanout", fanout])
        results = run_ranks(lab, lab.workers, body, timeout=120)
    total, top = sum(floats), np.max(ints, axis=0)
    shard = SIZE // world
    for rank, (summed, maxed, scattered, stats) in enumerate(results):
        np.testing.assert_array_equal(summed, total)
        np.testing.assert_array_equal(maxed, top)
        np.testing.assert_array_equal(scattered, total[rank * shard:(rank + 1) * shard])
        # Each RESULT came to its lane's socket: where a lane's went to
        # another's, that one ignores them and the lane resends every packet.
        assert stats["ignored"] == 0, stats
