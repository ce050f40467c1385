"""Which calls the switch carries: the dtypes, ops and tensors the `swml`
process group hands to the Worker, and the reason when it cannot
(docs/pytorch.md, "What goes through the switch")."""
from __future__ import annotations

import torch
from torch._C._distributed_c10d import ReduceOp

from .staging import ops_for

# dtype -> the dtype the Worker reduces it as. float16/bfloat16 widen to float32
# exactly (every value, NaN and inf included), so the result is float32's,
# rounded once on the way back.
WORK_DTYPE = {torch.float32: torch.float32, torch.int32: torch.int32,
              torch.float16: torch.float32, torch.bfloat16: torch.float32}
# ReduceOp name -> the Worker's op (AVG: a sum, divided by the world size after).
SWITCH_OPS = {"SUM": "sum", "AVG": "sum", "MIN": "min", "MAX": "max"}
WHAT_THE_SWITCH_DOES = ("the switch does SUM/AVG/MIN/MAX of float32, int32, float16, bfloat16 "
                        "and broadcast of any dtype, on CPU and CUDA tensors")
# The collectives that Gloo does on a swml group: they move each rank's own
# data, which a switch that adds cannot help with.
GLOOS_BY_DESIGN = "all_gather, reduce_scatter, gather, scatter, reduce, all_to_all and send/recv"


# ProcessGroup methods -> the torch.distributed call users know them by.
_USER_NAMES = {"allgather": "all_gather", "_allgather_base": "all_gather_into_tensor",
               "all_gather_single": "all_gather_into_tensor", "alltoall": "all_to_all",
               "alltoall_base": "all_to_all_single", "all_to_all_single": "all_to_all_single",
               "_reduce_scatter_base": "reduce_scatter_tensor",
               "reduce_scatter_single": "reduce_scatter_tensor"}


def user_name(method: str) -> str:
    return _USER_NAMES.get(method, method)


def where_calls_go(first: str) -> str:
    """The line a swml group says once, at its first call that Gloo does by
    design (FSDP's all_gather, say): where each collective goes."""
    return (f"switchml_xdp: on this swml group {user_name(first)} goes through Gloo, as "
            f"{GLOOS_BY_DESIGN} do (Gloo does them faster than a switch that adds); "
            "all_reduce, broadcast and barrier go through the switch "
            "(said once per group; docs/pytorch.md, \"What goes through the switch\")")


def op_name(op) -> str:
    for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"):
        if op == getattr(ReduceOp, name, None):
            return name
    return str(op)


def tensor_reason(collective: str, tensors: list[torch.Tensor]) -> str | None:
    """Why these tensors cannot be handed to the Worker at all (None if they can)."""
    if len(tensors) != 1 and collective != "all_reduce_coalesced":
        return f"{collective} of a list of {len(tensors)} tensors"
    if not tensors:
        return f"{collective} of no tensors"
    if len({t.device for t in tensors}) != 1:
        return f"{collective} of tensors on several devices"
    device = tensors[0].device
    if device.type != "cpu" and ops_for(device) is None:
        # CUDA tensors are staged through host memory (staging.py); a device
        # without streams and events there stays with Gloo.
        return f"{collective} on {device.type} tensors"
    if any(t.layout != torch.strided for t in tensors):
        return f"{collective} on {tensors[0].layout} tensors"
    if any(t.is_quantized for t in tensors):
        return f"{collective} on quantized tensors"
    return None


def allreduce_reason(collective: str, tensors: list[torch.Tensor], op) -> str | None:
    """Why this all_reduce cannot go through the switch (None if it can); a
    ValueError for what no backend reduces exactly (an integer average)."""
    name = op_name(op)
    dtypes = {t.dtype for t in tensors}
    if name == "AVG" and any(not (d.is_floating_point or d.is_complex) for d in dtypes):
        # Raised on every rank alike, before anything is sent: nobody waits.
        raise ValueError(
            f"{collective} with ReduceOp.AVG on {', '.join(sorted(map(str, dtypes)))}: an "
            "integer average is not exact (Gloo refuses it too); use SUM and divide as "
            "the application needs")
    reason = tensor_reason(collective, tensors)
    if reason:
        return reason
    if len(dtypes) != 1 or next(iter(dtypes)) not in WORK_DTYPE:
        return f"{collective} on {', '.join(sorted(str(d) for d in dtypes))}"
    if name not in SWITCH_OPS:
        return f"{collective} {name}"
    if any(t.is_conj() or t.is_neg() for t in tensors):
        return f"{collective} {name} on tensors with a pending conj/neg view"
    return None
