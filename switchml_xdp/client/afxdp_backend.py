"""The `afxdp` backend: the C engine (switchml_xdp._engine) over an AF_XDP socket.

Set-up, per worker: hold the job's UDP port with a kernel socket (port.py: no
other socket on the host may bind it; it joins the job's multicast group so
IGMP snooping forwards the group here, last, once the datapath below is
attached and the link is up), take xdp/swml_redirect.c compiled for this
worker's port and IP (compile_redirect: the Worker compiles it before it
joins, so the join's barrier finds every rank a few milliseconds from
streaming), tell it the switch's data address and port and the job's
multicast group from the join's reply (set_peer), attach it to the worker's
interface (native XDP, generic if the driver has none), and open the
engine: a UMEM plus an AF_XDP socket on queue 0 at first (zero-copy where the driver
has it, else copy mode), inserted into the program's XSKMAP. From then on
the switch's RESULTs for this worker land in the socket's rx ring and
everything else still goes to the kernel stack. In copy mode the DATA goes
out through the port's UDP socket instead, runs of it as UDP GSO messages
(worker/port.h; the kernel would make an skb of each AF_XDP frame anyway,
and GSO makes one a run).

In a job with lanes, lane q has all of this on port + q and rx queue q: a
port-holding socket, an engine and its socket at XSKMAP[q], one program
for them all; the NIC must steer port + q to queue q (docs/performance.md,
"Several queues per worker").

A RESULT that the NIC puts on another receive queue than its lane's socket
(RSS on a NIC of several queues, with no ntuple rule for the port) cannot
reach that socket: the redirect program passes it to the stack, counted
(xdp_misqueued), and the engine reads it from the port's UDP socket
(stats' stray_results, worker/port.h), so the call goes on at the stack's
cost. After the call the lane's socket moves to the queue they came in on,
where no other lane's is (follow_results): RSS keeps a flow on one queue,
so from the next call on they come through AF_XDP. A verbose worker says
what moved, or once that RESULTs keep taking the stack, and which ntuple
rule would bring them to AF_XDP.

The calls, the abort and the counters are engine_backend.py's. The streaming
rules, packet format and quantization are those of the udp backend (plans.py,
quant.py; quant16.py at precision "16"), so both kinds of worker can share a
job, and so is the retransmission policy (retransmit.py; the engine's
estimator in worker/stream.c implements its rules).
"""
from __future__ import annotations

import os
import socket
import sys

from .. import bpf, net, wire
from .engine_backend import COALESCE, SPIN, EngineBackend, engine_missing, tunable
from .port import join_when_up, reserve_port

PROG_NAME = "swml_redirect"
SOURCE = "swml_redirect.c"
# Rows of the program's rx_counters (SWML_RX_* in SOURCE) and their stats' names.
RX_COUNTERS = ("xdp_redirected", "xdp_passed", "xdp_misqueued")
# SWML_AFXDP_RTO_INITIAL / _MIN / _MAX (seconds) override the policy's timeouts
# for experiments (RetransmitPolicy.with_env), SWML_AFXDP_SPIN and
# SWML_AFXDP_COALESCE the waiting (engine_backend.py: SPIN, COALESCE);
# SWML_AFXDP_UDP_TX=0 keeps the sends on the AF_XDP socket in copy mode too.
ENV_PREFIX = "SWML_AFXDP_"
# The port-holding socket takes the RESULTs the NIC put on another queue (the
# engine reads them there): room for as many as the udp backend's.
PORT_RCVBUF = 8 << 20


def unavailable_reason() -> str | None:
    """None if this process can use the afxdp backend, else a short reason."""
    missing = engine_missing()
    if missing:
        return missing
    if os.geteuid() != 0:
        return "needs root (AF_XDP)"
    return bpf.compiler_missing()


def compile_redirect(port: int, local_ip: str, lanes: int = 1) -> bpf.Program:
    """Compile and load the redirect program of a worker that receives at
    local_ip:port (lane q at port + q). It passes every frame until
    set_peer() says where its RESULTs come from. About a second of bcc:
    done before the join (api.py)."""
    defines = {"SWML_PORT": port, "SWML_LOCAL_IP": f"{wire.ip_to_be32(local_ip):#x}u",
               "SWML_LANES": lanes}
    try:
        return bpf.compile_program(SOURCE, PROG_NAME, defines)
    except bpf.BpfError as e:
        raise RuntimeError(f"cannot load the worker's XDP program ({SOURCE}): {e}") from e


def set_peer(prog: bpf.Program, switch_ip: str, switch_port: int, group_ip: str) -> None:
    """Tell the redirect program where its RESULTs come from: the switch's
    data address and port, and the job's multicast group (the join's reply)."""
    table = prog.table("peer")
    table[table.Key(0)] = table.Leaf(switch_ip=wire.ip_to_be32(switch_ip),
                                     group_ip=wire.ip_to_be32(group_ip),
                                     switch_port=socket.htons(switch_port))


def move_lane(prog: bpf.Program, lane: int, queue: int) -> None:
    """Tell the redirect program that lane `lane`'s socket is on rx queue `queue`."""
    table = prog.table("lane_queue")
    table[table.Key(lane)] = table.Leaf(queue + 1)


def take_misqueued_on(prog: bpf.Program, lane: int) -> int | None:
    """The rx queue lane `lane`'s last misqueued RESULT came in on since the
    last look (None: none came), and look no more at it."""
    table = prog.table("misqueued_on")
    on = table[table.Key(lane)].value
    if on:
        table[table.Key(lane)] = table.Leaf(0)
    return on - 1 if on else None


def copy_mode_sends(sock, switch_ip: str, switch_port: int, local_ip: str, iface: str) -> bool:
    """Whether the engine sends through the port's UDP socket `sock` while
    its AF_XDP socket is in copy mode (worker/port.h; the engine decides,
    once it knows the mode): where the kernel routes the switch's address
    out of `iface` from `local_ip`, as the AF_XDP frames go, and not under
    SWML_AFXDP_UDP_TX=0. `sock` is made non-blocking either way: the engine
    reads the strays from it."""
    sock.setblocking(False)
    if not tunable(ENV_PREFIX, "UDP_TX", 1):
        return False
    try:
        return net.route_to(switch_ip, switch_port) == (local_ip, iface)
    except net.NetError:
        return False


class AfxdpBackend(EngineBackend):
    name = "afxdp"
    env_prefix = ENV_PREFIX
    streams_lanes = True

    def __init__(self, *args, mode: str | None = None, spin: int | None = None,
                 prog: bpf.Program | None = None, **kwargs):
        """Backend's arguments (backend.py), and: `mode` the redirect program's
        XDP mode ("native", "generic"; None: native, else generic), `spin` the
        engine's empty polls before it sleeps (None: SPIN, or SWML_AFXDP_SPIN),
        `prog` the redirect program compile_redirect() made for this worker's
        port, IP and lanes before the join (None: compile it now); the backend
        owns it from here, closed with it, also when set-up fails."""
        reason = unavailable_reason()
        if reason:
            if prog is not None:
                prog.close()
            raise RuntimeError(f"afxdp backend unavailable: {reason}")
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            if prog is not None:
                prog.close()
            raise
        info, local = self.info, self.local
        self.iface = local.iface
        self.where = f"afxdp on {self.iface}"
        if info.lanes > 1:
            self.where += f" queues 0-{info.lanes - 1}"
        self._port_socks: list = []
        self._strays_told = False   # the verbose note on strays, once
        self._strays_seen = 0       # stray_results after the last call
        self._queues = list(range(info.lanes))   # lane q's socket's rx queue
        self._prog: bpf.Program | None = prog
        self._link: bpf.XdpLink | None = None
        try:
            # Bound now, a member last: see port.py for why the join waits.
            for lane in range(info.lanes):
                self._port_socks.append(reserve_port(info.port + lane, None, local.ip, PORT_RCVBUF))
            if self._prog is None:
                self._prog = compile_redirect(info.port, local.ip, info.lanes)
            set_peer(self._prog, info.switch_ip, info.switch_port, info.group_ip)
            self.mode = self._attach(self._prog.fd, mode, self.verbose)
            for lane, sock in enumerate(self._port_socks):
                self._open_lane(lane, sock, spin)
            join_when_up(self._port_socks[0], info.group_ip, local.ip, local.iface)
        except BaseException:
            self.close()
            raise
        self.abort_signal.on_abort(self._on_abort)  # at once if the job is already aborted

    def _open_lane(self, lane: int, sock, spin: int | None) -> None:
        """Lane `lane`'s engine: its AF_XDP socket on rx queue `lane`, its
        sends through `sock` (its port's) in copy mode."""
        info, local = self.info, self.local
        try:
            self._open(local.iface, self._prog.map_fd("xsks"), queue=lane, lane=lane,
                       spin=spin if spin is not None else tunable(ENV_PREFIX, "SPIN", SPIN),
                       coalesce=tunable(ENV_PREFIX, "COALESCE", COALESCE),
                       udp_fd=sock.fileno(),
                       udp_tx=copy_mode_sends(sock, info.switch_ip, info.switch_port, local.ip,
                                              self.iface))
        except OSError as e:
            if info.lanes == 1:
                raise
            raise OSError(e.errno, f"{e.strerror or e} (lane {lane} of {info.lanes} takes rx "
                                   f"queue {lane} of {self.iface}, which needs {info.lanes} "
                                   f"queues: `ethtool -L {self.iface} combined {info.lanes}`)") from None

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

    def _release(self) -> None:
        """Detach the program (closing its link), free it, give up the port."""
        if self._link is not None:
            self._link.close()
            self._link = None
        if self._prog is not None:
            self._prog.close()
            self._prog = None
        for sock in self._port_socks:
            sock.close()
        self._port_socks = []

    def stats(self) -> dict:
        """Counters: the engine's (engine_backend.py) and the redirect program's."""
        out = super().stats()
        out.update(self._rx_counters())
        return out

    def _rx_counters(self) -> dict:
        """The redirect program's RX_COUNTERS ({} once it is closed)."""
        prog = self._prog
        if prog is None or self._engine is None:
            return {}
        try:
            rows = prog.table("rx_counters")
            return {name: int(sum(rows[rows.Key(row)])) for row, name in enumerate(RX_COUNTERS)}
        except Exception:  # noqa: BLE001 - closed under us: the engine's counters are what matter
            return {}

    def _misqueued(self) -> int:
        return self._rx_counters().get("xdp_misqueued", 0)

    def _stall_hint(self) -> str:
        """Why a stalled call's RESULTs may never have reached the engine."""
        misqueued = self._misqueued()
        return f"; {self._misqueue_reason(misqueued)}" if misqueued else ""

    def _strays(self) -> int:
        """RESULTs the engines read from their ports' UDP sockets: those the
        NIC put on another receive queue (worker/port.h)."""
        return sum(engine.stray_results for engine in list(self._engines))

    def misroute_check(self):
        """RESULTs of this call that came in on another lane's queue and
        reached no engine through the stack either (a firewall on the port,
        say): however long the call waits, it gets none of them (backend.py)."""
        before = self._misqueued(), self._strays()

        def check() -> str | None:
            misqueued = self._misqueued() - before[0]
            if misqueued <= 0 or self._strays() > before[1]:
                return None
            return (f"{self._misqueue_reason(misqueued)}; they did not reach the port's UDP "
                    f"socket through the stack either (is UDP port {self.info.port} filtered?)")
        return check

    def allreduce(self, flat, call) -> None:
        try:
            super().allreduce(flat, call)
        finally:
            with self._call_lock:     # between calls: close() waits, no call runs
                if not self._closed and self._prog is not None:
                    moved = self.follow_results()
                    self._tell_strays(moved)

    def follow_results(self) -> list[int]:
        """Between calls: the lanes whose RESULTs came in on another rx
        queue than their sockets' have them moved to that queue, where no
        other lane's socket is (the redirect program kept the queue,
        misqueued_on); the lanes moved."""
        moved = []
        for lane, engine in enumerate(self._engines):
            queue = take_misqueued_on(self._prog, lane)
            if queue is None or queue in self._queues:
                continue
            where = (f"the RESULTs of port {self.info.port + lane} come in on receive queue "
                     f"{queue} of {self.iface}")
            try:
                engine.rebind(queue)
            except OSError as e:
                if self.verbose:
                    print(f"switchml-xdp: {where}, where its AF_XDP socket cannot move: {e}",
                          file=sys.stderr)
                continue
            move_lane(self._prog, lane, queue)
            if self.verbose:
                print(f"switchml-xdp: {where}: its AF_XDP socket moved there from queue "
                      f"{self._queues[lane]}", file=sys.stderr)
            self._queues[lane] = queue
            moved.append(lane)
        return moved

    def _tell_strays(self, moved: list[int]) -> None:
        """Once, where verbose: RESULTs of a call came through the stack and
        no socket could move to them (another lane's socket holds their queue)."""
        if not self.verbose or self._strays_told or not self._engines:
            return
        strays = self._strays()
        grew, self._strays_seen = strays > self._strays_seen, strays
        if grew and not moved:
            self._strays_told = True
            print(f"switchml-xdp: {self._misqueue_reason(self._misqueued())}; they reach "
                  "the engine through the kernel's UDP path, slower than AF_XDP's",
                  file=sys.stderr)

    def _misqueue_reason(self, misqueued: int) -> str:
        """`misqueued` RESULTs came in on the wrong receive queue: what the
        NIC must do about it, in one line."""
        iface, port, lanes = self.iface, self.info.port, self.info.lanes
        if lanes == 1:
            queue = self._queues[0]
            return (f"{misqueued} RESULT(s) came in on a receive queue of {iface} other than "
                    f"{queue}, where the engine's socket is: steer port {port} there (`ethtool -N "
                    f"{iface} flow-type udp4 dst-port {port} action {queue}`) or give it one queue "
                    f"(`ethtool -L {iface} combined 1`)")
        return (f"{misqueued} RESULT(s) came in on the wrong receive queue of {iface}: lane q's "
                f"port {port}+q must come in on queue q (`ethtool -N {iface} flow-type udp4 "
                f"dst-port {port}+q action q` for q in 0..{lanes - 1})")
