"""The `swml` process group's Gloo side: the Gloo group built from the same
store, the collectives that are Gloo's by design (the switch only adds, so
all_gather, reduce_scatter, gather, scatter, all_to_all and send/recv go to
Gloo without a warning), and the fallback of what the switch could be asked
for but cannot carry (counted, warned once per kind).
"""
from __future__ import annotations

import datetime
import os
import threading
import warnings

import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

from .fallbacks import Fallbacks, caller_stacklevel
from .routing import WHAT_THE_SWITCH_DOES, where_calls_go

# ProcessGroup method -> the Gloo method that does it, with the same arguments.
_GLOOS_OWN = {
    "allgather": "allgather",
    "all_gather_single": "_allgather_base",
    "_allgather_base": "_allgather_base",
    "allgather_coalesced": "allgather_coalesced",
    "gather": "gather",
    "scatter": "scatter",
    "reduce": "reduce",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_single": "_reduce_scatter_base",
    "_reduce_scatter_base": "_reduce_scatter_base",
    "alltoall": "alltoall",
    "all_to_all_single": "alltoall_base",
    "alltoall_base": "alltoall_base",
    "send": "send",
    "recv": "recv",
    "recv_anysource": "recv_anysource",
}


def open_gloo(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta,
              gloo_iface: str | None, route_iface: str) -> ProcessGroupGloo:
    """Gloo on `gloo_iface` if given, else on GLOO_SOCKET_IFNAME's interfaces
    if set, else on the interface that routes to the switch (route_iface)."""
    gloo_store = dist.PrefixStore("swml-gloo/", store)
    if gloo_iface or not os.environ.get("GLOO_SOCKET_IFNAME"):
        opts = ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [ProcessGroupGloo.create_device(interface=gloo_iface or route_iface)]
        return ProcessGroupGloo(gloo_store, rank, size, opts)
    # this constructor reads GLOO_SOCKET_IFNAME (which may list several)
    return ProcessGroupGloo(gloo_store, rank, size, timeout)


# Point-to-point: barrier() does not wait for these (Gloo's barrier does not
# either): a send its peer receives only after the barrier would never end.
# Their Work is also not one to wait for twice (a second wait of Gloo's
# send/recv waits for another transfer).
_POINT_TO_POINT = frozenset({"send", "recv", "recv_anysource"})


def _handed_to_gloo(name: str, gloo_name: str):
    collective_op = name not in _POINT_TO_POINT

    def collective(self, *args, **kwargs):
        self._by_design(name)
        work = getattr(self.gloo, gloo_name)(*args, **kwargs)
        return self._gloo(work) if collective_op else work

    collective.__name__ = collective.__qualname__ = name
    collective.__doc__ = f"Gloo's {gloo_name}, as it is."
    return collective


class GlooSide:
    """The part of ProcessGroupSwml (it comes first among the bases, before
    dist.ProcessGroup, whose bindings it overrides) that Gloo does. Its
    owner calls _open_gloo in its constructor."""

    def _open_gloo(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta,
                   gloo_iface: str | None, route_iface: str) -> None:
        self.gloo = open_gloo(store, rank, size, timeout, gloo_iface, route_iface)
        self.group_timeout = timeout    # bounds every wait of the group (docs/pytorch.md)
        self._gloo_pending: list = []   # Gloo's collectives not yet completed (barrier waits)
        self._gloo_lock = threading.Lock()
        self._fallbacks = Fallbacks()

    @property
    def fallbacks(self) -> int:
        """all_reduce/broadcast calls that went to Gloo instead of the switch."""
        return self._fallbacks.count

    def _fallback(self, reason: str, start):
        """Count and warn (once per kind) for a call that Gloo does instead."""
        self._fallbacks.note(reason, f"switchml_xdp: {reason} is not done by the switch "
                             f"({WHAT_THE_SWITCH_DOES}): it falls back to gloo (warned once "
                             "per kind)", stacklevel=caller_stacklevel())
        if self.calls.debug:
            self.calls.say(f"{reason} -> gloo (fallback)")
        return self._gloo(start())

    def _by_design(self, name: str) -> None:
        """Count a call Gloo does by design; the group's first says, once,
        where each collective goes (group_stats.CallLog)."""
        if self.calls.through_gloo(name):
            warnings.warn(where_calls_go(name), UserWarning, stacklevel=caller_stacklevel())

    def _gloo(self, work):
        """Keep a Gloo collective's Work until it completes: barrier() waits for it."""
        with self._gloo_lock:
            self._gloo_pending = [w for w in self._gloo_pending if not w.is_completed()]
            self._gloo_pending.append(work)
        return work

    def _gloo_issued(self) -> list:
        """This group's Gloo collectives issued so far and not yet completed."""
        with self._gloo_lock:
            return list(self._gloo_pending)

    def _wait_for_gloo(self, works: list) -> None:
        """Wait for `works` (from _gloo_issued), each at most the group's
        timeout, as Gloo's barrier waits for its earlier collectives. A
        collective's Work may be waited for again (by its caller too)."""
        for w in works:
            w.wait(self.group_timeout)

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        works = [self.gloo._allgather_base(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        for w in works[:-1]:
            w.wait(self.group_timeout)
        return self._gloo(works[-1])

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def monitored_barrier(self, *args, **kwargs):
        return self.gloo.monitored_barrier(*args, **kwargs)


for _name, _gloo_name in _GLOOS_OWN.items():
    setattr(GlooSide, _name, _handed_to_gloo(_name, _gloo_name))
