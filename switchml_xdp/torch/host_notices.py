"""A host leader's failover warnings, told to the other ranks of its host
(docs/pytorch.md, "A lost box").

Where a host has several ranks, only its leader streams and takes part in
the agreement on lost boxes (box_failover.py); the others wait for the
result in the local share. Every rank still warns once for each change of
boxes: the leader puts each warning it gives on the group's store under its
host's prefix, numbered, and a thread of each other rank of the host reads
the next number every WATCH_S and warns with the same words. A rank in the
middle of a call learns it so within WATCH_S of its leader, not when the
call is over (a redo through a new job takes seconds).
"""
from __future__ import annotations

import threading
import warnings

import torch.distributed as dist

WATCH_S = 0.1


def _notices(store: dist.Store, host_index: int) -> dist.Store:
    return dist.PrefixStore(f"swml-notices/host{host_index}/", store)


class HostNotices:
    """The leader's side: tell(message) for every warning of its failover."""

    def __init__(self, store: dist.Store, host_index: int):
        self.store = _notices(store, host_index)
        self.told = 0

    def tell(self, message: str) -> None:
        self.told += 1
        self.store.set(str(self.told), message)


class NoticeListener:
    """The other ranks' side: warns each of the leader's notices once, in
    order, from a thread of its own."""

    def __init__(self, store: dist.Store, host_index: int, leader: int):
        self.store, self.leader = _notices(store, host_index), leader
        self.heard: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="swml-host-notices", daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while not self._stop.wait(WATCH_S):
            self._hear()

    def _hear(self) -> None:
        try:
            key = str(len(self.heard) + 1)
            while self.store.check([key]):
                notice = self.store.get(key).decode()
                warnings.warn(f"{notice} (told by this host's leader, rank {self.leader})",
                              RuntimeWarning, stacklevel=1)
                self.heard.append(notice)   # heard = warned: what a watcher may count on
                key = str(len(self.heard) + 1)
        except Exception:  # noqa: BLE001 - a store going away at shutdown: calls say it
            pass

    def close(self) -> None:
        """Stop listening, after hearing what the leader told before."""
        self._stop.set()
        self._thread.join()
        self._hear()
