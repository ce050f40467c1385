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

MASTER_PORT = 29611
N = 4096 * 8              # floats a step
RETRY_CALLS = 20          # SWML_BOX_RETRY_CALLS
MAX_STEPS = 4000
AFTER_CHANGE = 25         # steps after a change before the next phase
NOTICED_S = 2.0
DEADLINE_S = 150


def inputs(rank: int, step: int) -> np.ndarray:
    return np.random.default_rng([rank, step]).standard_normal(N).astype(np.float32)


# ------------------------------------------------------------------ rank side

def _rank_main(rank: int, master: str, switches: str, marks: Path) -> dict:
    import datetime
    import hashlib

    import torch
    import torch.distributed as dist

    import switchml_xdp.torch as swt
    from box_lost_lab import record_warnings

    torch.set_num_threads(1)
    said = record_warnings()
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{MASTER_PORT}", rank=rank,
                            world_size=2)
    swml = dist.new_group(backend="swml", timeout=datetime.timedelta(seconds=30),
                          pg_options=swt.SwmlOptions(switch=switches, backend="udp"))
    failover = swml.failover
    steps, phase, phase_at = [], 0, 0
    for step in range(MAX_STEPS):
        x = torch.from_numpy(inputs(rank, step))
        dist.all_reduce(x, group=swml)
        want = inputs(0, step).astype(np.float64) + inputs(1, step)
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
    from box_lost_lab import LinkDriver
    from lab_jobs import rank_results
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.cluster import SwitchProcess

    with Lab(workers=2, boxes=2) as lab, SwitchProcess(lab, box=0), SwitchProcess(lab, box=1):
        switches = ",".join(b.ip for b in lab.switches)
        placements = [(lab.workers[r], [sys.executable, __file__, str(r), lab.workers[0].ip,
                                        switches, str(tmp_path)]) for r in range(2)]
        driver = LinkDriver(lab, tmp_path, DEADLINE_S)
        driver.start()
        try:
            ranks = rank_results(lab, placements, DEADLINE_S,
                                 {"SWML_BOX_RETRY_CALLS": str(RETRY_CALLS)})
        finally:
            driver.join()
    downs = driver.downs
    changes = [(s["gen"], s["boxes"], s["t"]) for i, s in enumerate(ranks[0]["steps"])
               if i == 0 or s["gen"] != ranks[0]["steps"][i - 1]["gen"]]
    print(f"[box lost] generations (gen, boxes, time): {changes}; links down at {downs}")
    assert not driver.error, (driver.error, [(r["rank"], len(r["steps"]), r["warnings"])
                                             for r in ranks])
    a, b = ranks[0]["steps"], ranks[1]["steps"]
    assert len(a) == len(b) and len(a) < MAX_STEPS, (len(a), len(b))
    for step, (x, y) in enumerate(zip(a, b)):
        assert x["sha"] == y["sha"], f"step {step}: the ranks' results differ"
        assert x["err"] < 1e-4, (step, x)       # float32 sums, quantized or Gloo's
    path = [s["boxes"] for s in a]
    assert path[0] == 2 and 1 in path and 0 in path and path[-1] == 2, path
    addresses = [box.ip for box in lab.switches]
    for r in ranks:
        lost = [(t, m) for t, m in r["warnings"] if "lost at swml call" in m]
        assert len(lost) == 2, r["warnings"]
        assert addresses[1] in lost[0][1] and addresses[0] in lost[1][1], lost
        assert "gloo" in lost[1][1]
        assert any("answer every rank again" in m for _, m in r["warnings"]), r["warnings"]
        for (t, m), box in zip(lost, ("box 1", "box 0")):
            print(f"[box lost] rank {r['rank']} warned {(t - downs[box]) * 1000:.0f} ms after "
                  f"{box}'s link went down: {m}")
            assert t - downs[box] < NOTICED_S, (r["rank"], box, t - downs[box])


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(DEADLINE_S - 10, exit=True)
    _res = _rank_main(int(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]))
    print("RESULT " + json.dumps(_res), flush=True)
