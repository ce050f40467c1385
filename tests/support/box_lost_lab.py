"""The lab side of the tests where training loses its boxes
(tests/lab/test_torch_box_lost.py, tests/lab/test_torch_box_lost_hosts.py):
the ranks' warnings with their times, and a driver that takes the boxes'
links down and up as the ranks mark their phases."""
from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path

import numpy as np

RETRY_CALLS = 20          # SWML_BOX_RETRY_CALLS
MAX_STEPS = 4000
AFTER_CHANGE = 25         # steps after a change before the next phase
NOTICED_S = 2.0           # each rank warns within this of a link going down


def inputs(rank: int, step: int, n: int) -> np.ndarray:
    """A rank's tensor at a step: the same wherever it is made."""
    return np.random.default_rng([rank, step]).standard_normal(n).astype(np.float32)


def record_warnings() -> list[tuple[float, str]]:
    """(time, message) of every warning this process shows from now on."""
    said: list[tuple[float, str]] = []
    shown = warnings.showwarning

    def show(message, category, *args, **kw):
        said.append((time.time(), str(message)))
        shown(message, category, *args, **kw)

    warnings.showwarning = show
    return said


def link(lab, box: int, state: str) -> float:
    host = lab.switches[box]
    lab.run(host, ["ip", "link", "set", "dev", host.iface, state])
    return time.time()


def wait_for(path: Path, deadline: float) -> None:
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the ranks never reached {path.name}")
        time.sleep(0.05)


class LinkDriver(threading.Thread):
    """Box 1's link down once the ranks mark phase0, box 0's at phase1, both
    up at phase2 (or on an error: kept in `error`); `downs`: when each went."""

    def __init__(self, lab, marks: Path, deadline_s: float):
        super().__init__(name="box-link-driver")
        self.lab, self.marks, self.deadline_s = lab, marks, deadline_s
        self.downs: dict[str, float] = {}
        self.error: list[BaseException] = []

    def run(self) -> None:
        try:
            deadline = time.monotonic() + self.deadline_s
            wait_for(self.marks / "phase0", deadline)
            self.downs["box 1"] = link(self.lab, 1, "down")
            wait_for(self.marks / "phase1", deadline)
            self.downs["box 0"] = link(self.lab, 0, "down")
            wait_for(self.marks / "phase2", deadline)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error.append(e)
        finally:
            link(self.lab, 0, "up")
            link(self.lab, 1, "up")


def join_swml(rank: int, world: int, master: str, port: int, switches: str):
    """This rank's `swml` group over `switches` (udp), in a Gloo world."""
    import datetime

    import torch
    import torch.distributed as dist

    import switchml_xdp.torch as swt

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=world)
    return dist.new_group(backend="swml", timeout=datetime.timedelta(seconds=30),
                          pg_options=swt.SwmlOptions(switch=switches, backend="udp"))


def run_losing_boxes(script: str, marks: Path, hosts: int, per_host: int, deadline_s: float,
                     retry_calls: int) -> tuple[list[dict], dict[str, float], list[str]]:
    """`script RANK MASTER SWITCHES MARKS` on per_host ranks a host of a lab of
    two boxes while a LinkDriver takes them down and up: the ranks' results,
    when each link went down, the boxes' addresses."""
    import sys

    from lab_jobs import rank_results
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.cluster import SwitchProcess

    with Lab(workers=hosts, boxes=2) as lab, SwitchProcess(lab, box=0), SwitchProcess(lab, box=1):
        switches = ",".join(b.ip for b in lab.switches)
        placements = [(lab.workers[r // per_host], [sys.executable, script, str(r),
                                                    lab.workers[0].ip, switches, str(marks)])
                      for r in range(hosts * per_host)]
        driver = LinkDriver(lab, marks, deadline_s)
        driver.start()
        try:
            ranks = rank_results(lab, placements, deadline_s,
                                 {"SWML_BOX_RETRY_CALLS": str(retry_calls)})
        finally:
            driver.join()
        addresses = [box.ip for box in lab.switches]
    assert not driver.error, (driver.error, [(r["rank"], len(r["steps"]), r["warnings"])
                                             for r in ranks])
    return ranks, driver.downs, addresses


def lost_warnings(rank: dict, addresses: list[str], downs: dict[str, float], noticed_s: float,
                  label: str) -> list[tuple[float, str]]:
    """A rank's two warnings of lost boxes (box 1's, then box 0's, after
    which Gloo), each within noticed_s of its link going down, and one of
    boxes back; the two, for more checks."""
    lost = [(t, m) for t, m in rank["warnings"] if "lost at swml call" in m]
    assert len(lost) == 2, rank["warnings"]
    assert addresses[1] in lost[0][1] and addresses[0] in lost[1][1], lost
    assert "gloo" in lost[1][1]
    assert any("answer every rank again" in m for _, m in rank["warnings"]), rank["warnings"]
    for (t, m), box in zip(lost, ("box 1", "box 0")):
        print(f"[{label}] rank {rank['rank']} warned {(t - downs[box]) * 1000:.0f} ms after "
              f"{box}'s link went down: {m}")
        assert t - downs[box] < noticed_s, (rank["rank"], box, t - downs[box])
    return lost
