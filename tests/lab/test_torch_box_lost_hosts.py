"""The `swml` backend keeps training when its boxes are lost, with two ranks
a host (torch/box_failover.py among the hosts' leaders, torch/host_notices.py;
docs/pytorch.md, "A lost box"): 2 hosts x 2 ranks, 2 boxes.

The ranks (`python tests/lab/test_torch_box_lost_hosts.py RANK MASTER
SWITCHES DIR`) all_reduce a tensor a step. The driver takes box 1's link
down once they stream (every rank warns within 2 s, the leaders through
their failover, the others with their leader's words, and the calls go on
through box 0), then box 0's (the leaders go on through a Gloo group of
their own: the local reduce and share go on), then brings both back (both
serve again at the next look, every SWML_BOX_RETRY_CALLS calls). Every
step's result is the same on every rank, bit for bit, and the float sum
within the quantization's bound. The tensor's last element is rank 0's
word to stop, so that every rank stops after the same step.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import box_lost_lab as lab_side
from requires import needs_lab

MASTER_PORT = 29613
HOSTS, PER_HOST = 2, 2
WORLD = HOSTS * PER_HOST
N = 4096 * 4              # floats a step, and the word to stop
DEADLINE_S = 180


# ------------------------------------------------------------------ rank side

def _rank_main(rank: int, master: str, switches: str, marks: Path) -> dict:
    import hashlib

    import torch
    import torch.distributed as dist

    said = lab_side.record_warnings()
    swml = lab_side.join_swml(rank, WORLD, master, MASTER_PORT, switches)
    failover = swml.failover        # a leader's BoxFailover; the others' NoticeListener
    leader = rank % PER_HOST == 0
    steps, phase, phase_at, stop = [], 0, 0, False
    for step in range(lab_side.MAX_STEPS):
        x = torch.from_numpy(lab_side.inputs(rank, step, N))
        x[-1] = float(stop) if rank == 0 else 0.0
        dist.all_reduce(x, group=swml)
        want_sum = sum(lab_side.inputs(r, step, N)[:-1].astype(np.float64) for r in range(WORLD))
        steps.append({"sha": hashlib.sha1(x.numpy().tobytes()).hexdigest(),
                      "err": float(np.max(np.abs(x.numpy()[:-1] - want_sum))),
                      "boxes": len(failover.boxes) if leader else None,
                      "t": round(time.time(), 3)})
        if x[-1].item() > 0.5:
            break
        if rank == 0:       # the phases follow the leaders' generation
            if phase < failover.generation:
                phase, phase_at = failover.generation, step
            if step - phase_at == lab_side.AFTER_CHANGE:
                (marks / f"phase{phase}").touch()
            settled = step - phase_at >= lab_side.AFTER_CHANGE
            stop = phase >= 3 and len(failover.boxes) == 2 and settled
        time.sleep(0.01)
    dist.destroy_process_group()
    return {"rank": rank, "steps": steps, "warnings": said}


# ----------------------------------------------------------------- pytest side

@needs_lab
def test_two_ranks_a_host_go_on_without_lost_boxes_and_take_them_back(tmp_path):
    pytest.importorskip("torch", reason="PyTorch is an optional extra: pip install -e '.[torch]'")
    ranks, downs, addresses = lab_side.run_losing_boxes(__file__, tmp_path, HOSTS, PER_HOST,
                                                        DEADLINE_S, lab_side.RETRY_CALLS)
    first = ranks[0]["steps"]
    assert len(first) < lab_side.MAX_STEPS
    for r in ranks[1:]:
        assert len(r["steps"]) == len(first), [len(x["steps"]) for x in ranks]
        for step, (x, y) in enumerate(zip(first, r["steps"])):
            assert x["sha"] == y["sha"], f"step {step}: rank {r['rank']}'s result differs"
    for step, s in enumerate(first):
        assert s["err"] < 1e-4, (step, s)       # float32 sums, quantized or Gloo's
    for leader in (0, PER_HOST):
        path = [s["boxes"] for s in ranks[leader]["steps"]]
        assert path[0] == 2 and 1 in path and 0 in path and path[-1] == 2, path
    for r in ranks:
        lost = lab_side.lost_warnings(r, addresses, downs, lab_side.NOTICED_S, "box lost, 2 a host")
        assert "host leaders" in lost[0][1], lost
        if r["rank"] % PER_HOST:
            assert all("told by this host's leader" in m for _, m in lost), lost


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(DEADLINE_S - 10, exit=True)
    _res = _rank_main(int(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]))
    print("RESULT " + json.dumps(_res), flush=True)
