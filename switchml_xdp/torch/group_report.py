"""What a swml group tells about itself: `switchml_xdp.torch.stats(group)`
(docs/pytorch.md, "What a rank did"). The counters live on the group
(group_stats.py's CallLog, the Worker's, fallbacks.py's); this gathers them."""
from __future__ import annotations

import torch.distributed as dist

from .process_group import ProcessGroupSwml


def swml_group(group=None):
    """The ProcessGroupSwml of `group` (None: the default group), or a
    ValueError saying what the group is instead."""
    if group is None:
        if not dist.is_initialized():
            raise ValueError("no default process group: call init_process_group first, "
                             "or pass the swml group")
        group = dist.distributed_c10d._get_default_group()
    if isinstance(group, ProcessGroupSwml):
        return group
    try:
        backend = dist.get_backend(group)
    except (ValueError, RuntimeError):
        backend = type(group).__name__
    raise ValueError(f"this is not a swml group (its backend is {backend}): pass a group made "
                     "with backend='swml'")


def stats(group=None) -> dict:
    """The counters of a swml group (None: the default group), as a dict:

    rank, size, job, switch, datapath (udp/afxdp: the datapath of this rank's
    host), datapath_note (why a rank asked for auto got udp, else None), k,
    slots, hosts, ranks_per_host, leader (whether this rank streams for its
    host), switch_calls, switch_bytes (bytes this rank handed to the switch
    path), gloo_calls (Gloo's own collectives: name -> calls), fallbacks and
    fallback_reasons (calls the switch could be asked for but not carry:
    reason -> calls), packets and retransmissions (of the datapath, on a
    host's leader; None on the host's other ranks, whose data the leader
    streams)."""
    pg = swml_group(group)
    layout = pg.layout
    worker = pg.worker.stats() if pg.worker is not None else {}
    path = getattr(pg, "datapath", {}) or {}
    return {"rank": pg.rank(), "size": pg.size(),
            "job": path.get("job"), "switch": pg.options.switch,
            "datapath": path.get("datapath"), "datapath_note": path.get("note"),
            "k": pg.k, "slots": path.get("slots"),
            "hosts": layout.n_hosts, "ranks_per_host": len(layout.local_ranks),
            "leader": layout.is_leader,
            "switch_calls": pg.switch_calls, "switch_bytes": pg.calls.switch_bytes,
            "gloo_calls": dict(pg.calls.gloo_calls),
            "fallbacks": pg.fallbacks, "fallback_reasons": dict(pg._fallbacks.by_kind),
            "packets": worker.get("packets_sent"), "retransmissions": worker.get("retransmissions")}
