"""What a worker streams for one tensor: a plan of packets, each with its
payload and the dependencies that say when it may be sent.

The streaming rule (docs/design.md, "Worker"): packet i of the job's life goes
to slot i mod S with version (i div S) mod 2, and may be sent only when the
slot's previous packet (i - S) has its result. Float tensors summed add one
rule: the payload of block b is quantized with the exponent agreed for it,
which travels `lag` packets ahead in the switch's `exp` field, so packet p also
waits for the result of packet p - lag. For int32, lag = S and the rule is
SwitchML's; float32 MIN and MAX need no exponent: they go through the
order-preserving map of switchml_xdp/ordered.py and stream like int32.
"""
from __future__ import annotations

import numpy as np

from .. import ordered, wire


class Int32Plan:
    """int32 tensors: packet p carries block p; the sum is exact (wrapping)."""

    def __init__(self, flat: np.ndarray, k: int, slots: int):
        self.flat, self.k = flat, k
        n = flat.size
        self.blocks = -(-n // k)
        self.npackets = self.blocks
        self.lag = slots
        self.padded = np.zeros((self.blocks, k), dtype=np.int32)
        self.padded.reshape(-1)[:n] = self.encode(flat)

    def encode(self, flat: np.ndarray) -> np.ndarray:
        return flat

    def decode(self, q: np.ndarray) -> np.ndarray:
        return q

    def payload(self, p: int) -> tuple[np.ndarray, int, int]:
        return self.padded[p], 0, 0

    def block_of(self, p: int) -> int:
        """The block packet p carries (negative: none, only an exponent); p
        may be an array of packets."""
        return p

    def result(self, p: int, values: np.ndarray | None, exp: int, flags: int) -> None:
        """Packet p's RESULT; values None: a header-only one (another rank's shard)."""
        if values is not None:
            self.padded[p] = values

    def finish(self) -> None:
        self.flat[:] = self.decode(self.padded.reshape(-1)[: self.flat.size])


class OrderedFloat32Plan(Int32Plan):
    """float32 MIN/MAX: each float as the int32 that sorts like it (ordered.py);
    exact, NaN per element as numpy's minimum/maximum give it."""

    def __init__(self, flat: np.ndarray, k: int, slots: int, op: int):
        self.op = op
        super().__init__(flat, k, slots)

    def encode(self, flat: np.ndarray) -> np.ndarray:
        return ordered.to_ordered(flat, self.op)

    def decode(self, q: np.ndarray) -> np.ndarray:
        return ordered.from_ordered(q)


class Float32Plan:
    """float32 tensors, quantized per block (docs/quantization.md).

    Packets 0..lag-1 carry only exponents (zero payload); packet p >= lag carries
    block p - lag, quantized with the exponent the switch returned with packet
    p - lag. Every packet p < blocks carries block p's local exponent.

    The work is done in runs of blocks, not a packet at a time: numpy's cost
    per call, not per element, is what a packet of k = 64 elements pays in
    Python. Payloads are quantized for every block whose exponent is known
    when the first of them is needed (new packets go in order, and each waits
    for the exponent of its own block, so by then those of up to lag - window
    more blocks are back); RESULT payloads are kept as they come and turned
    into sums once, at the end. The payloads cost one more array the size of
    the tensor (a resend must carry the same payload again)."""

    wire_dtype = np.int32  # a payload element: SWML_FMT_OFFSET32

    def __init__(self, flat: np.ndarray, k: int, slots: int, world: int, lanes: int = 1):
        from .. import quant

        self.quant = quant
        self.flat, self.k, self.world = flat, k, world
        self.blocks = -(-flat.size // k)
        self.lag = lag_of(self.blocks, slots, lanes)
        self.npackets = self.blocks + self.lag
        self.local_exp, self.nonfinite = quant.block_exponents(flat, k)
        self.global_exp = np.full(self.blocks, -128, dtype=np.int8)
        self.nonfinite_any = np.zeros(self.blocks, dtype=bool)
        self._zeros = np.zeros(k, dtype=self.wire_dtype)
        self.sums = np.zeros((self.blocks, k), dtype=self.wire_dtype)  # RESULT payloads
        self._payloads = np.zeros((self.blocks, k), dtype=self.wire_dtype)
        self._quantized = 0        # blocks [0, _quantized) have their payload
        self._have_exp = np.zeros(self.blocks, dtype=bool)
        self._exp_known = 0        # blocks [0, _exp_known) have their global exponent

    def payload(self, p: int) -> tuple[np.ndarray, int, int]:
        exp = int(self.local_exp[p]) if p < self.blocks else -128
        b = p - self.lag
        if b < 0:
            return self._zeros, exp, 0
        if b >= self._quantized:
            lo, hi = self._quantized, max(self._exp_known, b + 1)
            self._payloads[lo:hi] = self.quantize(self.flat[lo * self.k:hi * self.k],
                                                  self.global_exp[lo:hi])
            self._quantized = hi
        return self._payloads[b], exp, wire.FLAG_NONFINITE if self.nonfinite[b] else 0

    def quantize(self, x: np.ndarray, exp: np.ndarray) -> np.ndarray:
        """Payloads of the blocks of x, shape (len(exp), k): SWML_FMT_OFFSET32
        (calls.Call.fmt)."""
        return self.quant.to_offset(self.quant.quantize(x, self.k, exp, self.world), self.world)

    def sums_of(self, payloads: np.ndarray) -> np.ndarray:
        """The switch's sums from RESULT payloads."""
        return self.quant.from_offset(payloads, self.world)

    def block_of(self, p: int) -> int:
        return p - self.lag

    def result(self, p: int, values: np.ndarray | None, exp: int, flags: int) -> None:
        if p < self.blocks:
            self.global_exp[p] = exp
            self._have_exp[p] = True
            while self._exp_known < self.blocks and self._have_exp[self._exp_known]:
                self._exp_known += 1
        b = p - self.lag
        if b >= 0 and values is not None:
            self.sums[b] = values
            self.nonfinite_any[b] = bool(flags & wire.FLAG_NONFINITE)

    def finish(self) -> None:
        self.flat[:] = self.dequantize(self.sums_of(self.sums))

    def dequantize(self, sums: np.ndarray) -> np.ndarray:
        return self.quant.dequantize(sums, self.global_exp, self.nonfinite_any, self.world,
                                     self.flat.size)


class Float16Plan(Float32Plan):
    """float32 sums in the 16-bit block format (docs/quantization.md, "The
    16-bit format"): the same exponent round, int16 payloads quantized with
    F16 = 13 - E, RESULTs the switch's int32 sum scaled back by L."""

    wire_dtype = np.int16  # SWML_FMT_INT16

    def __init__(self, flat: np.ndarray, k: int, slots: int, world: int, lanes: int = 1):
        from .. import quant16

        self.quant16 = quant16
        super().__init__(flat, k, slots, world, lanes)

    def quantize(self, x: np.ndarray, exp: np.ndarray) -> np.ndarray:
        return self.quant16.quantize16(x, self.k, exp)

    def sums_of(self, payloads: np.ndarray) -> np.ndarray:
        return payloads  # the switch scaled them back into 16 bits

    def dequantize(self, sums: np.ndarray) -> np.ndarray:
        return self.quant16.dequantize16(sums, self.global_exp, self.nonfinite_any,
                                         self.world, self.flat.size)


def shard_owners(plan, n: int, k: int, shard: int, world: int) -> np.ndarray:
    """The DATA `owner` byte of each of the plan's packets for a
    reduce_scatter with `shard` elements a rank (shard 0: all zeros): 1 + the
    rank whose shard holds the whole of the packet's block, or 0 where the
    block straddles two shards or the packet carries none (its RESULT then
    goes whole to every rank). worker/stream.c's swml_shard_owner is the C twin."""
    owners = np.zeros(plan.npackets, dtype=np.uint8)
    if not shard:
        return owners
    blocks = np.arange(-(-n // k), dtype=np.int64)
    first = blocks * k // shard
    last = (np.minimum(blocks * k + k, n) - 1) // shard
    by_block = np.where((first == last) & (first < world), first + 1, 0).astype(np.uint8)
    b = plan.block_of(np.arange(plan.npackets, dtype=np.int64))
    owners[b >= 0] = by_block[b[b >= 0]]
    return owners


def streamed(array: np.ndarray) -> np.ndarray:
    """The 1-D array the backends stream for a call on `array` (any shape,
    C-contiguous): the array itself, flat; for an empty one a single zero of
    its dtype. An empty call so streams as a one-element call of its dtype,
    op and format, the same packets on both datapaths, and is numbered like
    any call: its tag (count 0) tells it from a call that is not empty, which
    then raises CallMismatch rather than waiting for a stall
    (docs/protocol.md, "The worker's side of the data plane")."""
    return array.reshape(-1) if array.size else np.zeros(1, array.dtype)


def make_plan(flat: np.ndarray, k: int, slots: int, world: int, op: int = wire.OP_SUM,
              fmt: int = wire.FMT_INT32, lanes: int = 1):
    """The plan for reducing `flat` with `op` (SWML_OP_*) in payload format
    `fmt` (SWML_FMT_INT16 only for a float32 sum: calls.check_precision),
    over a job with `lanes` lanes."""
    if fmt == wire.FMT_INT16:
        return Float16Plan(flat, k, slots, world, lanes)
    if flat.dtype == np.int32:
        return Int32Plan(flat, k, slots)
    if flat.dtype == np.float32:
        if op == wire.OP_SUM:
            return Float32Plan(flat, k, slots, world, lanes)
        return OrderedFloat32Plan(flat, k, slots, op)
    raise TypeError(f"allreduce supports float32 and int32 arrays, not {flat.dtype}")


def lag_of(blocks: int, slots: int, lanes: int = 1) -> int:
    """A float32 sum's lag: packet p carries block p - lag. The blocks are
    rounded up to the job's lanes so that packet p and packet p - lag are in
    one lane (worker/stream.h: swml_stream_lag)."""
    return min(slots, -(-blocks // lanes) * lanes)


def packets_needed(n: int, dtype: np.dtype, k: int, slots: int, op: int = wire.OP_SUM,
                   lanes: int = 1) -> int:
    """How many packets make_plan's plan for n elements sends (without
    building it), every lane's of a job with `lanes` lanes together."""
    blocks = -(-n // k)
    if np.dtype(dtype) == np.float32 and op == wire.OP_SUM:
        return blocks + lag_of(blocks, slots, lanes)
    return blocks
