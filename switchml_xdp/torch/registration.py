"""The `swml` backend's registration with torch.distributed (done on import
of switchml_xdp.torch), and the creator torch calls for each group."""
from __future__ import annotations

import torch
import torch.distributed as dist

from .announce import announce
from .options import BACKEND_NAME, SwmlOptions
from .process_group import ProcessGroupSwml


def _devices() -> list[str]:
    # "cuda" where torch is built with it: CUDA tensors then reach this group
    # (staged through host memory, staging.py) instead of torch refusing them.
    return ["cpu", "cuda"] if torch.backends.cuda.is_built() else ["cpu"]


def give_c10d_its_backend(pg: ProcessGroupSwml) -> None:
    """c10d keeps a group's name, description, timeout and sequence numbers in
    the C++ backends registered with it (getGroupName raises "ProcessGroup
    name not set" on a group without one), and only a C++ backend can be
    registered. The group's own Gloo backend is that one: c10d's
    bookkeeping goes there, while every collective still reaches this
    Python group first (the trampoline calls its methods), so what the
    switch carries still goes through the switch. torch.compile's
    functional collectives and FSDP2 find the group by that name."""
    for device in _devices():
        pg._register_backend(torch.device(device), dist.ProcessGroup.BackendType.CUSTOM, pg.gloo)


def _create(backend_opts, pg_options) -> ProcessGroupSwml:
    """The creator torch calls (extended API: it hands us pg_options). torch
    calls it on a subgroup's members only (the others get a non-group)."""
    if pg_options is not None and not isinstance(pg_options, SwmlOptions):
        raise TypeError(f"the swml backend takes pg_options=SwmlOptions(...), "
                        f"not {type(pg_options).__name__}")
    if backend_opts.global_ranks_in_group:      # a subgroup (the default group's list is empty)
        default = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
        if pg_options is None and isinstance(default, ProcessGroupSwml):
            pg_options = default.options            # new_group() without pg_options: the default's
        pg_options = (pg_options or SwmlOptions()).for_subgroup(str(backend_opts.group_id))
    pg = ProcessGroupSwml(backend_opts.store, backend_opts.group_rank, backend_opts.group_size,
                          backend_opts.timeout, pg_options, str(backend_opts.group_id))
    give_c10d_its_backend(pg)
    announce(pg, backend_opts.store, str(backend_opts.group_id))
    return pg


def register() -> None:
    """Register the backend as "swml" (done on import of switchml_xdp.torch)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=_devices())
