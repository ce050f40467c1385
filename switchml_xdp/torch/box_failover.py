"""The `swml` group keeps training when boxes are lost (docs/pytorch.md, "A
lost box"; docs/scale-out.md, "Failures").

A call that fails because boxes were lost (BoxLost, or the job aborted on a
box: client/boxes.py) is not raised. The rank says so on the group's store,
and every rank joins in: the one that failed, one still inside its next
call (interrupted: a watcher thread reads the store while it runs), one
idle after its last call (the watcher queues a catch-up on the group's
thread). Each posts the first call it has not completed and the boxes it
found lost; every rank decides from all the posts alike (box_agreement.py):
the boxes lost are the union, the call to redo is the earliest. Every rank
warns once, naming the boxes, closes its Worker and joins a new job over
the boxes left (the split is then that of a Worker built over that list),
or where none is left goes on through a Gloo group of its own; then the
call is redone from the input each rank kept, and the calls go on.

A rank that received every result of the call before the box died (it is
`ahead`) has handed its result on already: it takes part in the redo with
the input it kept and drops the redo's result, which is the same, bit for
bit, through any boxes (a block is quantized with its agreed exponent and
summed as int32 on one box, whichever: docs/scale-out.md). Through Gloo it
would not be: then every rank raises FailoverError for that call instead of
diverging.

Lost boxes are looked at again every SWML_BOX_RETRY_CALLS calls (100): each
rank's watcher tries their control ports in the background, and at that
call boundary the ranks post which they reached; boxes every rank reached
join the next job.

With several ranks a host the failover works among the hosts: the hosts'
leaders are its parties (host index, number of hosts), as they are the
job's members. Each leader keeps its host's sum as a call's input, agrees
and redoes with the other leaders, and shares the redone result with its
host's ranks, which wait for it in the local share as for any call (for
longer: result_patience). Where no box is left, the Gloo group is the
leaders' alone; a call a host's own ranks failed then fails on every host
through one status round before the sum (as refuse_call does on a box).
The other ranks warn with their leader's words (host_notices.py).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import socket
import threading
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceOptions

from ..client.api import Worker
from ..client.boxes import CallInterrupted, lost_boxes, parse_switches
from .box_agreement import FailoverError, agree, post, remaining, retry_due, retry_every, returning
from .gloo_side import open_gloo
from .host_notices import HostNotices, NoticeListener
from .options import SwmlOptions

WATCH_S = 0.1           # how often the watcher reads the store
REACH_EVERY_S = 2.0     # how often it tries the lost boxes' control ports
REACH_TIMEOUT_S = 1.0
REJOIN_TIMEOUT_S = 15.0  # a new job's join, every rank at the same moment
_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


@dataclasses.dataclass(frozen=True)
class WorkerRecipe:
    """How this group's host leader joins its job on a list of boxes."""
    options: SwmlOptions
    job: str
    token: str
    host_index: int
    n_hosts: int
    port: int | None
    stall_timeout: float

    def make(self, boxes, join_timeout: float, generation: int = 0) -> Worker:
        o = self.options
        job = f"{self.job}-g{generation}" if generation else self.job
        return Worker(boxes, job, self.host_index, self.n_hosts, iface=o.iface, backend=o.backend,
                      port=self.port, control_port=o.control_port, join_timeout=join_timeout,
                      stall_timeout=self.stall_timeout, verbose=o.verbose, token=self.token,
                      lanes=o.lanes)


def _is_box_failure(error: BaseException) -> bool:
    return bool(lost_boxes(error)) or isinstance(error, CallInterrupted)


def _why(error: BaseException) -> str:
    """A failure's words for the agreement: a lost box's or an abort's (an
    interrupt only repeats another rank's)."""
    return str(error).splitlines()[0] if lost_boxes(error) and str(error) else ""


class BoxFailover:
    """Runs the group's calls through its Worker (`group.worker`, replaced
    when the boxes change) or Gloo, and recovers from lost boxes."""

    def __init__(self, group, store: dist.Store, recipe: WorkerRecipe, timeout_s: float,
                 gloo: Callable[[dist.Store], object], submit: Callable,
                 party: tuple[int, int] | None = None, tell: Callable[[str], None] | None = None):
        """party: (this party, parties): the host's index and the number of
        hosts (default: the group's rank and size); tell: to say each
        warning to the host's other ranks too; both only where they have
        several ranks."""
        self.group, self.recipe, self.submit, self._tell = group, recipe, submit, tell
        self.rank, self.size = party or (group.rank(), group.size())
        self.status_round = party is not None and party[1] != group.size()
        self.store = dist.PrefixStore("swml-failover/", store)
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._open_gloo, self._gloo = gloo, None
        self.all_boxes = parse_switches(recipe.options.switch)
        self.boxes = list(self.all_boxes)
        self.every = retry_every()
        self.generation = 0         # jobs joined since the first: one per change of boxes
        self.call = 0               # calls made (the same numbers on every rank)
        self.saved: dict[int, tuple] = {}   # the last two calls' (input, op, refused)
        self._lost_at: dict[str, float] = {}            # box -> when it left the job
        self._probes: dict[str, tuple[float, bool]] = {}  # box -> (when tried, reached)
        self.in_call = False
        self._caught_up = -1
        self._pending: BaseException | None = None
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="swml-box-failover", daemon=True)
        self._watcher.start()

    # -- the calls -----------------------------------------------------------------
    def allreduce(self, x: np.ndarray, op: str, refused: bool = False) -> None:
        """One call of the group, in place; on the group's thread."""
        if self._pending is not None:
            error, self._pending = self._pending, None
            raise error
        c = self.call
        if retry_due(c, remaining(self.all_boxes, self.boxes), self.every):
            self._retry(c)
        self.saved[c] = (x.copy(), op, refused)
        self.saved.pop(c - 2, None)
        self.in_call = True
        try:
            self._call(x, op, c, refused)
        finally:
            self.in_call = False
            self.call = c + 1

    def _call(self, x: np.ndarray, op: str, c: int, refused: bool = False) -> None:
        """Call c, redone after each recovery from its kept input."""
        while True:
            try:
                return self._through(x, op, refused)
            except BaseException as e:
                if self.group.worker is None or not _is_box_failure(e):
                    raise
                self._recover(c, lost_boxes(e), _why(e))
                x[...] = self.saved[c][0]

    def _through(self, x: np.ndarray, op: str, refused: bool = False) -> None:
        worker = self.group.worker
        if worker is not None:
            if refused:
                worker.refuse_call(x.size, str(x.dtype), op)
            else:
                worker.allreduce(x, op)
            return
        if self._gloo is None:      # every rank here at the same call: a collective
            self._gloo = self._open_gloo(dist.PrefixStore("gloo/", self.store))
        if self.status_round and self._gloo_round(np.array([int(refused)], np.int32), "max")[0]:
            if refused:
                return
            raise RuntimeError("another host's ranks failed this call (its leader refused it "
                               "in the Gloo group of the hosts' leaders)")
        self._gloo_round(x, op)

    def _gloo_round(self, x: np.ndarray, op: str) -> np.ndarray:
        opts = AllreduceOptions()
        opts.reduceOp = _OPS[op]
        self._gloo.allreduce([torch.from_numpy(x)], opts).wait(self.timeout)
        return x

    def refuse_call(self, count: int, dtype: str = "float32", op: str = "sum") -> None:
        """This host's ranks failed the call before their leader could give
        it: the leader takes its turn (the Worker's refuse_call, or a status
        round among the leaders) so that it fails on every host, and the
        calls stay numbered alike."""
        self.allreduce(np.zeros(count, dtype=dtype), op, refused=True)

    def _say(self, message: str) -> None:
        """A warning of this party, and of the other ranks of its host."""
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        if self._tell is not None:
            self._tell(message)

    # -- the agreement -------------------------------------------------------------
    def _exchange(self, key: str, value) -> list:
        """Post `value`, then every rank's, in rank order; FailoverError
        naming the ranks that did not post within the timeout."""
        self.store.set(f"{key}/{self.rank}", json.dumps(value))
        keys = [f"{key}/{r}" for r in range(self.size)]
        try:
            self.store.wait(keys, self.timeout)
        except Exception:  # noqa: BLE001 - torch's store error: said below, naming the ranks
            missing = [r for r, k in enumerate(keys) if not self.store.check([k])]
            raise FailoverError(f"rank(s) {missing} did not join the agreement on lost boxes "
                                f"within {self.timeout.total_seconds():g} s") from None
        return [json.loads(self.store.get(k)) for k in keys]

    def _recover(self, first_unfinished: int, lost, why: str = "") -> None:
        """Agree on the lost boxes with every rank, go on without them, and
        take part in the redo of a call this rank had completed."""
        g, worker = self.generation, self.group.worker
        tree = worker is not None and worker.info.parent is not None   # a rack box's job
        self.store.set(f"g{g}/failed", "1")     # the other ranks' watchers read it
        agreed = agree(self._exchange(f"g{g}/post", post(first_unfinished, lost, tree, why)),
                       self.all_boxes)
        left = remaining(self.boxes, agreed.lost)
        where = ", ".join(left) if left else "gloo (no box left)"
        said = f" ({self._parties[:-1]} {agreed.why[0]}: {agreed.why[1]})" if agreed.why else ""
        self._say(f"switchml_xdp: box(es) {', '.join(agreed.lost) or '(none)'} lost at swml "
                  f"call #{agreed.call} (agreed by all {self.size} {self._parties}): that call "
                  f"and the next go through {where}{said}")
        self._rebuild(left)
        if agreed.ahead and self.group.worker is None:
            raise FailoverError(f"call #{agreed.call} gave its result on {self._parties[:-1]}(s) "
                                f"{list(agreed.ahead)} before box(es) {', '.join(agreed.lost)} "
                                "were lost, and no box is left to redo it exactly: Gloo's sum "
                                "would differ from theirs")
        if self.rank in agreed.ahead:
            scratch, op, refused = self.saved[agreed.call]
            self._call(scratch.copy(), op, agreed.call, refused)   # the same result: dropped

    @property
    def _parties(self) -> str:
        return "host leaders" if self.status_round else "ranks"

    def _rebuild(self, boxes: list[str]) -> bool:
        """Leave the job and join a new one over `boxes` (none: Gloo); False
        where a rank could not join (then Gloo)."""
        old, self.group.worker = self.group.worker, None
        if old is not None:
            old.forget(set(self.boxes) - set(boxes))
            old.close()
        self.generation += 1
        joined = not boxes
        if boxes:
            worker, why = None, ""
            try:
                worker = self.recipe.make(boxes, REJOIN_TIMEOUT_S, self.generation)
            except Exception as e:  # noqa: BLE001 - every rank learns it below
                why = f"{type(e).__name__}: {e}"
            said = [w for w in self._exchange(f"g{self.generation}/joined", why) if w]
            joined = not said
            if joined:
                self.group.worker = worker
            else:
                if worker is not None:
                    worker.close()
                self._say(f"switchml_xdp: the ranks could not join box(es) {', '.join(boxes)} "
                          f"({said[0]}): calls go to gloo")
        self._set_boxes(boxes if joined else [])
        return joined

    def _set_boxes(self, boxes: list[str]) -> None:
        """The job's boxes now; a box that leaves them is reached again only
        by a try that began after it left (_reached)."""
        self.boxes = boxes
        for b in self.all_boxes:
            if b in boxes:
                self._lost_at.pop(b, None)
            else:
                self._lost_at.setdefault(b, time.monotonic())

    def _reached(self) -> list[str]:
        """The lost boxes this rank's last try reached, tried since they were lost."""
        out = []
        for b in remaining(self.all_boxes, self.boxes):
            tried, ok = self._probes.get(b, (0.0, False))
            if ok and tried > self._lost_at.get(b, time.monotonic()):
                out.append(b)
        return out

    def _retry(self, c: int) -> None:
        """At a call boundary: the lost boxes every rank reached come back."""
        reached = self._exchange(f"g{self.generation}/reach{c}", self._reached())
        boxes = returning(self.all_boxes, self.boxes, reached)
        if boxes == self.boxes:
            return
        before = self.boxes
        self._say(f"switchml_xdp: box(es) {', '.join(b for b in boxes if b not in before)} "
                  f"answer every rank again: from swml call #{c} calls go through "
                  f"{', '.join(boxes)}")
        if not self._rebuild(boxes) and before:
            self._rebuild(before)

    # -- the watcher ---------------------------------------------------------------
    def _watch(self) -> None:
        next_reach = 0.0
        while not self._stop.wait(WATCH_S):
            try:
                self._look()
                lost = remaining(self.all_boxes, self.boxes)
                if lost and time.monotonic() >= next_reach:
                    for b in lost:
                        tried = time.monotonic()
                        self._probes[b] = (tried, self._reach(b))
                    next_reach = time.monotonic() + REACH_EVERY_S
            except Exception:  # noqa: BLE001 - a store going away at shutdown: the calls say it
                pass

    def _look(self) -> None:
        """Another rank lost boxes: stop this rank's call, or catch up."""
        g, worker = self.generation, self.group.worker
        if worker is None or not self.store.check([f"g{g}/failed"]):
            return
        if g != self.generation:    # this rank recovered meanwhile: `worker` is closed
            return
        if self.in_call:
            worker.interrupt(f"another rank lost a box during the group's calls (generation {g})")
        elif self._caught_up != g:
            self._caught_up = g
            self.submit(self._catch_up, g)

    def _catch_up(self, g: int) -> None:
        """An idle rank joins the agreement (on the group's thread)."""
        if g != self.generation:
            return
        self.in_call = True
        try:
            self._recover(self.call, ())
        except BaseException as e:  # noqa: BLE001 - raised by this rank's next call
            self._pending = e
        finally:
            self.in_call = False

    def _reach(self, box: str) -> bool:
        try:
            socket.create_connection((box, self.recipe.options.control_port),
                                     timeout=REACH_TIMEOUT_S).close()
            return True
        except OSError:
            return False

    def close(self) -> None:
        self._stop.set()
        self._watcher.join()
        if self._gloo is not None:
            self._gloo.shutdown()


def failover_for(group, store: dist.Store, recipe: WorkerRecipe, timeout: datetime.timedelta,
                 route_iface: str) -> BoxFailover | NoticeListener:
    """The group's failover on a host's leader (among the hosts' leaders);
    on the host's other ranks, what hears their leader's warnings."""
    layout, local = group.layout, group.local
    failover_s = min(max(timeout.total_seconds(), 10.0), 120.0)
    if local is not None:
        local.result_patience(result_patience(timeout.total_seconds(), failover_s))
    if not layout.is_leader:
        return NoticeListener(store, layout.host_index, layout.local_ranks[0])
    party, parties, gloo_iface = layout.host_index, layout.n_hosts, recipe.options.gloo_iface
    several = parties != group.size()
    return BoxFailover(group, store, recipe, failover_s,
                       lambda s: open_gloo(s, party, parties, timeout, gloo_iface, route_iface),
                       group._pipeline.submit, party=(party, parties) if several else None,
                       tell=HostNotices(store, party).tell if local is not None else None)


def result_patience(timeout_s: float, failover_s: float) -> float:
    """How long a host's ranks wait for their leader's result: the group's
    timeout, plus what the leader's recovery may take (the agreement, a
    join, the agreement on it, twice where a returning box fails); a leader
    that exits is still noticed within a second (shm_local.py)."""
    return timeout_s + 2 * (REJOIN_TIMEOUT_S + 2 * failover_s)
