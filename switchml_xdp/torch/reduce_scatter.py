"""reduce_scatter through the switch: every rank hands its whole tensor to an
all_reduce and keeps its own shard of the sum (docs/pytorch.md, "What goes
through the switch", has the figures against Gloo's).

Each rank sends and receives the whole tensor, where Gloo's reduce_scatter
moves (world-1)/world of it. In the lab it was slower than Gloo's at every
size on both datapaths, so it is off by default: a group takes it only for
inputs of at least `reduce_scatter_min_bytes` bytes (None: never), and never
for what the switch does not reduce (routing.allreduce_reason).
"""
from __future__ import annotations

import torch
from torch._C._distributed_c10d import ReduceScatterOptions

from .routing import allreduce_reason
from .work import FutureWork

# Inputs of at least this many bytes go through the switch; None: none do
# (the measurement in docs/pytorch.md found no size where it wins).
REDUCE_SCATTER_MIN_BYTES = None


class SwitchReduceScatter:
    """The part of ProcessGroupSwml that does reduce_scatter (it comes before
    GlooSide among the bases: what it does not take goes on to Gloo's)."""

    reduce_scatter_min_bytes = REDUCE_SCATTER_MIN_BYTES

    def _takes(self, output: torch.Tensor, flat_numel: int, dtype, op) -> bool:
        if self.reduce_scatter_min_bytes is None:
            return False
        nbytes = flat_numel * output.element_size()
        return (nbytes >= self.reduce_scatter_min_bytes and flat_numel == output.numel() * self.size()
                and dtype == output.dtype and output.device.type == "cpu"
                and allreduce_reason("reduce_scatter", [output], op) is None)

    def _scatter_through_switch(self, output: torch.Tensor, flat: torch.Tensor, op) -> FutureWork:
        """all_reduce `flat` (a copy: the caller's input is left as it was),
        then copy this rank's shard into `output`."""
        shard = flat.view(self.size(), -1)[self.rank()]

        def keep_shard(fut):
            fut.value()   # re-raises the call's error
            output.detach().copy_(shard.view_as(output))
            return [output]

        return FutureWork(self._reduce([flat], op).get_future().then(keep_shard))

    def _reduce_scatter_base(self, output, input, opts=None):
        opts = opts or ReduceScatterOptions()
        if self._takes(output, input.numel(), input.dtype, opts.reduceOp):
            return self._scatter_through_switch(output, input.detach().reshape(-1).clone(),
                                                opts.reduceOp)
        return super()._reduce_scatter_base(output, input, opts)

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = opts or ReduceScatterOptions()
        if len(outputs) == 1 and len(input_lists) == 1:
            out, parts = outputs[0], input_lists[0]
            if (len(parts) == self.size() and all(p.shape == out.shape for p in parts)
                    and self._takes(out, out.numel() * len(parts), parts[0].dtype, opts.reduceOp)
                    and all(p.dtype == out.dtype and p.device == out.device for p in parts)):
                flat = torch.cat([p.detach().reshape(-1) for p in parts])
                return self._scatter_through_switch(out, flat, opts.reduceOp)
        return super().reduce_scatter(outputs, input_lists, opts)
