"""The switch as `swml-lab bench` runs it in the lab: its counters through the
control protocol, and the user-space data plane at a raised priority."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

USERSPACE_NICE = -10         # the user-space switch's scheduling priority (see userspace_switch)


def switch_counters(lab) -> dict:
    """The switches' counters (XDP or user-space) through the control
    protocol's `status`, summed over the lab's boxes."""
    from ..client.control import ControlClient

    total: dict = {}
    for box in lab.switches:
        with lab.enter(box):
            client = ControlClient(box.ip, connect_timeout=10)
        try:
            for key, value in client.status().get("counters", {}).items():
                if isinstance(value, (int, float)):
                    total[key] = total.get(key, 0) + value
        finally:
            client.close()
    return total


def renice(pid: int, niceness: int) -> None:
    """Set the niceness of every thread of a process (Linux's is per thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, int(tid), niceness)


def userspace_switch(lab, args: Sequence[str], box: int = 0):
    """`swml-switch up --dataplane userspace` in the namespace of box `box`,
    at niceness USERSPACE_NICE: a switch is a box of its own; here it shares
    two cores with the workers, and the XDP switch's softirq work preempts
    them anyway."""
    from ..lab.cluster import SwitchProcess

    sw = SwitchProcess(lab, [*args, "--dataplane", "userspace"], box=box)
    renice(sw.proc.pid, USERSPACE_NICE)
    return sw
