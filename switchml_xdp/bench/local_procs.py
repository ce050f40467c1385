"""Run a function on R processes of this machine that form one host's local
group, without a switch: for the local group's tests and its benchmark.

    run_on_host(fn, 2, args)   # -> [fn(group, 0, *args), fn(group, 1, *args)]

Each process is spawned (a fresh interpreter: torch and fork do not mix),
meets the others through a FileStore, opens the host's local group (shared
memory, or Gloo on loopback with kind="gloo-loopback"), runs fn, shuts the
group down and hands back fn's value, or its exception's type and message.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback

AUTO, LOOPBACK = "auto", "gloo-loopback"


class RankFailed(RuntimeError):
    """A rank's function raised; `.errors` maps rank -> 'Type: message'."""

    def __init__(self, errors: dict[int, str]):
        super().__init__("; ".join(f"rank {r}: {e}" for r, e in sorted(errors.items())))
        self.errors = errors


def _open(kind: str, store, layout, timeout, region_bytes):
    import torch.distributed as dist

    from ..torch.hosts import LoopbackLocalGroup, open_local_group

    if kind == LOOPBACK:
        return LoopbackLocalGroup(dist.PrefixStore("loopback/", store), layout, timeout)
    return open_local_group(store, layout, timeout, region_bytes)


def _rank_main(fn, rank: int, n: int, store_path: str, kind: str, timeout_s: float,
               region_bytes: int | None, args: tuple, results) -> None:
    import torch
    import torch.distributed as dist

    from ..torch.hosts import HostLayout

    torch.set_num_threads(1)
    try:
        store = dist.FileStore(store_path, n)
        layout = HostLayout((tuple(range(n)),), rank)
        group = _open(kind, store, layout, datetime.timedelta(seconds=timeout_s), region_bytes)
        try:
            value = fn(group, rank, *args)
        finally:
            group.shutdown()
        results.put((rank, True, value))
    except BaseException as e:  # noqa: BLE001 - handed to the parent
        results.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run_on_host(fn, n: int, args: tuple = (), *, kind: str = AUTO, timeout_s: float = 10.0,
                region_bytes: int | None = None, deadline_s: float = 120.0,
                expect_errors: bool = False) -> list:
    """fn(group, rank, *args) on n processes; their values in rank order.
    A rank that raises: RankFailed (or, with expect_errors, its 'Type:
    message' string in its place). timeout_s: the group's; deadline_s: the
    whole run's, after which every process is killed."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="swml-local-") as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_rank_main, daemon=True,
                             args=(fn, r, n, store_path, kind, timeout_s, region_bytes, args, results))
                 for r in range(n)]
        for p in procs:
            p.start()
        got: dict[int, tuple[bool, object]] = {}
        end = time.monotonic() + deadline_s
        try:
            while len(got) < n:
                try:
                    rank, ok, value = results.get(timeout=0.2)
                    got[rank] = (ok, value)
                except queue.Empty:
                    if time.monotonic() > end:
                        raise TimeoutError(f"local ranks {sorted(set(range(n)) - set(got))} did "
                                           f"not finish within {deadline_s:g} s") from None
                    if all(not p.is_alive() for p in procs) and results.empty():
                        got.update({r: (False, f"exited {procs[r].exitcode} without a result")
                                    for r in range(n) if r not in got})
        finally:
            for p in procs:
                p.join(timeout=max(0.1, end - time.monotonic()))
                if p.is_alive():
                    p.kill()
                    p.join()
    errors = {r: str(v).split("\n", 1)[0] for r, (ok, v) in got.items() if not ok}
    if errors and not expect_errors:
        raise RankFailed({r: str(got[r][1]) for r in errors})
    return [got[r][1] if got[r][0] else errors[r] for r in range(n)]
