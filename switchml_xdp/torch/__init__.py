"""PyTorch integration (needs the `torch` extra: `pip install -e '.[torch]'` from a checkout).

Two ways in, both over a `switchml_xdp.Worker`:

* A DDP communication hook (`allreduce_hook`, `register_hook`): the process
  group (Gloo, say) sets the model up; every gradient bucket is then averaged
  through the switch.

      worker = Worker(switch_ip, "job1", rank, world)
      ddp = DistributedDataParallel(model)
      register_hook(ddp, worker)

* A torch.distributed backend named "swml", registered when this module is
  imported: all_reduce of float32/float16/bfloat16/int32 CPU or CUDA tensors (SUM,
  AVG, MIN, MAX), broadcast and barrier go through the switch, the rest
  through Gloo (process_group.py's docstring, docs/pytorch.md).

      import switchml_xdp.torch
      dist.init_process_group("swml", ..., pg_options=SwmlOptions(switch=switch_ip))

`stats(group=None)` says what a swml group did: calls through the switch and
through Gloo (and why), bytes, packets, retransmissions (group_stats.py).

float32 values are quantized per block of k elements (docs/quantization.md);
`quant.error_bound` bounds the difference from the exact sum. CUDA tensors
are quantized on the GPU and staged through pinned host memory in chunks
(staging.py; `StagingConfig` sets the chunks).
"""
from __future__ import annotations

try:
    import torch.distributed as _dist
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError("switchml_xdp.torch needs PyTorch: pip install -e '.[torch]' from a "
                      f"checkout (torch==2.13.0; docs/pytorch.md) ({e})") from e
if not _dist.is_available():  # pragma: no cover
    raise ImportError("switchml_xdp.torch needs a PyTorch build with torch.distributed")

# After the checks above, so that a missing PyTorch fails with their message.
from .group_report import stats
from .hook import HookState, allreduce_hook, register_hook
from .options import BACKEND_NAME, SwmlOptions
from .process_group import ProcessGroupSwml
from .registration import register
from .staging import StagingConfig

register()

__all__ = ["BACKEND_NAME", "HookState", "ProcessGroupSwml", "StagingConfig", "SwmlOptions",
           "allreduce_hook", "register", "register_hook", "stats"]
