"""What identifies one collective call of a job, the same on every rank: its
call tag, its place in the job's packet stream (seq), and the error when the
ranks did not make the same call.

Tag: a 32-bit hash of (call number on this Worker, element count, dtype, op).
Every rank computes it alike for the same call, so the switch can tell when
contributions to one round come from different calls (a rank with another
length, dtype or op, or one call ahead): the round's RESULT then carries
SWML_FLAG_DISAGREE and every rank raises CallMismatch.

Seq: a worker counts the packets of its job from 0 (p_job, 64 bits; slot and
version follow from it, plans.py); the wire carries (seq_base + p_job) mod 2^32,
seq_base from the join. After a failed call every rank restarts its stream at
`resync_index(call_start, slots)`: the same on every rank that failed the same
call, past anything the call may have sent, on a boundary of both slot
versions. A call longer than SWML_SEQ_RESYNC_STRIDE packets is refused.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .. import wire

SEQ_MASK = 0xFFFFFFFF
#: The ops `allreduce` takes, by name -> the wire's SWML_OP_*.
OPS = wire.OPS
_TAG_INPUT = struct.Struct("!QQ16s8s")  # call number, count, dtype name, op name
_TAG_SHARD = struct.Struct("!Q")  # a reduce_scatter's elements a rank


class CallMismatch(RuntimeError):
    """The ranks of a job did not make the same call (length, dtype or op
    differ, or one rank is a call ahead): no rank got a result."""


def op_code(op: str) -> int:
    """SWML_OP_* for an op name; ValueError for anything else."""
    try:
        return OPS[op]
    except (KeyError, TypeError):
        raise ValueError(f"op must be one of {', '.join(OPS)}, not {op!r}") from None


def call_tag(number: int, count: int, dtype: np.dtype | str, op: str,
             precision: str = "32", shard: int = 0) -> int:
    """The 32-bit tag of call `number` (0, 1, ... on a Worker) reducing `count`
    elements of `dtype` with `op` at `precision`: what every rank computes
    alike. Precision "16" is hashed with the op ("sum/16"), so ranks that
    disagree on it raise CallMismatch; "32" leaves the tag as it was. A
    reduce_scatter's shard length (elements a rank) is hashed after the rest."""
    name = op if precision == "32" else f"{op}/{precision}"
    data = _TAG_INPUT.pack(number, count, np.dtype(dtype).name.encode(), name.encode())
    if shard:
        data += _TAG_SHARD.pack(shard)
    return int.from_bytes(hashlib.blake2b(data, digest_size=4, person=b"swml-tag").digest(), "big")


PRECISIONS = ("32", "16")


def check_precision(precision: str, dtype: np.dtype | str, op: str) -> None:
    """ValueError unless `precision` applies: "32" always; "16" (the 16-bit
    block format, docs/quantization.md) only to a float32 sum, the one
    reduction that is quantized."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "16" and (np.dtype(dtype) != np.float32 or op != "sum"):
        raise ValueError(
            f"precision '16' applies only to a float32 sum (it quantizes to 16 bits), "
            f"not to {np.dtype(dtype).name} {op}: int32 and min/max are exact in 32 bits")


@dataclass(frozen=True)
class Call:
    """One allreduce as the backends stream it."""
    number: int   # calls made on this Worker before it
    job: str
    count: int
    dtype: str    # numpy's name: "float32", "int32"
    op: str       # "sum", "min", "max"
    precision: str = "32"  # "16": the 16-bit block format (float32 sum only)
    refused: bool = False  # a tag no rank's real call has: the call fails on every rank
    # A reduce_scatter: elements of each rank's shard (0: an allreduce). Every
    # DATA packet names the rank keeping its block (plans.shard_owners), so a
    # switch with --fanout unicast sends the sum to that rank only.
    shard: int = 0

    @cached_property
    def op_code(self) -> int:
        return OPS[self.op]

    @cached_property
    def tag(self) -> int:  # read per packet: hashed once
        op = f"{self.op}/refused" if self.refused else self.op
        # ranks that disagree on the shards raise CallMismatch
        return call_tag(self.number, self.count, self.dtype, op, self.precision, self.shard)

    @cached_property
    def fmt(self) -> int:
        """The payload format on the wire (SWML_FMT_*): a float32 sum is
        quantized, to 16 bits or to 32 in offset binary (which the switch adds
        two elements at a time); int32 tensors and MIN/MAX go as int32."""
        if self.precision == "16":
            return wire.FMT_INT16
        if self.dtype == "float32" and self.op == "sum":
            return wire.FMT_OFFSET32
        return wire.FMT_INT32

    def __str__(self) -> str:
        what = "reduce_scatter" if self.shard else "allreduce"
        return f"{what} #{self.number} of job {self.job!r} ({self.count} {self.dtype}, {self.op})"

    def mismatch(self) -> CallMismatch:
        return CallMismatch(
            f"{self}: the ranks did not make the same call (length, dtype or op differ, "
            "or a rank is a call ahead or behind); no rank got a result, the job goes on "
            "with the next call")

    def too_long(self, npackets: int, k: int) -> ValueError:
        return ValueError(
            f"{self} needs {npackets} packets of {k} elements, more than one call may send "
            f"({wire.SEQ_RESYNC_STRIDE}): split the tensor")


@dataclass(frozen=True)
class CallSpan:
    """Where one call sits in the job's packet stream: packets
    start .. start + npackets - 1 of the job (p_job)."""
    start: int
    npackets: int
    seq_base: int

    def seq(self, p: int) -> int:
        """The wire seq of the call's packet p."""
        return (self.seq_base + self.start + p) & SEQ_MASK

    def packet_of(self, seq: int) -> int | None:
        """The call's packet with wire seq `seq`, or None (a seq of another
        call, before or after this one, modulo 2^32)."""
        p = (seq - self.seq_base - self.start) & SEQ_MASK
        return p if p < self.npackets else None


def check_length(call: Call, npackets: int, k: int) -> None:
    """Refuse, before anything is sent, a call too long to resync after."""
    if npackets > wire.SEQ_RESYNC_STRIDE:
        raise call.too_long(npackets, k)


def resync_index(call_start: int, slots: int) -> int:
    """Where the job's stream goes on after a failed call that started at
    packet `call_start`: the same on every rank that failed it."""
    period = 2 * slots
    end = call_start + wire.SEQ_RESYNC_STRIDE
    return -(-end // period) * period
