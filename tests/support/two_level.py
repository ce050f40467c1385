"""The layout and the model shared by the lab's two-ranks-a-host torch tests
(tests/lab/test_torch_hosts.py, tests/lab/test_staging_lab.py): two hosts of two
ranks, a tiny model trained a few steps, and an all_gather of every rank's tensor."""
from __future__ import annotations

import torch

HOSTS, PER_HOST = 2, 2
WORLD = HOSTS * PER_HOST
RANK_DEADLINE_S = 120
STEPS = 4
PARAM_ATOL = 1e-5


def gather(t: torch.Tensor) -> list:
    """Every rank's `t` (CPU), as numpy arrays in rank order."""
    import torch.distributed as dist

    out = [torch.empty_like(t) for _ in range(WORLD)]
    dist.all_gather(out, t.contiguous())
    return [o.numpy() for o in out]


def model() -> torch.nn.Module:
    """The same small model on every rank (seeded)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
