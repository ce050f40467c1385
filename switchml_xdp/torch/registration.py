"""The `swml` backend's registration with torch.distributed (done on import
of switchml_xdp.torch), and the creator torch calls for each group."""
from __future__ import annotations

import torch
import torch.distributed as dist

from .options import BACKEND_NAME, SwmlOptions
from .process_group import ProcessGroupSwml


def _create(backend_opts, pg_options) -> ProcessGroupSwml:
    """The creator torch calls (extended API: it hands us pg_options)."""
    if pg_options is not None and not isinstance(pg_options, SwmlOptions):
        raise TypeError(f"the swml backend takes pg_options=SwmlOptions(...), "
                        f"not {type(pg_options).__name__}")
    return ProcessGroupSwml(backend_opts.store, backend_opts.group_rank, backend_opts.group_size,
                            backend_opts.timeout, pg_options, str(backend_opts.group_id))


def register() -> None:
    """Register the backend as "swml" (done on import of switchml_xdp.torch)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        # "cuda" where torch is built with it: CUDA tensors then reach this group
        # (staged through host memory, staging.py) instead of torch refusing them.
        devices = ["cpu", "cuda"] if torch.backends.cuda.is_built() else ["cpu"]
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=devices)
