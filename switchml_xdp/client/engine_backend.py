"""What the backends that stream through the C engine (switchml_xdp._engine,
worker/) share: `afxdp` opens it on an AF_XDP socket (afxdp_backend.py),
`udp` on its kernel UDP socket where the engine is built
(udp_engine_backend.py; worker/udp_port.h). The stream, its rules, its
waiting and its counters are the same C code either way.

Each allreduce is one call into C, which streams the whole tensor with the GIL
released; in a job with lanes (docs/performance.md, "Several queues per
worker"), one call a lane, each on its own engine, socket and thread, the
calling thread running lane 0. The job's AbortSignal raises a flag the C
loop reads and wakes the loop's sleep (Engine.wake); the loop's status code
becomes JobAborted / TimeoutError / CallMismatch here. A subclass opens the engine in its
constructor (`_open`) and releases its own datapath in `_release`.
"""
from __future__ import annotations

import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import wire
from ..layout import DEFINES
from .backend import STAT_KEYS, Backend
from .calls import Call, check_length
from .retransmit import ENGINE_POLICY

# Empty polls before the engine sleeps; worker/engine_policy.h says why 200.
SPIN = DEFINES["engine_policy.h"]["SWML_ENGINE_SPIN"]
# RESULTs a timed sleep lets gather on a slow link (0: off); engine_policy.h.
COALESCE = DEFINES["engine_policy.h"]["SWML_ENGINE_COALESCE"]
# A lane's stats that are a state, not a count: lane 0's stand for the rank's.
LANE_STATES = frozenset({"srtt_us", "rto_us", "rate_kbps", "dscp", "udp_gso", "udp_tx", "zero_copy",
                         "tensors", "reo_mult"})


def engine_module():
    """switchml_xdp._engine; ImportError where it was not built."""
    from .. import _engine
    return _engine


def engine_missing() -> str | None:
    """None if the engine module loads, else why not, in one line."""
    try:
        engine_module()
    except ImportError as e:
        return f"extension not built: {e} (pip install -e . with libxdp-dev and libbpf-dev)"
    return None


LANES_ENV = "SWML_LANES"


def lanes_from_env() -> int:
    """$SWML_LANES: a Worker's lanes where its caller does not say (1 where
    unset); ValueError in one line if it is not an integer."""
    text = os.environ.get(LANES_ENV, "").strip()
    try:
        return int(text) if text else 1
    except ValueError:
        raise ValueError(f"${LANES_ENV} must be an integer, got {text!r}") from None


def check_lanes(lanes: int) -> None:
    """A Worker's `lanes`: ValueError or RuntimeError with a one-line
    reason, before anything joins."""
    if (not isinstance(lanes, int) or isinstance(lanes, bool) or not 1 <= lanes <= wire.MAX_LANES
            or lanes & (lanes - 1)):
        raise ValueError(f"lanes must be a power of two in 1..{wire.MAX_LANES}, not {lanes!r}")
    if lanes == 1:
        return
    missing = engine_missing()
    if missing:
        raise RuntimeError(f"lanes need the C engine: {missing}")


def tunable(prefix: str, name: str, default: float) -> float:
    """Engine knobs can be overridden for experiments: <prefix><NAME>=value."""
    value = os.environ.get(f"{prefix}{name}")
    return type(default)(value) if value else default


class EngineBackend(Backend):
    """A Backend whose datapath is the C engine; see the module's docstring."""

    default_policy = ENGINE_POLICY
    precisions = ("32", "16")
    loop = "engine"                # which loop runs the stream (Worker.stats' "loop")
    where = "the engine's socket"  # names the datapath in error messages

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._call_lock = threading.Lock()  # held by allreduce; close() waits for it
        self._engines: list = []   # one a lane, lane q at [q]
        self._lanes_pool: ThreadPoolExecutor | None = None   # runs lanes 1.. of a call
        self._closed = False
        # The abort flag the C loop reads: a 4-byte aligned, writable buffer.
        self._abort = np.zeros(1, dtype=np.uint32)

    @property
    def _engine(self):
        """Lane 0's engine (None until opened)."""
        return self._engines[0] if self._engines else None

    def _open(self, *args, spin: int, coalesce: int, lane: int = 0, **kwargs) -> None:
        """Open lane `lane`'s engine: Engine(*args, **kwargs) with the job's
        keywords (the switch the only source of RESULTs; this lane's port),
        the timeouts and window; the subclass opens every lane in order, then
        follows the abort signal: self.abort_signal.on_abort(self._on_abort)."""
        info, local, policy = self.info, self.local, self.policy
        self._engines.append(engine_module().Engine(
            *args, self._abort, job=info.job_id, rank=info.rank, world=info.world, k=info.k,
            slots=info.slots, src_mac=wire.mac_to_bytes(local.mac),
            dst_mac=wire.mac_to_bytes(info.switch_mac), src_ip=socket.inet_aton(local.ip),
            dst_ip=socket.inet_aton(info.switch_ip), src_port=info.port + lane,
            dst_port=info.switch_port, key=info.key, result_key=info.result_key, auth=info.auth,
            seq_base=info.seq_base, rto_initial=policy.initial_s, rto_min=policy.min_s,
            rto_max=policy.max_s, rto_adaptive=policy.adaptive,
            stall_timeout=self.stall_timeout, spin=spin, window=self.window_policy.as_tuple(),
            coalesce=coalesce, lanes=info.lanes, lane=lane, **kwargs))
        if info.lanes > 1 and self._lanes_pool is None:
            self._lanes_pool = ThreadPoolExecutor(max_workers=info.lanes - 1,
                                                  thread_name_prefix=f"swml-lane-r{info.rank}")

    def _release(self) -> None:
        """The subclass's own datapath, after the engine closed."""

    def close(self) -> None:
        """Stop a running call, close the engine, release the datapath. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._abort[0] = 1  # a call still running in C returns at once: woken
        try:
            self._wake_all()
            with self._call_lock:
                for engine in self._engines:
                    engine.close()
            if self._lanes_pool is not None:
                self._lanes_pool.shutdown()
        finally:
            self._release()

    def _wake_all(self) -> None:
        for engine in self._engines:
            engine.wake()     # the call's sleep ends now (worker/stream.h, wake_fd)

    def _on_abort(self, reason: str) -> None:
        with self._lock:
            self._abort[0] = 1
            if not self._closed:
                self._wake_all()

    def allreduce(self, flat: np.ndarray, call: Call) -> None:
        """Reduce a 1-D C-contiguous float32/int32 array in place with call.op."""
        if self._closed:
            raise RuntimeError(f"the {self.name} backend is closed")
        if flat.dtype not in (np.float32, np.int32) or flat.ndim != 1 or not flat.flags.c_contiguous:
            raise TypeError("allreduce takes a 1-D C-contiguous float32 or int32 array")
        if not flat.size:
            return
        e = engine_module()
        npackets = e.packets(flat.size, self.info.k, self.info.slots, flat.dtype == np.float32,
                             call.op_code, self.info.lanes)
        check_length(call, npackets, self.info.k)
        with self._call_lock:
            with self._lock:    # the C loop's flag follows the signal: an interrupt is one call's
                if self._closed:
                    raise RuntimeError(f"the {self.name} backend is closed")
                self._abort[0] = self.abort_signal.reason is not None
            # call.tag covers the precision (calls.call_tag), so ranks that
            # disagree on it see DISAGREE. shard > 0 (a reduce_scatter): only
            # this rank's shard of flat is sure to hold the sum afterwards
            # (worker/stream.h).
            args = (flat, call.op_code, call.tag, call.fmt, call.shard)
            status = (self._engine.allreduce(*args) if len(self._engines) == 1
                      else self._allreduce_lanes(e, args))
        if status == e.OK:
            return
        if status == e.DISAGREE:
            raise call.mismatch()
        if status == e.ABORTED:
            self.abort_signal.raise_if_set(self.info.name)
            raise RuntimeError(f"the {self.name} backend was closed during the allreduce")
        if status == e.STALLED:
            raise TimeoutError(
                f"no result from the switch for {self.stall_timeout:g} s; waiting for slot(s) "
                f"{self._pending_slots()} of job {self.info.name!r} ({self.where})"
                f"{self._stall_hint()}")
        if status == e.E2BIG:  # checked above: only if the two counts ever differ
            raise call.too_long(npackets, self.info.k)
        raise OSError(f"the socket failed: {self.where} (engine status {status})")

    def _allreduce_lanes(self, e, args: tuple) -> int:
        """One call over every lane, each in its own thread (lane 0 in this
        one): the status that ended it. A lane that fails stops the others
        (the abort flag they share, and a wake), so every lane's stream moves
        on to the same resync point (worker/stream.c, resync_index)."""
        def lane(engine) -> int:
            status = engine.allreduce(*args)
            if status != e.OK:
                self._abort[0] = 1
                self._wake_all()
            return status

        others = [self._lanes_pool.submit(lane, engine) for engine in self._engines[1:]]
        statuses = [lane(self._engines[0])] + [f.result() for f in others]
        failed = [s for s in statuses if s != e.OK]
        if not failed:
            return e.OK
        # Past everything the call sent, on every lane alike: the furthest,
        # a failed lane's resync point (a lane that finished is before it).
        resync = max(engine.next_index for engine in self._engines)
        for engine in self._engines:
            engine.next_index = resync
        # Why it ended: a lane's own failure, not the stop it caused the others.
        own = [s for s in failed if s != e.ABORTED]
        return own[0] if own else e.ABORTED

    def _stall_hint(self) -> str:
        """What a stalled call's error adds about the datapath ("; ..."), if anything."""
        return ""

    def _pending_slots(self) -> list:
        return sorted(s for engine in self._engines for s in engine.pending_slots())

    def stats(self) -> dict:
        """Counters: STAT_KEYS (backend.py) and the engine's own; over
        lanes, the counts summed (LANE_STATES: lane 0's)."""
        if not self._engines:
            return dict.fromkeys(STAT_KEYS, 0)
        out = self._engine.stats()
        for engine in self._engines[1:]:
            for key, value in engine.stats().items():
                if key not in LANE_STATES:
                    out[key] += value
        if len(self._engines) > 1:
            out["lanes"] = len(self._engines)
        return out

    @property
    def next_index(self) -> int:
        return self._engine.next_index

    @next_index.setter
    def next_index(self, value: int) -> None:
        for engine in self._engines:
            engine.next_index = value
