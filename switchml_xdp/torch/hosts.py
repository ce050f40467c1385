"""Several ranks on one host: who shares a host, and their local group
(docs/pytorch.md, "Several ranks per host").

The switch sends a job's results to one address and port per member, so one
host can be one member of a job, not several (the switch refuses a second
rank at the same address). `torchrun --nproc_per_node=R` puts R ranks on each
host; the `swml` backend therefore reduces in two levels, as NCCL uses SHARP:

1. the ranks of a host reduce into the host's leader (its lowest rank)
   through a shared-memory segment of their own (shm_local.py);
2. the leaders, one a host, reduce through the switch: the job's members are
   the hosts (rank = host index, world = number of hosts);
3. each leader writes the result back into the segment, and its host's
   ranks copy it out.

A leader's failure (a CallMismatch, an aborted job) reaches its host's ranks
as the same error: the leader publishes the call's failure and its message
in the segment instead of the result. A failure of the host's own ranks
(a disagreement, a rank that does not come or has exited) reaches the other
hosts through the switch: the leader takes the call's turn with a
contribution no call matches (refuse_for_host), so that call fails on
every rank and the next starts in step.

Where shared memory cannot be had (no /dev/shm, or one too small for the
segment; ranks that share an address but not /dev/shm, as containers that
share a network namespace only), the host's ranks agree to use a Gloo group
on loopback instead, with a warning that says why.

Ranks are grouped by the address their route to the switch leaves from, the
address the switch would see (in the lab, every host is a network namespace
with its own address).
"""
from __future__ import annotations

import contextlib
import datetime
import os
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import BroadcastOptions, ProcessGroupGloo, ReduceOp, ReduceOptions

from .shm_local import SharedMemoryLocalGroup
from .shm_segment import DEFAULT_REGION_BYTES, Geometry, Segment

_HOST_KEY = "swml/host/{rank}"
_ERROR_KEY = "swml/host{host}/error{call}"
LOOPBACK = "lo"


@dataclass(frozen=True)
class HostLayout:
    """The process group's ranks, grouped by host."""
    hosts: tuple[tuple[int, ...], ...]   # global ranks per host; hosts in order of their lowest rank
    rank: int

    @classmethod
    def from_keys(cls, keys: list[str], rank: int) -> HostLayout:
        groups: dict[str, list[int]] = {}
        for r, key in enumerate(keys):
            groups.setdefault(key, []).append(r)
        return cls(tuple(sorted(tuple(g) for g in groups.values())), rank)

    @property
    def host_index(self) -> int:
        return next(i for i, h in enumerate(self.hosts) if self.rank in h)

    @property
    def local_ranks(self) -> tuple[int, ...]:
        return self.hosts[self.host_index]

    @property
    def local_rank(self) -> int:
        return self.local_ranks.index(self.rank)

    @property
    def is_leader(self) -> bool:
        return self.local_rank == 0

    @property
    def n_hosts(self) -> int:
        return len(self.hosts)


def agree_layout(store: dist.Store, rank: int, size: int, host_key: str) -> HostLayout:
    """Every rank publishes its host's key and reads everybody's."""
    store.set(_HOST_KEY.format(rank=rank), host_key)
    keys = [store.get(_HOST_KEY.format(rank=r)).decode() for r in range(size)]
    return HostLayout.from_keys(keys, rank)


def refuse_for_host(worker, flat: torch.Tensor, op: str) -> None:
    """A host's ranks failed a call before its leader could stream it: the
    leader (`worker`: its Worker, or its box failover, which refuses on the
    boxes or in the leaders' Gloo group) still takes the call's turn, with a
    contribution that no host's call matches, so the call fails on every
    host too and all stay in step for the next (docs/pytorch.md, "When a
    call fails")."""
    if worker is not None:
        with contextlib.suppress(Exception):    # the host's own error is the one raised
            worker.refuse_call(flat.numel(), str(flat.dtype).removeprefix("torch."), op)


_LOCAL_OPS = {"SUM": ReduceOp.SUM, "MIN": ReduceOp.MIN, "MAX": ReduceOp.MAX}


class LoopbackLocalGroup:
    """The ranks of one host, over a Gloo group on loopback TCP: the fallback
    where they cannot share memory (see open_local_group). Same interface
    as shm_local.SharedMemoryLocalGroup."""

    transport = "gloo-loopback"

    def __init__(self, store: dist.Store, layout: HostLayout, timeout: datetime.timedelta):
        self.layout = layout
        self.store = store
        opts = ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [ProcessGroupGloo.create_device(interface=LOOPBACK)]
        self.gloo = ProcessGroupGloo(self.store, layout.local_rank, len(layout.local_ranks), opts)
        self.calls = 0

    def reduce_to_leader(self, flat: torch.Tensor, op: str) -> None:
        """op: SUM, MIN or MAX; flat is the leader's input to the switch after."""
        o = ReduceOptions()
        o.reduceOp, o.rootRank = _LOCAL_OPS[op], 0
        self.gloo.reduce([flat], o).wait()

    def share(self, flat: torch.Tensor, error: BaseException | None) -> None:
        """The leader's result (or error) to every rank of the host; on the
        others, raises the leader's error as a RuntimeError."""
        self.calls += 1
        status = torch.tensor([0 if error is None else 1], dtype=torch.int32)
        key = _ERROR_KEY.format(host=self.layout.host_index, call=self.calls)
        if self.layout.is_leader and error is not None:
            self.store.set(key, f"{type(error).__name__}: {error}")
        o = BroadcastOptions()
        o.rootRank = 0
        self.gloo.broadcast([status], o).wait()
        if int(status[0]):
            if self.layout.is_leader:
                raise error
            raise RuntimeError(f"the host's leader (rank {self.layout.local_ranks[0]}) failed "
                               f"this call: {self.store.get(key).decode()}")
        self.gloo.broadcast([flat], o).wait()

    def result_patience(self, seconds: float) -> None:
        """Gloo's own timeout bounds the wait for the leader's result here:
        a leader's recovery from a lost box must end within it."""

    def shutdown(self) -> None:
        self.gloo.shutdown()


LocalGroup = SharedMemoryLocalGroup | LoopbackLocalGroup
_SHM_BYTES_ENV = "SWML_SHM_BYTES"


def shm_region_bytes(configured: int | None) -> int:
    """Bytes of shared memory per rank (two slots of half that): the
    option, else SWML_SHM_BYTES, else DEFAULT_REGION_BYTES."""
    if configured is not None:
        return int(configured)
    return int(os.environ.get(_SHM_BYTES_ENV, DEFAULT_REGION_BYTES))


def open_local_group(store: dist.Store, layout: HostLayout, timeout: datetime.timedelta,
                     region_bytes: int | None = None) -> LocalGroup:
    """The local group of this rank's host, made by all its ranks together:
    shared memory where every rank can map the leader's segment, else Gloo
    on loopback (all the host's ranks take the same, agreed through the store)."""
    host_store = dist.PrefixStore(f"swml-host{layout.host_index}/", store)
    # A fresh prefix each time these ranks open a group on this store, so
    # that a key of an earlier group is never taken for this one's.
    n = host_store.add(f"shm/opened/{layout.local_rank}", 1)
    keys = dist.PrefixStore(f"shm/{n}/", host_store)
    segment, why_not = _agree_segment(keys, layout, shm_region_bytes(region_bytes))
    if segment is not None:
        return SharedMemoryLocalGroup(segment, layout.local_rank, layout.local_ranks, timeout)
    if layout.is_leader:
        warnings.warn(f"switchml_xdp: the ranks of host {layout.host_index} reduce over loopback "
                      f"TCP, not shared memory: {why_not}", RuntimeWarning, stacklevel=2)
    return LoopbackLocalGroup(dist.PrefixStore("gloo/", keys), layout, timeout)


def _agree_segment(keys: dist.Store, layout: HostLayout,
                   region_bytes: int) -> tuple[Segment | None, str]:
    """The leader creates the segment, the others map it and say whether
    they could; once all have said, the leader unlinks its name (the
    mappings stay: nothing is left in /dev/shm, whatever happens later)
    and tells them whether they all have it. (segment or None, why not)."""
    others = range(1, len(layout.local_ranks))
    if layout.is_leader:
        try:
            segment = Segment.create(Geometry.for_region(len(layout.local_ranks), region_bytes))
        except OSError as e:
            why = f"rank {layout.rank} could not create the segment: {e}"
            keys.set("name", "!" + why)
            return None, why
        keys.set("name", segment.name)
        try:
            said = {r: keys.get(f"attached/{r}").decode() for r in others}
        finally:
            segment.unlink()
        refusals = [s[1:] for s in said.values() if s.startswith("!")]
        verdict = "!" + "; ".join(refusals) if refusals else "ok"
        keys.set("verdict", verdict)
        if refusals:
            segment.close()
            return None, verdict[1:]
        return segment, ""
    name = keys.get("name").decode()
    if name.startswith("!"):
        return None, name[1:]
    try:
        segment: Segment | None = Segment.attach(name)
        keys.set(f"attached/{layout.local_rank}", "ok")
    except (OSError, ValueError) as e:
        segment = None
        keys.set(f"attached/{layout.local_rank}",
                 f"!rank {layout.rank} could not map the leader's segment {name}: {e}")
    verdict = keys.get("verdict").decode()
    if verdict != "ok":
        if segment is not None:
            segment.close()
        return None, verdict[1:]
    return segment, ""
