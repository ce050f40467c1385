"""Packet loss and duplication on the lab's links (xdp/lab/swml_loss.c; no netem here).

Per link (one per host: every box, the switch first, and every worker) and
per direction:

    up   = what the host sends     (XDP on the bridge-side end drops,
                                    tc ingress there duplicates)
    down = what the host receives  (tc egress on the bridge-side end drops
                                    and duplicates)

For a worker, up is worker -> switch and down is switch -> worker; every path
is covered: kernel-socket traffic, AF_XDP transmissions (copy mode on veth
sends with __dev_direct_xmit, past the worker's qdisc, but still into the
bridge-side end's XDP hook; tests/lab/test_loss.py drives that path with
PACKET_QDISC_BYPASS) and the switch's XDP_TX'd RESULTs
(the bridge forwards them through each worker port's tc egress, one skb per
port, so multicast is dropped independently per worker). Nothing is attached
to the hosts' own interfaces, where the AF_XDP backend puts its program.

Only data-port UDP (to or from `port`, the switch's 48864 by default; 0 = all
UDP) is subject to loss and counted: ARP, ICMP and the control protocol's TCP
stay untouched, so joins and leases do not depend on the injected loss.

Normally used through the Lab:

    with Lab(workers=4, loss=0.05) as lab:          # 5 % each way on every worker link
        lab.set_loss(0.2, dup=0.01, hosts=["w0"], direction="up")
        lab.loss_counters()["w0"]["up"]             # {"seen", "dropped", "duplicated", "passed", ...}
        lab.set_loss(0.05, burst=4)                 # 5 % lost in bursts of 4 frames on average

Bursts are a Gilbert-Elliott model per link and direction (lab/burst.py): the
counters add "bad" (frames seen in the bad state), "bursts" (stays begun
there) and "drop_runs" (runs of consecutive drops: dropped / drop_runs is
the mean run, 1 / (1 - loss) for random loss).

The program is compiled once per lab, when loss is first asked for (the
constructor's loss=/dup=, or set_loss()); until then the lab runs the plain
pass program. Its maps are pinned under /sys/fs/bpf/swml/lab-PREFIX/loss, so a
process holding Lab.from_state(PREFIX) sets and reads them without reloading.
"""
from __future__ import annotations

import contextlib
import ctypes as ct
import dataclasses
import errno
import os
from collections.abc import Iterable, Sequence

from .. import bpf, net, wire
from ..layout import DEFINES, ctype
from . import burst as burst_mod
from .burst import BurstModel, resolve
from .errors import LabError
from .loss_values import LossError, check_port, from_threshold, probability, threshold

SOURCE = "lab/swml_loss.c"
XDP_PROG, INGRESS_PROG, EGRESS_PROG = "swml_loss_xdp", "swml_loss_ingress", "swml_loss_egress"
DIRECTIONS = ("up", "down")
COUNTERS = ("seen", "dropped", "duplicated", "passed", "bad", "bursts", "drop_runs")
# The injector's tc filters sit after the lab's queue steering (bpf.TC_PRIO,
# lab/steering.py) on a bridge port's ingress: a copy it makes is then steered.
TC_PRIO = bpf.TC_PRIO + 1

_D = DEFINES["swml_loss.h"]
MAX_LINKS = _D["SWML_LOSS_MAX_LINKS"]
_DIR_INDEX = {"up": _D["SWML_LOSS_UP"], "down": _D["SWML_LOSS_DOWN"]}


def _lab_pin_dir(prefix: str) -> str:
    return bpf.pin_dir(f"lab-{prefix}")


def pin_dir(prefix: str) -> str:
    """Where lab `prefix` pins its loss maps (bpffs, next to the switch's)."""
    return f"{_lab_pin_dir(prefix)}/loss"


def remove_pins(prefix: str) -> None:
    """Unpin lab `prefix`'s maps (the maps go when no program holds them either)."""
    bpf.remove_pins(_lab_pin_dir(prefix))


def lab_args(loss, dup, port, burst) -> tuple:
    """A Lab's loss=, dup=, loss_port= and burst= checked (None stays None),
    or a LabError in one line."""
    try:
        checked = (None if loss is None else probability(loss, "loss"),
                   None if dup is None else probability(dup, "dup"),
                   None if port is None else check_port(port), burst_mod.model(burst))
        if isinstance(checked[3], float) and not checked[0]:
            raise LossError("a burst length needs a loss rate to spread (loss=)")
        resolve(checked[0], checked[3])   # a rate its bursts cannot reach
    except LossError as e:
        raise LabError(str(e)) from None
    return checked


def burst_state(burst) -> dict | float | None:
    """`burst=` as a lab's state file holds it: the mean length or the model's fields."""
    return dataclasses.asdict(burst) if isinstance(burst, BurstModel) else burst


def _directions(direction: str) -> tuple[str, ...]:
    if direction == "both":
        return DIRECTIONS
    if direction in DIRECTIONS:
        return (direction,)
    raise LossError(f"direction must be 'up', 'down' or 'both', not {direction!r}")


class LossInjector:
    """The loss maps of one lab (and, in the process that attached them, the
    compiled programs). Link i is lab.hosts[i]: the boxes, then the workers."""

    def __init__(self, lab, program: bpf.Program | None = None):
        self.lab = lab
        self.dir = pin_dir(lab.prefix)
        self.Cfg, self.Counters = ctype("swml_loss_cfg"), ctype("swml_loss_counters")
        self._program = program
        self.cfg = bpf.PinnedMap(f"{self.dir}/cfg", self.Cfg)
        self.port_map = bpf.PinnedMap(f"{self.dir}/port", ct.c_uint32)
        self.counter_map = bpf.PinnedMap(f"{self.dir}/counters", self.Counters, percpu=True)
        self.State = ctype("swml_loss_state")
        self.state_map = bpf.PinnedMap(f"{self.dir}/state", self.State)

    # -- making and finding one -------------------------------------------------

    @staticmethod
    def exists(prefix: str) -> bool:
        """Whether lab `prefix` has a loss injector (its maps are pinned)."""
        return os.path.exists(f"{pin_dir(prefix)}/cfg")

    @classmethod
    def open(cls, lab) -> LossInjector | None:
        """The injector of a lab that already has one (maybe attached by another
        process), or None."""
        try:
            return cls(lab)
        except bpf.PinnedMapError as e:
            if e.errno == errno.ENOENT:
                return None
            raise

    @classmethod
    def attach(cls, lab) -> LossInjector:
        """Compile xdp/lab/swml_loss.c once and put it on every bridge-side end:
        XDP (replacing the pass program), tc ingress and tc egress. Loss starts
        at 0 and the port at the switch's default data port."""
        if len(lab.hosts) > MAX_LINKS:
            raise LabError(f"the loss injector handles at most {MAX_LINKS} hosts")
        try:
            bpf.ensure_bpffs(pin_dir(lab.prefix))
            program = bpf.compile_program(SOURCE, XDP_PROG,
                                          {"SWML_LOSS_PIN_DIR": bpf.c_string(pin_dir(lab.prefix))})
        except bpf.BpfError as e:
            remove_pins(lab.prefix)
            raise LabError(f"cannot load the loss injector: {e}") from e
        self = cls(lab, program)
        try:
            tc_progs = [(program.load(name, "sched_cls"), name, egress) for name, egress in
                        ((INGRESS_PROG, False), (EGRESS_PROG, True))]
            self.set_port(wire.DEFAULT_PORT)
            links = program.table("links")
            for link, host in enumerate(lab.hosts):
                idx = net.link_index(host.peer, lab.bridge_ns)
                links[ct.c_uint32(idx)] = ct.c_uint32(link)
                # In place of an earlier attach's filters; the steering's stay.
                for fd, name, egress in tc_progs:
                    bpf.tc_attach(host.peer, fd, name, netns=lab.bridge_ns, egress=egress,
                                  prio=TC_PRIO)
                bpf.attach(host.peer, program.fd, "native", replace=True, netns=lab.bridge_ns)
        except bpf.BpfError as e:
            self.close()
            raise LabError(f"cannot attach the loss injector: {e}") from e
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Close our handles; attached programs and pinned maps stay (the lab's
        close removes both)."""
        for m in (self.cfg, self.port_map, self.counter_map, self.state_map):
            m.close()
        if self._program is not None:
            with contextlib.suppress(Exception):
                self._program.close()
            self._program = None

    # -- settings ------------------------------------------------------------------

    def _links(self, hosts: Iterable | None, default: Sequence) -> list[tuple[int, object]]:
        all_hosts = self.lab.hosts
        chosen = default if hosts is None else [self.lab.host(h) for h in hosts]
        return [(all_hosts.index(h), h) for h in chosen]

    def set(self, loss: float = 0.0, dup: float = 0.0, hosts: Iterable | None = None,
            direction: str = "both", burst=None) -> None:
        """Drop with probability `loss`, duplicate what passes with probability
        `dup`, on the links of `hosts` (default: every worker) in `direction`
        ("up", "down" or "both"). `burst` (lab/burst.py resolve): None for
        random loss, a mean burst length B (then `loss` is the mean rate, lost
        in bursts of B frames on average) or a BurstModel (then `loss` is the
        good state's). Takes effect at once, for the next frame; each link
        starts in the good state."""
        good, model = resolve(loss, burst)
        value = self.Cfg(drop=threshold(good), dup=threshold(probability(dup, "dup")))
        if model is not None and model.p > 0:
            value.to_bad, value.to_good = threshold(model.p), threshold(model.r)
            value.bad_drop = threshold(model.h)
        dirs = _directions(direction)
        for link, _ in self._links(hosts, self.lab.workers):
            for d in dirs:
                self.cfg.update(link * 2 + _DIR_INDEX[d], value)
                self.state_map.update(link * 2 + _DIR_INDEX[d], self.State())

    def set_port(self, port: int) -> None:
        """Which UDP port's traffic (from or to it) is subject to loss; 0 = all UDP."""
        self.port_map.update(0, ct.c_uint32(check_port(port)))

    @property
    def port(self) -> int:
        return self.port_map.lookup(0).value

    def settings(self, hosts: Iterable | None = None) -> dict[str, dict[str, dict]]:
        """{host: {"up": {"loss": p, "dup": q, "burst": model}, "down": {...}}},
        default every host; "loss" is the good state's, "burst" None or the
        BurstModel (its mean_loss(loss) the long-run rate)."""
        out = {}
        for link, host in self._links(hosts, self.lab.hosts):
            out[host.name] = {}
            for d in DIRECTIONS:
                c = self.cfg.lookup(link * 2 + _DIR_INDEX[d])
                model = BurstModel(from_threshold(c.to_bad), from_threshold(c.to_good),
                                   from_threshold(c.bad_drop)) if c.to_bad else None
                out[host.name][d] = {"loss": from_threshold(c.drop), "dup": from_threshold(c.dup),
                                     "burst": model}
        return out

    def counters(self, hosts: Iterable | None = None) -> dict[str, dict[str, dict[str, int]]]:
        """{host: {"up"|"down": {name: count for name in COUNTERS}}}, summed
        over CPUs, since the injector was attached; default every host."""
        out = {}
        for link, host in self._links(hosts, self.lab.hosts):
            out[host.name] = {}
            for d in DIRECTIONS:
                per_cpu = self.counter_map.lookup(link * 2 + _DIR_INDEX[d])
                out[host.name][d] = {name: sum(getattr(c, name) for c in per_cpu)
                                     for name in COUNTERS}
        return out
