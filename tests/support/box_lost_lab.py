"""The lab side of the tests where training loses its boxes
(tests/lab/test_torch_box_lost.py, tests/lab/test_torch_box_lost_hosts.py):
the ranks' warnings with their times, and a driver that takes the boxes'
links down and up as the ranks mark their phases."""
from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path


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
