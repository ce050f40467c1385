"""The `swml` backend keeps training when its boxes are lost
(torch/box_failover.py; docs/pytorch.md, "A lost box"): 2 ranks, 2 boxes.

The ranks (`python tests/lab/test_torch_box_lost.py RANK MASTER SWITCHES
DIR`) all_reduce a tensor a step; the driver takes box 1's link down once
they stream (every rank warns, naming it, and goes on through box 0), then
box 0's (they go on through Gloo), then brings both back (at the next
look, every SWML_BOX_RETRY_CALLS calls, both serve again). Every step's
result is the same on both ranks, bit for bit, and the float sum within
the quantization's bound; each rank's warning came within 2 s of the link
going down.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from box_lost_lab import (
    AFTER_CHANGE,
    MAX_STEPS,
    NOTICED_S,
    RETRY_CALLS,
    inputs,
    join_swml,
    lost_warnings,
    record_warnings,
    run_losing_boxes,
)

MASTER_PORT = 29611
N = 4096 * 8              # floats a step
DEADLINE_S = 150


# ------------------------------------------------------------------ rank side

def _rank_main(rank: int, master: str, switches: str, marks: Path) -> dict:
    import hashlib

    import torch
    import torch.distributed as dist

    said = record_warnings()
    swml = join_swml(rank, 2, master, MASTER_PORT, switches)
    failover = swml.failover
    steps, phase, phase_at = [], 0, 0
    for step in range(MAX_STEPS):
        x = torch.from_numpy(inputs(rank, step, N))
        dist.all_reduce(x, group=swml)
        want = inputs(0, step, N).astype(np.float64) + inputs(1, step, N)
        steps.append({"sha": hashlib.sha1(x.numpy().tobytes()).hexdigest(),
                      "err": float(np.max(np.abs(x.numpy() - want))),
                      "boxes": len(failover.boxes), "gen": failover.generation,
                      "t": round(time.time(), 3)})
        # The phases follow the group's generation: the same call on every rank.
        if phase < failover.generation:
            phase, phase_at = failover.generation, step
        if step - phase_at == AFTER_CHANGE and rank == 0:
            (marks / f"phase{phase}").touch()
        if phase >= 3 and len(failover.boxes) == 2 and step - phase_at >= AFTER_CHANGE:
            break
        time.sleep(0.01)
    dist.destroy_process_group()
    return {"rank": rank, "steps": steps, "warnings": said}


# ----------------------------------------------------------------- pytest side

def test_training_goes_on_without_lost_boxes_and_takes_them_back(tmp_path):
    pytest.importorskip("torch", reason="PyTorch is an optional extra: pip install -e '.[torch]'")
    from requires import NO_LAB

    if NO_LAB:
        pytest.skip(f"lab tests: {NO_LAB}")
    ranks, downs, addresses = run_losing_boxes(__file__, tmp_path, 2, 1, DEADLINE_S,
                                               RETRY_CALLS)
    changes = [(s["gen"], s["boxes"], s["t"]) for i, s in enumerate(ranks[0]["steps"])
               if i == 0 or s["gen"] != ranks[0]["steps"][i - 1]["gen"]]
    print(f"[box lost] generations (gen, boxes, time): {changes}; links down at {downs}")
    a, b = ranks[0]["steps"], ranks[1]["steps"]
    assert len(a) == len(b) and len(a) < MAX_STEPS, (len(a), len(b))
    for step, (x, y) in enumerate(zip(a, b)):
        assert x["sha"] == y["sha"], f"step {step}: the ranks' results differ"
        assert x["err"] < 1e-4, (step, x)       # float32 sums, quantized or Gloo's
    path = [s["boxes"] for s in a]
    assert path[0] == 2 and 1 in path and 0 in path and path[-1] == 2, path
    for r in ranks:
        lost_warnings(r, addresses, downs, NOTICED_S, "box lost")


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(DEADLINE_S - 10, exit=True)
    _res = _rank_main(int(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]))
    print("RESULT " + json.dumps(_res), flush=True)
