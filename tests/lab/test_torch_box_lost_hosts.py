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

MASTER_PORT = 29613
HOSTS, PER_HOST = 2, 2
WORLD = HOSTS * PER_HOST
N = 4096 * 4              # floats a step, and the word to stop
RETRY_CALLS = 20          # SWML_BOX_RETRY_CALLS
MAX_STEPS = 4000
AFTER_CHANGE = 25         # steps after a change before the next phase
NOTICED_S = 2.0
DEADLINE_S = 180


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
                            world_size=WORLD)
    swml = dist.new_group(backend="swml", timeout=datetime.timedelta(seconds=30),
                          pg_options=swt.SwmlOptions(switch=switches, backend="udp"))
    failover = swml.failover        # a leader's BoxFailover; the others' NoticeListener
    leader = rank % PER_HOST == 0
    steps, phase, phase_at, stop = [], 0, 0, False
    for step in range(MAX_STEPS):
        x = torch.from_numpy(inputs(rank, step))
        x[-1] = float(stop) if rank == 0 else 0.0
        dist.all_reduce(x, group=swml)
        want_sum = sum(inputs(r, step)[:-1].astype(np.float64) for r in range(WORLD))
        steps.append({"sha": hashlib.sha1(x.numpy().tobytes()).hexdigest(),
                      "err": float(np.max(np.abs(x.numpy()[:-1] - want_sum))),
                      "boxes": len(failover.boxes) if leader else None,
                      "t": round(time.time(), 3)})
        if x[-1].item() > 0.5:
            break
        if rank == 0:       # the phases follow the leaders' generation
            if phase < failover.generation:
                phase, phase_at = failover.generation, step
            if step - phase_at == AFTER_CHANGE:
                (marks / f"phase{phase}").touch()
            stop = phase >= 3 and len(failover.boxes) == 2 and step - phase_at >= AFTER_CHANGE
        time.sleep(0.01)
    dist.destroy_process_group()
    return {"rank": rank, "steps": steps, "warnings": said}


# ----------------------------------------------------------------- pytest side

def test_two_ranks_a_host_go_on_without_lost_boxes_and_take_them_back(tmp_path):
    pytest.importorskip("torch", reason="PyTorch is an optional extra: pip install -e '.[torch]'")
    from requires import NO_LAB

    if NO_LAB:
        pytest.skip(f"lab tests: {NO_LAB}")
    from box_lost_lab import LinkDriver
    from lab_jobs import rank_results
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.cluster import SwitchProcess

    with Lab(workers=HOSTS, boxes=2) as lab, SwitchProcess(lab, box=0), SwitchProcess(lab, box=1):
        switches = ",".join(b.ip for b in lab.switches)
        placements = [(lab.workers[r // PER_HOST], [sys.executable, __file__, str(r),
                                                    lab.workers[0].ip, switches, str(tmp_path)])
                      for r in range(WORLD)]
        driver = LinkDriver(lab, tmp_path, DEADLINE_S)
        driver.start()
        try:
            ranks = rank_results(lab, placements, DEADLINE_S,
                                 {"SWML_BOX_RETRY_CALLS": str(RETRY_CALLS)})
        finally:
            driver.join()
    downs = driver.downs
    assert not driver.error, (driver.error, [(r["rank"], len(r["steps"]), r["warnings"])
                                             for r in ranks])
    first = ranks[0]["steps"]
    assert len(first) < MAX_STEPS
    for r in ranks[1:]:
        assert len(r["steps"]) == len(first), [len(x["steps"]) for x in ranks]
        for step, (x, y) in enumerate(zip(first, r["steps"])):
            assert x["sha"] == y["sha"], f"step {step}: rank {r['rank']}'s result differs"
    for step, s in enumerate(first):
        assert s["err"] < 1e-4, (step, s)       # float32 sums, quantized or Gloo's
    for leader in (0, PER_HOST):
        path = [s["boxes"] for s in ranks[leader]["steps"]]
        assert path[0] == 2 and 1 in path and 0 in path and path[-1] == 2, path
    addresses = [box.ip for box in lab.switches]
    for r in ranks:
        lost = [(t, m) for t, m in r["warnings"] if "lost at swml call" in m]
        assert len(lost) == 2, r["warnings"]
        assert addresses[1] in lost[0][1] and addresses[0] in lost[1][1], lost
        assert "gloo" in lost[1][1] and "host leaders" in lost[0][1], lost
        if r["rank"] % PER_HOST:
            assert all("told by this host's leader" in m for _, m in lost), lost
        assert any("answer every rank again" in m for _, m in r["warnings"]), r["warnings"]
        for (t, m), box in zip(lost, ("box 1", "box 0")):
            print(f"[box lost, 2 a host] rank {r['rank']} warned {(t - downs[box]) * 1000:.0f} "
                  f"ms after {box}'s link went down: {m}")
            assert t - downs[box] < NOTICED_S, (r["rank"], box, t - downs[box])


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(DEADLINE_S - 10, exit=True)
    _res = _rank_main(int(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]))
    print("RESULT " + json.dumps(_res), flush=True)
