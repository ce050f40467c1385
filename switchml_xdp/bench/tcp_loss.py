"""Random loss of TCP segments on a lab's worker links (xdp/swml_tcp_loss.c).

The lab's loss injector (switchml_xdp/lab/loss.py) drops swml's UDP only, by
design: the control protocol's TCP must not depend on the injected loss. To
compare with a TCP peer (Gloo) at the same loss rates, the benchmark puts this
second, TCP-only dropper on the same hooks, in front of the lab's filters
there (priority 1, before the steering's and the injector's): tc ingress (up:
what the worker sends) and tc egress (down: what it receives) of every
worker's bridge-side end, through the door (bpf.tc_attach). Frames it does
not drop go on to them unchanged. Only for labs where no swml job runs at the
time (its control connection is TCP too).

    with Lab(workers=4) as lab:
        lab.set_loss(0)
        with TcpLoss(lab) as tl:
            tl.set(0.01)                   # 1 % each way on every worker link
            ...
            tl.counters()                  # {"up": {"seen", "dropped"}, "down": {...}}
"""
from __future__ import annotations

import contextlib
import ctypes as ct

from .. import bpf
from ..lab.loss import threshold

SOURCE = "lab/swml_tcp_loss.c"
PRIO = 1          # before the lab's steering (bpf.TC_PRIO) and loss injector (loss.TC_PRIO)
DIRECTIONS = ("up", "down")
HOOKS = {"swml_tcp_loss_up": False, "swml_tcp_loss_down": True}   # program: on egress


class TcpLoss(contextlib.ExitStack):
    """The TCP dropper on every worker link of `lab`; close() (or the end of
    a `with`) removes it."""

    def __init__(self, lab):
        super().__init__()
        self.lab = lab
        self._prog = bpf.compile_program(SOURCE, None, maps_only=True)
        self._attached: list[tuple[str, str, bool]] = []   # (port, program, egress)
        self.callback(self._remove)
        try:
            self._attach({name: self._prog.load(name, "sched_cls") for name in HOOKS})
        except BaseException:
            self.close()
            raise
        self.set(0.0)

    def _attach(self, fds: dict[str, int]) -> None:
        for w in self.lab.workers:
            for name, egress in HOOKS.items():
                bpf.tc_attach(w.peer, fds[name], name, netns=self.lab.bridge_ns, egress=egress,
                              prio=PRIO)
                self._attached.append((w.peer, name, egress))

    def set(self, loss: float) -> None:
        """Drop TCP with probability `loss` in both directions of every worker link."""
        t = ct.c_uint32(threshold(loss))
        for d in range(len(DIRECTIONS)):
            self._prog.table("cfg")[ct.c_int(d)] = t

    def counters(self) -> dict[str, dict[str, int]]:
        c = self._prog.table("counters")
        vals = [sum(c[ct.c_int(i)]) for i in range(4)]
        return {d: {"seen": vals[2 * i], "dropped": vals[2 * i + 1]}
                for i, d in enumerate(DIRECTIONS)}

    def deltas(self, snap: dict | None = None) -> dict:
        """A bench phase's extra_of (lab_bench.py): the counters now, or with
        `snap` (an earlier call's) the TCP frames seen and dropped since, both ways."""
        c = self.counters()
        if snap is None:
            return c
        return {"tcp_frames": sum(c[d]["seen"] - snap[d]["seen"] for d in c),
                "tcp_dropped": sum(c[d]["dropped"] - snap[d]["dropped"] for d in c)}

    def _remove(self) -> None:
        """Remove the filters (if the lab is still there), then the programs;
        what is already gone is no error."""
        for port, name, egress in self._attached:
            with contextlib.suppress(Exception):
                bpf.tc_detach(port, netns=self.lab.bridge_ns, name=name, egress=egress, prio=PRIO)
        with contextlib.suppress(Exception):
            self._prog.close()
