"""The local reduce of one host's ranks through shared memory
(docs/pytorch.md, "The local reduce").

`SharedMemoryLocalGroup` is hosts.py's local group for CPU tensors: the ranks
of a host reduce into their leader (local rank 0), the leader streams the
host's sum through the switch, and the leader's result, or its error, goes
back to the others, all through one segment (shm_segment.py) instead of
TCP on loopback.

A call moves in chunks of one slot (slot_bytes); each rank's region has
two slots, so a rank fills one while the leader reduces the other:

    non-leader r:  wait consumed >= what slot s held; copy chunk c into its
                   slot s; (chunk 0: the call's header); posted[r] = (call, c)
    leader:        wait posted[r] >= (call, c) for every r; (chunk 0: check
                   the headers agree); flat[c] op= slot s of every r;
                   consumed = (call, c)
    leader, after the switch:  wait taken[r] >= what its slot s held; copy
                   the result's chunk c into it; result = (call, c)
    non-leader r:  wait result >= (call, c); copy it out; taken[r] = (call, c)

A token (call, c) is call << 32 | c: it only grows, over chunks and calls, so
every wait is a comparison with one word that a single rank writes. A call
the leader fails (its error, a disagreement among the host's ranks, a rank
that does not come) publishes failed_call = call after the message: every
wait of that call on the other ranks ends and raises the leader's message,
and `consumed` jumps to the call's end, so the next call starts clean.

A rank that publishes a word rings its bell (a futex word of its line);
a wait checks its word, yields a few times, then sleeps on the bell of the
rank it waits for, up to the process group's timeout; a peer process that
has exited is noticed within a second. The words are published after
the data they announce by plain stores: correct on x86-64's total store
order (the lab's and the switch's hosts); the segment is not meant for
weakly ordered CPUs without a fence here.
"""
from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable

import torch

from . import shm_segment as seg_
from .shm_segment import Segment

_OPS = {"SUM": 1, "MIN": 2, "MAX": 3}
_DTYPES = {torch.float32: 1, torch.int32: 2}
_CALL_END = (1 << 32) - 1           # the chunk index that stands for "all of the call"
_SPINS = 20                         # yields before sleeping: a peer a few µs away
_LIVENESS_EVERY_S = 0.5


class LocalGroupError(RuntimeError):
    """A host's ranks could not complete a local call: a rank that did not
    come in time, one that exited, or ranks that disagree on the call."""


def _token(call: int, chunk: int) -> int:
    return call << 32 | chunk


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _process_gone(pid: int, pid_ns: int) -> bool:
    """Whether a peer process has exited (or is a zombie); unknown (False)
    where it lives in another pid namespace, where its pid means nothing here."""
    if pid <= 0 or pid_ns != _pid_namespace():
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (FileNotFoundError, ProcessLookupError):
        return True
    except OSError:
        return False


def _token_call(token: int) -> int:
    return token >> 32


class SharedMemoryLocalGroup:
    """One host's ranks over one shared segment: reduce into the leader, then
    the leader's result (or its error) back to everyone. Same interface as
    hosts.LoopbackLocalGroup."""

    transport = "shm"

    def __init__(self, segment: Segment, local_rank: int, global_ranks: tuple[int, ...],
                 timeout: datetime.timedelta):
        self.segment = segment
        self.segment_name = segment.name
        self.local_rank = local_rank
        self.global_ranks = global_ranks
        self.timeout_s = timeout.total_seconds()
        self.patience_s = self.timeout_s    # for the leader's result (result_patience)
        self.calls = 0                  # calls that reached share (the result or the error)
        self.chunks = 0                 # chunks this rank moved through the segment
        self._call = 0
        self._slot_tokens = [0] * seg_.SLOTS   # what this rank last put in each of its slots
        line = segment.rank_lines[local_rank]
        line[seg_.PID], line[seg_.PID_NS] = os.getpid(), _pid_namespace()

    def result_patience(self, seconds: float) -> None:
        """Wait up to `seconds` for the leader's result: a leader that
        recovers from a lost box redoes the call first (box_failover.py)."""
        self.patience_s = max(self.timeout_s, seconds)

    @property
    def is_leader(self) -> bool:
        return self.local_rank == 0

    @property
    def _others(self) -> range:
        return range(1, self.segment.geometry.n_ranks)

    def _chunks(self, flat: torch.Tensor):
        """(chunk index, start, stop) over flat, one slot each; one empty
        chunk for an empty tensor, so that every call meets."""
        per = self.segment.geometry.slot_bytes // flat.element_size()
        n = flat.numel()
        for c in range(max(1, -(-n // per))):
            yield c, c * per, min(n, (c + 1) * per)

    # -- the two steps ----------------------------------------------------------
    def reduce_to_leader(self, flat: torch.Tensor, op: str) -> None:
        """op: SUM, MIN or MAX; flat (contiguous 1-D float32/int32) is the
        leader's input to the switch after; the others' flat is left as is."""
        self._call += 1
        if flat.dtype not in _DTYPES or not flat.is_contiguous():
            raise ValueError(f"the shared-memory local group reduces contiguous float32/int32, "
                             f"not {flat.dtype}")
        if self.is_leader:
            self._gather_into(flat, op)
        else:
            self._post(flat, op)

    def share(self, flat: torch.Tensor, error: BaseException | None) -> None:
        """The leader's result (or error) to every rank of the host; on the
        others, raises the leader's error as a RuntimeError."""
        self.calls += 1
        if self.is_leader:
            if error is not None:
                self._fail(f"{type(error).__name__}: {error}")
                raise error
            self._publish_result(flat)
        else:
            self._take_result(flat)

    # -- leader -------------------------------------------------------------------
    def _gather_into(self, flat: torch.Tensor, op: str) -> None:
        seg, call = self.segment, self._call
        lines = seg.rank_lines
        for c, a, b in self._chunks(flat):
            tok = _token(call, c)
            self._wait(lambda: [r for r in self._others if int(lines[r][seg_.POSTED]) < tok],
                       f"its part of local call {call}", failing=True)
            if c == 0:
                self._check_headers(flat, op)
            dst = flat[a:b]
            for r in self._others:
                src = seg.slot(r, c, flat.dtype)[:b - a]
                if op == "SUM":
                    dst.add_(src)
                elif op == "MIN":
                    torch.minimum(dst, src, out=dst)
                else:
                    torch.maximum(dst, src, out=dst)
            seg.leader_line[seg_.CONSUMED] = tok
            seg.ring(0)
            self.chunks += 1

    def _check_headers(self, flat: torch.Tensor, op: str) -> None:
        want = (self._call, flat.numel(), _DTYPES[flat.dtype], _OPS[op])
        for r in self._others:
            line = self.segment.rank_lines[r]
            got = tuple(int(line[w]) for w in (seg_.CALL, seg_.NUMEL, seg_.DTYPE, seg_.OP))
            if got != want:
                msg = (f"the ranks of a host disagree on local call {self._call}: rank "
                       f"{self.global_ranks[0]} has (call, elements, dtype, op) = {want}, rank "
                       f"{self.global_ranks[r]} {got}")
                self._fail(msg)
                raise LocalGroupError(msg)

    def _publish_result(self, flat: torch.Tensor) -> None:
        seg, call = self.segment, self._call
        lines = seg.rank_lines
        for c, a, b in self._chunks(flat):
            held = self._slot_tokens[c % seg_.SLOTS]
            self._wait(lambda: [r for r in self._others if int(lines[r][seg_.TAKEN]) < held],
                       f"taking the result of local call {_token_call(held)}", failing=True)
            seg.slot(0, c, flat.dtype)[:b - a].copy_(flat[a:b])
            tok = _token(call, c)
            seg.leader_line[seg_.RESULT] = tok
            seg.ring(0)
            self._slot_tokens[c % seg_.SLOTS] = tok
            self.chunks += 1

    def _fail(self, message: str) -> None:
        """Publish this call's failure: the message, the call's end as
        consumed (so that no rank waits for a slot), then failed_call."""
        line = self.segment.leader_line
        self.segment.write_message(message)
        line[seg_.CONSUMED] = max(int(line[seg_.CONSUMED]), _token(self._call, _CALL_END))
        line[seg_.FAILED_CALL] = self._call
        self.segment.ring(0)

    # -- the others ---------------------------------------------------------------
    def _post(self, flat: torch.Tensor, op: str) -> None:
        seg, call, me = self.segment, self._call, self.local_rank
        line, leader = seg.rank_lines[me], seg.leader_line
        for c, a, b in self._chunks(flat):
            held = self._slot_tokens[c % seg_.SLOTS]
            self._wait_for_leader(lambda: int(leader[seg_.CONSUMED]) >= held,
                                  f"a free slot of local call {call}")
            seg.slot(me, c, flat.dtype)[:b - a].copy_(flat[a:b])
            if c == 0:
                line[seg_.CALL], line[seg_.NUMEL] = call, flat.numel()
                line[seg_.DTYPE], line[seg_.OP] = _DTYPES[flat.dtype], _OPS[op]
            tok = _token(call, c)
            line[seg_.POSTED] = tok
            seg.ring(me)
            self._slot_tokens[c % seg_.SLOTS] = tok
            self.chunks += 1

    def _take_result(self, flat: torch.Tensor) -> None:
        seg, call = self.segment, self._call
        line, leader = seg.rank_lines[self.local_rank], seg.leader_line
        for c, a, b in self._chunks(flat):
            tok = _token(call, c)
            self._wait_for_leader(lambda: int(leader[seg_.RESULT]) >= tok,
                                  f"the result of local call {call}", self.patience_s)
            flat[a:b].copy_(seg.slot(0, c, flat.dtype)[:b - a])
            line[seg_.TAKEN] = tok
            seg.ring(self.local_rank)
            self.chunks += 1

    def _wait_for_leader(self, ready: Callable[[], bool], what: str,
                         timeout_s: float | None = None) -> None:
        """Wait for the leader, or for its failure of this call (raised here,
        with the leader's message; taken jumps to the call's end so that the
        leader never waits for this rank on it)."""
        leader = self.segment.leader_line

        def failed() -> bool:
            return int(leader[seg_.FAILED_CALL]) >= self._call

        self._wait(lambda: [] if ready() or failed() else [0], what, failing=False,
                   timeout_s=timeout_s)
        if not ready():
            line = self.segment.rank_lines[self.local_rank]
            line[seg_.TAKEN] = max(int(line[seg_.TAKEN]), _token(self._call, _CALL_END))
            self.segment.ring(self.local_rank)
            raise RuntimeError(f"the host's leader (rank {self.global_ranks[0]}) failed this "
                               f"call: {self.segment.read_message()}")

    # -- waiting --------------------------------------------------------------
    def _wait(self, missing: Callable[[], list[int]], what: str, failing: bool,
              timeout_s: float | None = None) -> None:
        """Until missing() (the local ranks not there yet) is empty: a few
        yields, then asleep on the first missing rank's bell. A
        LocalGroupError naming the missing ranks on the timeout, or as soon
        as one of them has exited. failing: the leader publishes that error
        as this call's failure (so the ranks that did come raise it too)."""
        if not missing():
            return
        start, timeout_s = time.monotonic(), timeout_s or self.timeout_s
        deadline, next_check = start + timeout_s, start + _LIVENESS_EVERY_S
        spins = 0
        while True:
            gone = missing()
            if not gone:
                return
            seen = self.segment.bell(gone[0])   # before the check: no ring is missed
            gone = missing()
            if not gone:
                return
            now = time.monotonic()
            problem = None
            if now >= deadline:
                problem = f"did not come within {timeout_s:g} s"
            elif now >= next_check:
                next_check = now + _LIVENESS_EVERY_S
                if any(self._gone(r) for r in gone):
                    problem = "has exited"
            if problem:
                who = (f"the host's leader (rank {self.global_ranks[0]})" if gone == [0] else
                       "rank " + ", ".join(str(self.global_ranks[r]) for r in gone) + " of this host")
                msg = (f"rank {self.global_ranks[self.local_rank]} waited {now - start:.1f} s "
                       f"for {what}: {who} {problem}")
                if failing:
                    self._fail(msg)
                raise LocalGroupError(msg)
            if spins < _SPINS:
                spins += 1
                os.sched_yield()
            else:
                self.segment.sleep_on(gone[0], seen, min(_LIVENESS_EVERY_S, deadline - now))

    def _gone(self, local_rank: int) -> bool:
        line = self.segment.rank_lines[local_rank]
        return _process_gone(int(line[seg_.PID]), int(line[seg_.PID_NS]))

    def shutdown(self) -> None:
        self.segment.unlink()       # done after set-up already; a no-op then
        self.segment.close()
