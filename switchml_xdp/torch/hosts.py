"""Several ranks on one host (issue 13): who shares a host, and their local group.

The switch sends a job's results to one address and port per member, so one
host can be one member of a job, not several (the switch refuses a second
rank at the same address). `torchrun --nproc_per_node=R` puts R ranks on each
host; the `swml` backend therefore reduces in two levels, as NCCL uses SHARP:

1. the ranks of a host reduce into the host's leader (its lowest rank) through
   a Gloo group of their own on the loopback interface;
2. the leaders, one a host, reduce through the switch: the job's members are
   the hosts (rank = host index, world = number of hosts);
3. each leader broadcasts the result back to its host's ranks.

A leader's failure (a CallMismatch, an aborted job) reaches its host's ranks
as the same error: before the result, the leader broadcasts a status word,
and the message through the store.

Ranks are grouped by the address their route to the switch leaves from, the
address the switch would see (in the lab, every host is a network namespace
with its own address).
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import BroadcastOptions, ProcessGroupGloo, ReduceOptions, ReduceOp

_HOST_KEY = "swml/host/{rank}"
_ERROR_KEY = "swml/host{host}/error{call}"
LOOPBACK = "lo"


@dataclass(frozen=True)
class HostLayout:
    """The process group's ranks, grouped by host."""
    hosts: tuple[tuple[int, ...], ...]   # global ranks per host; hosts in order of their lowest rank
    rank: int

    @classmethod
    def from_keys(cls, keys: list[str], rank: int) -> "HostLayout":
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


_LOCAL_OPS = {"SUM": ReduceOp.SUM, "MIN": ReduceOp.MIN, "MAX": ReduceOp.MAX}


class LocalGroup:
    """The ranks of one host, over loopback: reduce into the leader, then the
    leader's result (or its error) back to everyone."""

    def __init__(self, store: dist.Store, layout: HostLayout, timeout: datetime.timedelta):
        self.layout = layout
        self.store = dist.PrefixStore(f"swml-host{layout.host_index}/", store)
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

    def shutdown(self) -> None:
        self.gloo.shutdown()
