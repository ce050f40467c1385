"""The `afxdp` backend: the C engine (switchml_xdp._engine) over an AF_XDP socket.

Set-up, per worker: hold the job's UDP port with a kernel socket (port.py: no
other socket on the host may bind it; it joins the job's multicast group so
IGMP snooping forwards the group here, last, once the datapath below is
attached and the link is up), compile xdp/swml_redirect.c for this
job (port, the worker's IP, the job's multicast group, the switch's address
and port as -D defines), attach it to the worker's interface (native XDP,
generic if the driver has none), and open the engine: a UMEM plus an AF_XDP
socket in copy mode on queue 0, inserted into the program's XSKMAP. From then
on the switch's RESULTs for this worker land in the socket's rx ring and
everything else still goes to the kernel stack.

Each allreduce is one call into C, which streams the whole tensor with the GIL
released. The streaming rules, packet format and quantization are those of the
udp backend (plans.py, quant.py; quant16.py at precision "16"), so both kinds
of worker can share a job, and so is the retransmission policy (retransmit.py;
the engine's estimator in worker/stream.c implements its rules). The job's AbortSignal raises a flag the
C loop reads, and wakes the loop's sleep (Engine.wake); the loop's status code becomes JobAborted /
TimeoutError / CallMismatch here.
"""
from __future__ import annotations

import os
import socket
import threading

import numpy as np

from .. import bpf, wire
from ..layout import DEFINES
from .backend import STAT_KEYS, Backend
from .calls import Call, check_length
from .control import JobInfo
from .port import join_when_up, reserve_port
from .retransmit import ENGINE_POLICY

PROG_NAME = "swml_redirect"
SOURCE = "swml_redirect.c"
QUEUE = 0                 # veth (and the lab) have one rx queue; the engine binds it
# SWML_AFXDP_RTO_INITIAL / _MIN / _MAX (seconds) override the policy's timeouts
# for experiments (RetransmitPolicy.with_env), SWML_AFXDP_SPIN and
# SWML_AFXDP_COALESCE the waiting below.
ENV_PREFIX = "SWML_AFXDP_"
# The port-holding socket reads nothing (frames come through AF_XDP): what the
# redirect program passes to the stack may fill this little and be dropped.
PORT_RCVBUF = 4096
# Empty rx-ring polls before the engine sleeps; worker/engine_policy.h says why 200.
SPIN = DEFINES["engine_policy.h"]["SWML_ENGINE_SPIN"]
# RESULTs a timed sleep lets gather on a slow link (0: off); engine_policy.h.
COALESCE = DEFINES["engine_policy.h"]["SWML_ENGINE_COALESCE"]


def _tunable(name: str, default: float) -> float:
    """Engine knobs can be overridden for experiments: SWML_AFXDP_<NAME>=value."""
    value = os.environ.get(f"{ENV_PREFIX}{name}")
    return type(default)(value) if value else default


def _engine_module():
    from .. import _engine
    return _engine


def unavailable_reason() -> str | None:
    """None if this process can use the afxdp backend, else a short reason."""
    try:
        _engine_module()
    except ImportError as e:
        return f"extension not built: {e} (pip install -e . with libxdp-dev and libbpf-dev)"
    if os.geteuid() != 0:
        return "needs root (AF_XDP)"
    return bpf.compiler_missing()


def compile_redirect(info: JobInfo, local_ip: str) -> bpf.Program:
    """Compile and load the redirect program for one job on one worker."""
    defines = {"SWML_PORT": info.port, "SWML_LOCAL_IP": f"{wire.ip_to_be32(local_ip):#x}u",
               "SWML_GROUP_IP": f"{wire.ip_to_be32(info.group_ip):#x}u",
               "SWML_SWITCH_IP": f"{wire.ip_to_be32(info.switch_ip):#x}u",
               "SWML_SWITCH_PORT": info.switch_port}
    try:
        return bpf.compile_program(SOURCE, PROG_NAME, defines)
    except bpf.BpfError as e:
        raise RuntimeError(f"cannot load the worker's XDP program ({SOURCE}): {e}") from e


class AfxdpBackend(Backend):
    default_policy = ENGINE_POLICY
    name = "afxdp"
    precisions = ("32", "16")
    env_prefix = ENV_PREFIX

    def __init__(self, *args, mode: str | None = None, spin: int | None = None, **kwargs):
        """Backend's arguments (backend.py), and: `mode` the redirect program's
        XDP mode ("native", "generic"; None: native, else generic), `spin` the
        engine's empty polls before it sleeps (None: SPIN, or SWML_AFXDP_SPIN)."""
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(f"afxdp backend unavailable: {reason}")
        super().__init__(*args, **kwargs)
        info, local = self.info, self.local
        self.iface = local.iface
        self._lock = threading.Lock()
        self._call_lock = threading.Lock()  # held by allreduce; close() waits for it
        self._engine = None
        self._port_sock = None
        self._prog: bpf.Program | None = None
        self._link: bpf.XdpLink | None = None
        self._closed = False
        # The abort flag the C loop reads: a 4-byte aligned, writable buffer.
        self._abort = np.zeros(1, dtype=np.uint32)
        spin = spin if spin is not None else _tunable("SPIN", SPIN)
        try:
            # Bound now, a member last: see port.py for why the join waits.
            self._port_sock = reserve_port(info.port, None, local.ip, PORT_RCVBUF)
            self._prog = compile_redirect(info, local.ip)
            self.mode = self._attach(self._prog.fd, mode, self.verbose)
            engine = _engine_module()
            self._engine = engine.Engine(
                local.iface, self._prog.map_fd("xsks"), self._abort,
                job=info.job_id, rank=info.rank, world=info.world, k=info.k, slots=info.slots,
                src_mac=wire.mac_to_bytes(local.mac), dst_mac=wire.mac_to_bytes(info.switch_mac),
                src_ip=socket.inet_aton(local.ip), dst_ip=socket.inet_aton(info.switch_ip),
                src_port=info.port, dst_port=info.switch_port, key=info.key,
                result_key=info.result_key, auth=info.auth, seq_base=info.seq_base, queue=QUEUE,
                rto_initial=self.policy.initial_s, rto_min=self.policy.min_s,
                rto_max=self.policy.max_s, rto_adaptive=self.policy.adaptive,
                stall_timeout=self.stall_timeout, spin=spin, window=self.window_policy.as_tuple(),
                coalesce=_tunable("COALESCE", COALESCE))
            join_when_up(self._port_sock, info.group_ip, local.ip, local.iface)
        except BaseException:
            self.close()
            raise
        self.abort_signal.on_abort(self._on_abort)  # at once if the job is already aborted

    # --- set-up and tear-down --------------------------------------------------
    def _attach(self, prog_fd: int, mode: str | None, verbose: bool) -> str:
        """Attach through a BPF link: it detaches when its fd closes, in close()
        or when the process dies, whatever namespace the closing thread is in."""
        try:
            current = bpf.attachment(self.iface)
            if current.mode is not None:
                raise RuntimeError(
                    f"{self.iface} already has an XDP program (id {current.prog_id}, "
                    f"{current.mode}): another afxdp worker on this interface, or a leftover "
                    f"(`ip link set dev {self.iface} xdp off` removes it); use backend='udp' "
                    "to share it")
            self._link = bpf.attach_link(self.iface, prog_fd, mode, quiet=not verbose)
        except bpf.XdpError as e:
            raise RuntimeError(str(e)) from None
        return self._link.mode

    def close(self) -> None:
        """Close the socket and free the UMEM, detach the program. Idempotent."""
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
            if self._link is not None:
                self._link.close()  # detaches the program
                self._link = None
            if self._prog is not None:
                self._prog.close()
                self._prog = None
            if self._port_sock is not None:
                self._port_sock.close()
                self._port_sock = None

    def _on_abort(self, reason: str) -> None:
        with self._lock:
            self._abort[0] = 1
            if self._engine is not None and not self._closed:
                self._engine.wake()     # the call's sleep ends now (worker/stream.h, wake_fd)

    # --- the datapath ------------------------------------------------------------
    def allreduce(self, flat: np.ndarray, call: Call) -> None:
        """Reduce a 1-D C-contiguous float32/int32 array in place with call.op."""
        if self._closed:
            raise RuntimeError("the afxdp backend is closed")
        if flat.dtype not in (np.float32, np.int32) or flat.ndim != 1 or not flat.flags.c_contiguous:
            raise TypeError("allreduce takes a 1-D C-contiguous float32 or int32 array")
        if not flat.size:
            return
        engine = _engine_module()
        npackets = engine.packets(flat.size, self.info.k, self.info.slots,
                                  flat.dtype == np.float32, call.op_code)
        check_length(call, npackets, self.info.k)
        with self._call_lock:
            with self._lock:    # the C loop's flag follows the signal: an interrupt is one call's
                if self._closed:
                    raise RuntimeError("the afxdp backend is closed")
                self._abort[0] = self.abort_signal.reason is not None
            # call.tag covers the precision (calls.call_tag) as on the udp
            # backend, so mixed ranks that disagree on it see DISAGREE.
            # shard > 0 (a reduce_scatter): only this rank's shard of flat is
            # sure to hold the sum afterwards (worker/stream.h).
            status = self._engine.allreduce(flat, call.op_code, call.tag, call.fmt,
                                            call.shard)
        if status == engine.OK:
            return
        if status == engine.DISAGREE:
            raise call.mismatch()
        if status == engine.ABORTED:
            self.abort_signal.raise_if_set(self.info.name)
            raise RuntimeError("the afxdp backend was closed during the allreduce")
        if status == engine.STALLED:
            raise TimeoutError(
                f"no result from the switch for {self.stall_timeout:g} s; waiting for slot(s) "
                f"{self._engine.pending_slots()} of job {self.info.name!r} (afxdp on {self.iface})")
        if status == engine.E2BIG:  # checked above: only if the two counts ever differ
            raise call.too_long(npackets, self.info.k)
        raise OSError(f"the AF_XDP socket on {self.iface} failed (engine status {status})")

    def stats(self) -> dict:
        """Counters: the udp backend's keys (packets_sent, retransmissions, results,
        duplicates, shadow_replies) plus the engine's and the redirect program's."""
        if self._engine is None:
            return dict.fromkeys(STAT_KEYS, 0)
        out = self._engine.stats()
        prog = self._prog
        if prog is not None:
            try:
                rows = prog.table("rx_counters")
                out["xdp_redirected"] = int(sum(rows[rows.Key(0)]))
                out["xdp_passed"] = int(sum(rows[rows.Key(1)]))
            except Exception:  # noqa: BLE001 - closed under us: the engine's counters are what matter
                pass
        return out

    @property
    def next_index(self) -> int:
        return self._engine.next_index
