"""A job over several boxes: each tensor split over them by their capacity.

`Worker(switch=["10.0.0.1", "10.0.0.2"], ...)` joins the job on every box
(one token; on each its own key, slots and stream), then streams part of each
tensor through each box at once, every box on its own thread with its own
window, pacing, retransmissions and statistics (its own backend).

The split is the same on every rank by construction: it depends only on the
tensor's length, k and what the boxes said at join (their capacity in bits/s:
switch/capacity.py), never on a rank's timing. Parts are whole blocks of k
elements, each box's count of blocks in proportion to its capacity (equal
parts where a box does not say); so every block is quantized and summed as
through one box, and the result is the same, bit for bit
(docs/scale-out.md).
"""
from __future__ import annotations

import dataclasses
import ipaddress
import socket
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from .backend import Backend
from .box_watch import BoxSignal, BoxWatch, PartWatch
from .calls import Call
from .control import ControlClient, ControlError, JobInfo

MAX_BOXES = 8


def box_port(port: int, box: int, lanes: int) -> int:
    """The first UDP port of a Worker's box `box` (0, 1, ...): each box its
    lanes' ports, port + box x lanes + lane (docs/pytorch.md, "Subgroups")."""
    return port + box * lanes


def ports_used(switch: str | Sequence[str], lanes: int) -> int:
    """How many consecutive UDP ports from its port a Worker of `switch`'s
    boxes and `lanes` uses."""
    return box_port(0, len(parse_switches(switch)), lanes)


def parse_switches(switch: str | Sequence[str]) -> list[str]:
    """The boxes of `switch`: one address, "A,B,..." or a list of them, in
    order; ValueError (one line) for none, a duplicate or too many."""
    items = switch.split(",") if isinstance(switch, str) else list(switch)
    boxes = [str(b).strip() for b in items]
    if not boxes or any(not b for b in boxes):
        raise ValueError(f"switch must name one box or several, comma-separated, not {switch!r}")
    if len(boxes) > MAX_BOXES:
        raise ValueError(f"a job spans at most {MAX_BOXES} boxes, not {len(boxes)}")
    seen: dict[str, str] = {}
    for b in boxes:
        key = _address_of(b)
        if key in seen:
            raise ValueError(f"box {b} is given twice ({seen[key]} and {b} are one address): "
                             "list every box once")
        seen[key] = b
    return boxes


def _address_of(box: str) -> str:
    """What a box is, to tell duplicates: its IPv4 address (names resolved)."""
    try:
        return str(ipaddress.IPv4Address(box))
    except ValueError:
        try:
            return socket.gethostbyname(box)
        except OSError:
            return box   # unresolvable: the join says so, naming it


def block_shares(blocks: int, capacities: Sequence[int | None]) -> list[int]:
    """Blocks of k elements for each box, summing to `blocks`: in proportion
    to the capacities (equal where one is unknown), the remainder to the
    largest fractional parts, ties to the earlier box. Integers only, so
    every rank computes the same."""
    n = len(capacities)
    caps = list(capacities) if all(c for c in capacities) else [1] * n
    total = sum(caps)
    shares = [blocks * c // total for c in caps]
    rest = blocks - sum(shares)
    by_fraction = sorted(range(n), key=lambda i: (-(blocks * caps[i] % total), i))
    for i in by_fraction[:rest]:
        shares[i] += 1
    return shares


def split(n: int, k: int, capacities: Sequence[int | None]) -> list[tuple[int, int]]:
    """Each box's elements [start, end) of an n-element tensor."""
    shares = block_shares(-(-n // k), capacities)
    out, start = [], 0
    for s in shares:
        end = min(n, start + s * k)
        out.append((start, end))
        start = end
    return out


@dataclasses.dataclass
class Box:
    """One box of the job, as this rank holds it."""
    address: str
    control: ControlClient
    info: JobInfo
    backend: Backend
    signal: BoxSignal      # the backend's abort signal: the job's, or one call's interrupt
    lost: bool = False     # its last call found it lost (box_watch.py): close() asks it nothing

    def watch_part(self) -> PartWatch:
        """What the watch reads of this box during a call: its results, its answers."""
        return PartWatch(lambda: self.backend.stats()["results"], self.control.ping,
                         lambda: self.control.pongs, time.monotonic(),
                         self.backend.misroute_check())

    def stats(self) -> dict:
        return {"box": self.address, "capacity_bps": self.info.capacity_bps,
                "backend": self.backend.name, **self.backend.stats()}

    def close(self) -> None:
        """Leave the job on this box and release its datapath."""
        try:
            if not self.lost:     # a lost box would hold the leave for its timeout
                self.control.leave()
        except Exception:  # noqa: BLE001 - a box that is gone: nothing to leave
            pass
        finally:
            self.control.close()
            self.backend.close()


def check_same_k(boxes: list[Box]) -> None:
    """Every box of a job must aggregate the same k (a block is one packet on
    each): ControlError naming what each says."""
    ks = {b.info.k for b in boxes}
    if len(ks) > 1:
        said = ", ".join(f"{b.address} k={b.info.k}" for b in boxes)
        raise ControlError(f"the job's boxes aggregate different k ({said}): start every box "
                           "with the same -k")


class BoxError(RuntimeError):
    """A call failed on one box: says which (the failure's own type where
    callers tell them apart is kept: see `named`)."""


class BoxLost(BoxError, TimeoutError):
    """A box stopped answering during a call (box_watch.py): the message
    names the first in list order, `boxes` every box lost in the call. A
    TimeoutError, as a stall is."""

    def __init__(self, message: str, boxes: Sequence[str] = ()):
        super().__init__(message)
        self.boxes = tuple(boxes)


class CallInterrupted(RuntimeError):
    """The call was stopped by Worker.interrupt (the torch backend's, when
    another rank lost a box): says why."""


def lost_boxes(error: BaseException) -> tuple[str, ...]:
    """The boxes a failed call found gone (lost, or the job aborted there)."""
    return tuple(getattr(error, "lost_boxes", ()))


def named(box: Box, call: Call, e: BaseException) -> BaseException:
    """The error of `call` on `box`, as the same type, naming the box, with
    the lost boxes `e` lists (a new exception: the attribute would be lost)."""
    msg = f"box {box.address}: {e}"
    try:
        out = type(e)(msg)
    except Exception:  # noqa: BLE001 - a type that does not take one message
        out = BoxError(msg)
    if lost_boxes(e):
        out.lost_boxes = lost_boxes(e)
    return out


def _part(watch: BoxWatch, box: Box, part: np.ndarray, call: Call) -> BaseException | None:
    try:
        box.backend.allreduce(part, call)
        return None
    except BaseException as e:  # noqa: BLE001 - reported by BoxSplit.reduce, naming the box
        return e
    finally:
        watch.done(box.address)


class BoxSplit:
    """Streams each call's parts through every box at once (one box: its
    whole call), watched for a lost box (box_watch.py)."""

    def __init__(self, boxes: list[Box], box_timeout: float):
        self.boxes = boxes
        self.k = boxes[0].info.k
        self.capacities = [b.info.capacity_bps for b in boxes]
        self.watch = BoxWatch(box_timeout)
        self._pool = (ThreadPoolExecutor(max_workers=len(boxes) - 1, thread_name_prefix="swml-box")
                      if len(boxes) > 1 else None)
        self.interrupted: str | None = None   # why Worker.interrupt stopped the call in progress
        self._in_call = False
        if len(boxes) > 1:
            for box in boxes:
                box.control.abort.on_abort(
                    lambda reason, aborted=box: self._job_aborted_on(aborted, reason))

    def _job_aborted_on(self, aborted: Box, reason: str) -> None:
        """The job aborted on one box (its daemon stopped, a rank failed
        there) during a call: the call fails, and a peer rank that hears of
        it before it starts the call never streams its parts through the
        other boxes, so this rank's parts there would wait for it until the
        stall timeout. They stop now. Every later call of the Worker fails
        at once anyway, so no box's stream is needed in step afterwards."""
        if not self._in_call:
            return
        for box in self.boxes:
            if box is not aborted:
                box.signal.interrupt(f"box {aborted.address}: the job aborted there ({reason})")

    def begin(self) -> None:
        """A call begins: a box's interrupt was for the call before."""
        self.interrupted = None
        for box in self.boxes:
            box.signal.clear()

    def interrupt(self, reason: str) -> None:
        """Stop the call in progress on every box (CallInterrupted)."""
        self.interrupted = reason
        for box in self.boxes:
            box.signal.interrupt(f"interrupted: {reason}")

    def reduce(self, flat: np.ndarray, call: Call) -> None:
        """Reduce the 1-D array `flat` in place: part i through box i. A
        failure on any box fails the call, naming the box (a lost box first,
        else one whose job aborted, else the first box's in list order where
        several fail); every box finishes its part first, so no box is left
        mid-stream, but where the job aborted on a box: then the other parts
        stop at once (_job_aborted_on)."""
        work = []
        if self._pool is None:
            work.append((self.boxes[0], flat, call))
        else:
            for box, (a, b) in zip(self.boxes, split(flat.size, self.k, self.capacities)):
                if a != b:   # each part a call of its own on its box: its count in its tag
                    work.append((box, flat[a:b], dataclasses.replace(call, count=b - a, shard=0)))
        self.watch.begin({box.address: (box.watch_part(), box.signal) for box, _, _ in work})
        self._in_call = True
        try:
            if any(box.signal.for_good for box in self.boxes):   # aborted before it began
                for box in self.boxes:
                    box.signal.interrupt("the job aborted on another box")
            jobs: list[tuple[Box, Future]] = [
                (box, self._pool.submit(_part, self.watch, box, part, sub))
                for box, part, sub in work[1:]]
            errors: list[tuple[Box, BaseException]] = []
            if work:    # the first part on this thread, after the others start
                e = _part(self.watch, *work[0])
                if e is not None:
                    errors.append((work[0][0], e))
            errors += [(box, fut.result()) for box, fut in jobs if fut.result() is not None]
        finally:
            self._in_call = False
        lost, astray = self.watch.end()
        if errors:
            raise self._failure(errors, lost, astray, call)

    def _failure(self, errors: list[tuple[Box, BaseException]], lost: dict[str, str],
                 astray: dict[str, str], call: Call) -> BaseException:
        """The error the call raises: a lost box, else the first box's error
        (a part whose RESULTs went astray: a TimeoutError saying why)."""
        order = {id(b): i for i, b in enumerate(self.boxes)}
        errors.sort(key=lambda be: order[id(be[0])])
        gone = [b.address for b, _ in errors if b.address in lost or b.signal.for_good]
        for box, _ in errors:
            box.lost = box.address in lost
        # The cause first: a lost box, else a box whose job aborted for good
        # (the others' parts were stopped for it), else the first in order.
        box, e = next(((b, e) for b, e in errors if b.address in lost),
                      next(((b, e) for b, e in errors if b.signal.for_good), errors[0]))
        if box.address in lost:
            out: BaseException = BoxLost(f"box {box.address}: {lost[box.address]}", gone)
        elif box.address in astray:
            why = astray[box.address]
            out = TimeoutError(why if self._pool is None else f"box {box.address}: {why}")
        elif self.interrupted is not None and not box.signal.for_good:
            out = CallInterrupted(self.interrupted)
        elif self._pool is None:
            out = e     # one box: its error as it is
        else:
            out = named(box, call, e)
        out.lost_boxes = tuple(gone)
        if out is not e:
            out.__cause__ = e
        return out

    def close(self) -> None:
        self.watch.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
