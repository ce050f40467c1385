"""reduce_scatter through the switch: every rank hands its whole tensor to an
all_reduce and keeps its own shard of the sum (docs/pytorch.md, "What goes
through the switch", has the figures against Gloo's).

Each rank sends the whole tensor, where Gloo's reduce_scatter moves
(world-1)/world of it. Where each rank is its own host on the switch (its
Worker's rank is its group rank) and the tensor is a float32/int32 CPU one,
the call is the Worker's reduce_scatter: with `--fanout unicast` each rank
receives its shard's sums and only the header of the rest (docs/protocol.md,
"Shards"); otherwise every rank receives the whole sum. In the lab, where
the links are the limit it beat Gloo's from 4 ranks on; where the CPUs are,
Gloo's won (docs/pytorch.md has the figures). So it is off by default: a
group takes it only for inputs of at least `group.reduce_scatter_min_bytes`
bytes (default: SWML_REDUCE_SCATTER_MIN_BYTES from the environment, else
None: never), and never for what the switch does not reduce
(routing.allreduce_reason).
"""
from __future__ import annotations

import os

import torch
from torch._C._distributed_c10d import ReduceScatterOptions

from .routing import SWITCH_OPS, WORK_DTYPE, allreduce_reason, op_name
from .work import FutureWork

ENV_MIN_BYTES = "SWML_REDUCE_SCATTER_MIN_BYTES"


def min_bytes_from_env() -> int | None:
    """Inputs of at least this many bytes go through the switch; None (the
    variable unset or empty): none do."""
    raw = os.environ.get(ENV_MIN_BYTES, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise ValueError(f"{ENV_MIN_BYTES} must be a byte count (0 or more), not {raw!r}")
    return int(raw)


class SwitchReduceScatter:
    """The part of ProcessGroupSwml that does reduce_scatter (it comes before
    GlooSide among the bases: what it does not take goes on to Gloo's)."""

    @property
    def reduce_scatter_min_bytes(self) -> int | None:
        """Inputs of at least this many bytes take the switch (None: none);
        until set on the group, what the environment says."""
        return self.__dict__.get("_reduce_scatter_min_bytes", min_bytes_from_env())

    @reduce_scatter_min_bytes.setter
    def reduce_scatter_min_bytes(self, value: int | None) -> None:
        self._reduce_scatter_min_bytes = value

    def _takes(self, output: torch.Tensor, flat_numel: int, dtype, op) -> bool:
        limit = self.reduce_scatter_min_bytes
        if limit is None:
            return False
        nbytes = flat_numel * output.element_size()
        return (nbytes >= limit and flat_numel == output.numel() * self.size()
                and dtype == output.dtype and output.device.type == "cpu"
                and allreduce_reason("reduce_scatter", [output], op) is None)

    def _scatter_through_switch(self, output: torch.Tensor, flat: torch.Tensor, op) -> FutureWork:
        """Reduce `flat` (a copy: the caller's input is left as it was), then
        copy this rank's shard into `output`."""
        shard = flat.view(self.size(), -1)[self.rank()]

        def keep():
            output.detach().copy_(shard.view_as(output))
            return [output]

        if self._sharded(flat):
            name = op_name(op)
            return self._through_switch(flat, SWITCH_OPS[name], keep, avg=name == "AVG",
                                        outputs=(output,), what="reduce_scatter",
                                        reduce=self._scatter_among_hosts)

        def keep_after(fut):
            fut.value()   # re-raises the call's error
            return keep()

        return FutureWork(self._reduce([flat], op).get_future().then(keep_after))

    def _sharded(self, flat: torch.Tensor) -> bool:
        """Whether the Worker's reduce_scatter can take the call: one rank a
        host, the Worker's rank this group rank, a CPU tensor of its dtype."""
        return (self.local is None and self.worker is not None
                and self.worker.info.rank == self.rank() and not self._staged(flat)
                and WORK_DTYPE.get(flat.dtype) == flat.dtype)

    def _scatter_among_hosts(self, flat: torch.Tensor, op: str) -> None:
        self.worker.reduce_scatter(flat.numpy(), op)

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
