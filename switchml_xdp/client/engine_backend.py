"""What the backends that stream through the C engine (switchml_xdp._engine,
worker/) share: `afxdp` opens it on an AF_XDP socket (afxdp_backend.py),
`udp` on its kernel UDP socket where the engine is built
(udp_engine_backend.py; worker/udp_port.h). The stream, its rules, its
waiting and its counters are the same C code either way.

Each allreduce is one call into C, which streams the whole tensor with the GIL
released. The job's AbortSignal raises a flag the C loop reads and wakes the
loop's sleep (Engine.wake); the loop's status code becomes JobAborted /
TimeoutError / CallMismatch here. A subclass opens the engine in its
constructor (`_open`) and releases its own datapath in `_release`.
"""
from __future__ import annotations

import os
import socket
import threading

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
        self._engine = None
        self._closed = False
        # The abort flag the C loop reads: a 4-byte aligned, writable buffer.
        self._abort = np.zeros(1, dtype=np.uint32)

    def _open(self, *args, spin: int, coalesce: int, **kwargs) -> None:
        """Open the engine: Engine(*args, **kwargs) with the job's keywords
        (the switch the only source of RESULTs), the timeouts and window;
        the subclass then follows the abort signal:
        self.abort_signal.on_abort(self._on_abort)."""
        info, local, policy = self.info, self.local, self.policy
        self._engine = engine_module().Engine(
            *args, self._abort, job=info.job_id, rank=info.rank, world=info.world, k=info.k,
            slots=info.slots, src_mac=wire.mac_to_bytes(local.mac),
            dst_mac=wire.mac_to_bytes(info.switch_mac), src_ip=socket.inet_aton(local.ip),
            dst_ip=socket.inet_aton(info.switch_ip), src_port=info.port,
            dst_port=info.switch_port, key=info.key, result_key=info.result_key, auth=info.auth,
            seq_base=info.seq_base, rto_initial=policy.initial_s, rto_min=policy.min_s,
            rto_max=policy.max_s, rto_adaptive=policy.adaptive,
            stall_timeout=self.stall_timeout, spin=spin, window=self.window_policy.as_tuple(),
            coalesce=coalesce, **kwargs)

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
            if self._engine is not None:
                self._engine.wake()
                with self._call_lock:
                    self._engine.close()
        finally:
            self._release()

    def _on_abort(self, reason: str) -> None:
        with self._lock:
            self._abort[0] = 1
            if self._engine is not None and not self._closed:
                self._engine.wake()     # the call's sleep ends now (worker/stream.h, wake_fd)

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
                             call.op_code)
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
            status = self._engine.allreduce(flat, call.op_code, call.tag, call.fmt, call.shard)
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
                f"{self._engine.pending_slots()} of job {self.info.name!r} ({self.where})")
        if status == e.E2BIG:  # checked above: only if the two counts ever differ
            raise call.too_long(npackets, self.info.k)
        raise OSError(f"the socket failed: {self.where} (engine status {status})")

    def stats(self) -> dict:
        """Counters: STAT_KEYS (backend.py) and the engine's own."""
        if self._engine is None:
            return dict.fromkeys(STAT_KEYS, 0)
        return self._engine.stats()

    @property
    def next_index(self) -> int:
        return self._engine.next_index

    @next_index.setter
    def next_index(self, value: int) -> None:
        self._engine.next_index = value
