"""The line a `swml` process group says when it is made: which datapath each
host streams on, the switch, k and slots (docs/pytorch.md, "What a rank
did"). Under torchrun nothing else says it, and a host on udp instead of
afxdp is several times slower.

Each host's leader writes its datapath to the group's store; rank 0 prints
one line for the job, a leader whose datapath differs from host 0's prints
its own, and a leader that asked for `auto` and got udp warns, saying why.
"""
from __future__ import annotations

import json
import sys
import warnings

import torch.distributed as dist

_KEY = "swml/datapath/{}"


def _own_datapath(pg) -> dict:
    """A host leader's datapath, and why `auto` gave udp (None if it did not)."""
    from ..client.api import _afxdp_unavailable_reason

    worker = pg.worker
    note = None
    if pg.options.backend == "auto" and worker.backend_name == "udp":
        note = _afxdp_unavailable_reason() or "the afxdp set-up failed on this host"
    return {"datapath": worker.backend_name, "slots": worker.info.slots, "job": worker.info.name,
            "note": note}


def _shape(pg) -> str:
    hosts = pg.layout.hosts
    sizes = {len(h) for h in hosts}
    if len(sizes) == 1:
        return f"{len(hosts)} hosts x {sizes.pop()} ranks"
    return f"{pg.size()} ranks on {len(hosts)} hosts"


def line(pg, group_name: str, path: dict, others: str = "") -> str:
    return (f"switchml_xdp: swml group {group_name}: job {path['job']} on switch "
            f"{pg.options.switch}: {path['datapath']} datapath, k={pg.k}, slots={path['slots']}, "
            f"{_shape(pg)}{others}")


def announce(pg, store: dist.Store, group_name: str) -> None:
    """Share each host's datapath through `store` (every rank learns its
    host's: pg.datapath, for group_report.stats) and say it once."""
    layout = pg.layout
    if layout.is_leader:
        mine = _own_datapath(pg)
        store.set(_KEY.format(layout.host_index), json.dumps(mine))
        if mine["note"]:
            warnings.warn(f"switchml_xdp: rank {pg.rank()} (host {layout.host_index}) asked for "
                          f"datapath auto and streams on udp: {mine['note']}; afxdp is several "
                          "times faster (docs/pytorch.md)", RuntimeWarning, stacklevel=2)
    pg.datapath = json.loads(store.get(_KEY.format(layout.host_index)).decode())
    if layout.host_index == 0 and not layout.is_leader:
        return
    first = pg.datapath if layout.host_index == 0 else json.loads(store.get(_KEY.format(0)).decode())
    if pg.rank() == 0:
        paths = [first] + [json.loads(store.get(_KEY.format(h)).decode())
                           for h in range(1, layout.n_hosts)]
        odd = [f"host {h}: {p['datapath']}" for h, p in enumerate(paths)
               if p["datapath"] != first["datapath"]]
        print(line(pg, group_name, first, f" ({', '.join(odd)})" if odd else ""),
              file=sys.stderr, flush=True)
    elif layout.is_leader and pg.datapath["datapath"] != first["datapath"]:
        print(line(pg, group_name, pg.datapath, f" (rank {pg.rank()}, host {layout.host_index})"),
              file=sys.stderr, flush=True)
