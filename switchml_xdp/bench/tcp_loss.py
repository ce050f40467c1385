"""Random loss of TCP segments on a lab's worker links (xdp/swml_tcp_loss.c).

The lab's loss injector (switchml_xdp/lab/loss.py) drops swml's UDP only, by
design: the control protocol's TCP must not depend on the injected loss. To
compare with a TCP peer (Gloo) at the same loss rates, the benchmark puts this
second, TCP-only dropper on the same hooks, in front of the injector's filters:
tc ingress (up: what the worker sends) and tc egress (down: what it receives)
of every worker's bridge-side end. Frames it does not drop go on to the
injector unchanged. Only for labs where no swml job runs at the time (its
control connection is TCP too).

    with Lab(workers=4) as lab:
        lab.set_loss(0)                    # the injector (and its clsact hooks) first
        with TcpLoss(lab) as tl:
            tl.set(0.01)                   # 1 % each way on every worker link
            ...
            tl.counters()                  # {"up": {"seen", "dropped"}, "down": {...}}
"""
from __future__ import annotations

import contextlib
import ctypes as ct

from .. import bpf, net
from ..lab import LabError, netns
from ..lab.loss import TC_EGRESS_PARENT, TC_INGRESS_PARENT, threshold

SOURCE = "lab/swml_tcp_loss.c"
PRIO = 1          # before the loss injector's filters (kernel-chosen, 49152 and down)
DIRECTIONS = ("up", "down")
HOOKS = {"swml_tcp_loss_up": TC_INGRESS_PARENT, "swml_tcp_loss_down": TC_EGRESS_PARENT}


class TcpLoss(contextlib.ExitStack):
    """The TCP dropper on every worker link of `lab`; close() (or the end of
    a `with`) removes it."""

    def __init__(self, lab):
        super().__init__()
        self.lab = lab
        self._prog = bpf.compile_program(SOURCE, None, maps_only=True)
        self._attached: list[tuple[int, str]] = []
        self.callback(self._remove)
        try:
            self._attach({name: self._prog.load(name, "sched_cls") for name in HOOKS})
        except BaseException:
            self.close()
            raise
        self.set(0.0)

    def _attach(self, fds: dict[str, int]) -> None:
        with contextlib.closing(netns.iproute_in(self.lab.bridge_ns)) as br:
            for w in self.lab.workers:
                idx = net.link_index(w.peer, self.lab.bridge_ns)
                qdiscs = [q.get_attr("TCA_KIND") for q in br.get_qdiscs(index=idx)]
                if "clsact" not in qdiscs:
                    raise LabError(f"{w.peer} has no clsact: attach the lab's loss injector "
                                   "first (lab.set_loss(0))")
                for name, parent in HOOKS.items():
                    br.tc("add-filter", "bpf", idx, ":1", fd=fds[name], name=name,
                          parent=parent, prio=PRIO, classid=1, direct_action=True)
                    self._attached.append((idx, parent))

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
        with contextlib.suppress(Exception):
            with contextlib.closing(netns.iproute_in(self.lab.bridge_ns)) as br:
                for idx, parent in self._attached:
                    with contextlib.suppress(Exception):
                        br.tc("del-filter", "bpf", idx, ":1", parent=parent, prio=PRIO)
        with contextlib.suppress(Exception):
            self._prog.close()
