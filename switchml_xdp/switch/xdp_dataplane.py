"""The XDP data plane: xdp/swml_switch.c compiled for one interface, attached
to it, its maps pinned under /sys/fs/bpf/swml/IFACE.

Specialisation happens at load time through compiler defines (k, slot count,
port, pin directory), so every bound in the program is a constant the verifier
can see. Program and pins stay when the daemon dies: the data plane goes on
serving its running jobs, `status` and `down` find it from any shell, and a
restarted daemon adopts it (the new program reuses the pinned maps and
replaces the old one in one netlink call: the data plane never stops).

With --fanout unicast a second program works beside it: xdp/swml_fanout.c on
the interface's tc ingress (bpf.tc_attach), which copies each completed
RESULT to every member; it stays, goes and is adopted with the XDP program.

A box with several ports (switch/ports.py) runs the one program on every
port, with one set of maps; the first port names it (pins, state, `down`).
"""
from __future__ import annotations

import logging
import os

from .. import bpf, net, wire
from .dataplane import (
    DEFAULT_FANOUT,
    FANOUTS,
    Dataplane,
    DataplaneError,
    SwitchParams,
    netns_inode,
)
from .maps import SwitchMaps
from .ports import box_address, check_ports, port_defines

PROG_NAME = "swml_switch"
FANOUT_SOURCE = "swml_fanout.c"
FANOUT_PROG = "swml_fanout"
FANOUT_MORE_PROG = "swml_fanout_more"   # its tail call: the members past the first chunk
PORT_FILTER_PROG = "swml_port_filter"   # a box of several ports: a RESULT's copy per port

log = logging.getLogger("swml.switch")


class XdpDataplane(Dataplane):
    name = "xdp"
    needs_root = True

    def __init__(self, iface: str, params: SwitchParams, mode: str | None = None,
                 fanout: str | None = None, ports: list[str] | None = None,
                 uplink: str | None = None):
        """mode: "native" or "generic"; None: native, falling back to generic
        (or the adopted data plane's mode). fanout: a name of FANOUTS; None:
        the adopted data plane's, else multicast. ports: every port of the
        box, `iface` first (default: `iface` alone). uplink: a rack box's port
        towards its parent box (docs/scale-out.md, "A tree of boxes"): the
        program goes on it too, for the parent's RESULTs."""
        super().__init__(iface, params)
        self.ports = check_ports(ports or [iface])
        if uplink is not None and uplink in self.ports:
            raise DataplaneError(f"the uplink {uplink} is also a port of the box: it must be "
                                 f"another interface, towards the parent")
        self.uplink = uplink
        if self.ports[0] != iface:
            raise DataplaneError(f"the first port is the box's name ({iface}), not {self.ports[0]}")
        if fanout is not None and fanout not in FANOUTS:
            raise DataplaneError(f"--fanout must be one of {', '.join(FANOUTS)}, not {fanout!r}")
        self.requested_mode = mode
        self.requested_fanout = fanout
        self._mode: str | None = None
        self._fanout = fanout or DEFAULT_FANOUT
        self.prog_id = 0
        self.fanout_prog_id = 0       # the tc program's, once attached (unicast)
        self._prog: bpf.Program | None = None
        self._fanout_prog: bpf.Program | None = None
        self._fanout_fd = -1
        self._attached: list[str] = []   # the ports the program went on

    @property
    def label(self) -> str:
        return f"{self._mode} XDP"

    @property
    def mode(self) -> str | None:
        return self._mode

    @property
    def fanout(self) -> str:
        return self._fanout

    def check_free(self, state: dict | None) -> None:
        att = self._attachment()
        if att.mode is not None and not (state and state.get("prog_id") == att.prog_id):
            raise DataplaneError(f"{self.iface} already has an XDP program attached (id {att.prog_id}, "
                                 f"{att.mode}) that is not this switch's; detach it first "
                                 f"(`ip link set {self.iface} xdp off`)")

    def can_adopt(self, state: dict) -> bool:
        return SwitchMaps.exist(self.iface) and self._attachment().prog_id == state.get("prog_id")

    def open(self, ip: str, adopt: dict | None) -> SwitchMaps:
        pins = bpf.pin_dir(self.iface)
        if adopt is None:
            bpf.remove_pins(pins)  # stale: from another configuration or a clean stop
        mac = box_address(self.ports)[1]
        try:
            ifindexes = [net.link_index(p) for p in self.ports]
        except net.NetError as e:
            raise DataplaneError(str(e)) from None
        self._fanout = self.requested_fanout or (adopt or {}).get("fanout") or DEFAULT_FANOUT
        defines = {**program_defines(self.params, pins, ip, mac, self._fanout),
                   **port_defines(ifindexes), **({"SWML_UPLINK": 1} if self.uplink else {})}
        try:
            bpf.ensure_bpffs(pins)
            # The maps are created and pinned, or re-opened where pinned already.
            self._prog = bpf.compile_program("swml_switch.c", PROG_NAME, defines)
            if len(self.ports) > 1 or self.uplink:
                fill_ports(self._prog, ifindexes, self._fanout)
        except bpf.BpfError as e:
            raise _load_error("the switch program", e) from None
        if self._fanout == "unicast":
            try:   # the same defines: the same pinned maps
                self._fanout_prog = bpf.compile_program(FANOUT_SOURCE, None, defines,
                                                        maps_only=True)
                self._fanout_fd = load_fanout(self._fanout_prog)
            except bpf.BpfError as e:
                raise _load_error("the unicast fan-out program", e) from None
        self.maps = SwitchMaps(self.iface, self.params.k)
        return self.maps

    def start(self, adopt: dict | None) -> None:
        # The fan-out before the XDP program that marks frames for it; and,
        # going back to multicast, removed only once no XDP program marks any.
        try:
            for port in self.ports + ([self.uplink] if self.uplink else []):
                if self._fanout == "unicast":
                    self.fanout_prog_id = bpf.tc_attach(port, self._fanout_fd, FANOUT_PROG)
                mode = bpf.attach(port, self._prog.fd,
                                  self.requested_mode or (adopt or {}).get("mode"), replace=True)
                self._mode = self._mode or mode   # the first port's: what `status` shows
                self.prog_id = self.prog_id or self._attachment().prog_id
                self._attached.append(port)
                if self._fanout != "unicast":
                    bpf.tc_detach(port, name=FANOUT_PROG)
        except bpf.BpfError as e:
            raise DataplaneError(str(e)) from None

    def close(self) -> None:
        for port in self._attached:  # ours was attached: undo it all
            try:
                bpf.detach(port, prog_id=self.prog_id)
            except bpf.XdpError as e:
                log.warning("%s", e)
            if self.fanout_prog_id:
                try:
                    bpf.tc_detach(port, name=FANOUT_PROG)
                except bpf.BpfError as e:
                    log.warning("%s", e)
        if self.maps is not None:
            self.maps.close()
        for prog in (self._prog, self._fanout_prog):
            if prog is not None:
                prog.close()
        if self.prog_id:
            bpf.remove_pins(bpf.pin_dir(self.iface))

    def state(self) -> dict:
        return {**super().state(), "prog_id": self.prog_id, "fanout_prog_id": self.fanout_prog_id,
                "ports": self.ports, "uplink": self.uplink}

    def _attachment(self) -> bpf.Attachment:
        try:
            return bpf.attachment(self.iface)
        except bpf.XdpError as e:
            raise DataplaneError(str(e)) from None

    @classmethod
    def left_behind(cls, iface: str) -> bool:
        return SwitchMaps.exist(iface)

    @classmethod
    def remove_leftovers(cls, iface: str, state: dict | None) -> tuple[list[str], list[str]]:
        """Detach the switch's program from `iface` wherever the interface is
        (this namespace, or the named one the daemon ran in), then remove the
        pins. While the program may still be attached, the pins stay, so that
        `down` where the interface lives can finish the job."""
        did, failed = [], []
        ports = (state or {}).get("ports") or [iface]
        uplink = (state or {}).get("uplink")
        for port in ports + ([uplink] if uplink else []):
            _detach_leftover(port, state, did, failed, named=len(ports) > 1)
        if failed:
            return did, failed + [f"pinned maps kept in {bpf.pin_dir(iface)}"]
        if bpf.remove_pins(bpf.pin_dir(iface)):
            did.append("removed pinned maps")
        return did, failed


def _detach_leftover(iface: str, state: dict | None, did: list[str], failed: list[str],
                     named: bool) -> None:
    """remove_leftovers for one port of the box: what it did and could not do
    go on `did` and `failed` (naming the port where `named`: a box of several)."""
    where = _netns_names_to_try(state)
    for netns in where:
        try:
            att = bpf.attachment(iface, netns=netns)
        except bpf.XdpError:
            continue   # not there
        where_text = f" in network namespace {netns}" if netns else ""
        if att.prog_id and _is_ours(att.prog_id, state):
            try:
                if bpf.detach(iface, netns=netns, prog_id=att.prog_id):
                    did.append(f"detached XDP{f' from {iface}' if named else ''}" + where_text)
            except bpf.XdpError as e:
                failed.append(str(e))
        elif att.prog_id:
            did.append(f"left XDP program {att.prog_id} attached (not the switch's)")
        try:
            if bpf.tc_detach(iface, netns=netns, name=FANOUT_PROG):
                did.append("removed the unicast fan-out's tc filter" + where_text)
        except bpf.BpfError as e:
            failed.append(str(e))
        break
    else:
        if state and state.get("netns_inode") not in (None, netns_inode()):
            failed.append(f"{iface} is not in this network namespace and the switch's namespace "
                          f"(inode {state['netns_inode']}) has no name under /run/netns: run "
                          f"`swml-switch down {iface}` inside it to detach the program")


def fill_ports(prog: bpf.Program, ifindexes: list[int], fanout: str) -> None:
    """A box with several ports (swml_switch.c): each port's place in the
    list, and with multicast the devmap a RESULT goes out of every port with
    a member of its job through (swml_to_every_port and its egress filter,
    swml_port_filter)."""
    places = prog.table("port_places")
    for n, ifindex in enumerate(ifindexes):
        places[places.Key(ifindex)] = places.Leaf(n)
    if fanout == "unicast":
        return
    port_filter = prog.load(PORT_FILTER_PROG, "xdp_devmap")
    table = prog.table("result_ports")
    for n, ifindex in enumerate(ifindexes):
        leaf = table.Leaf()
        leaf.ifindex, leaf.bpf_prog.fd = ifindex, port_filter
        table[table.Key(n)] = leaf


def load_fanout(prog: bpf.Program) -> int:
    """Load the tc fan-out of a compiled xdp/swml_fanout.c: its entry
    program's fd, with the continuation it tail-calls in `fanout_next`."""
    fd = prog.load(FANOUT_PROG, "sched_cls")
    more = prog.load(FANOUT_MORE_PROG, "sched_cls")
    table = prog.table("fanout_next")
    table[table.Key(0)] = table.Leaf(more)
    return fd


def _load_error(what: str, e: bpf.BpfError) -> DataplaneError:
    """The one-line error; the compiler's or verifier's whole log goes to the
    log at INFO (`swml-switch up -v`), for a kernel whose verifier refuses."""
    if e.log:
        log.info("%s: the compiler's or verifier's log:\n%s", what, e.log.rstrip())
    hint = " (-v prints the compiler's or verifier's log)" if e.log else ""
    return DataplaneError(f"cannot load {what}: {e}{hint}")


def program_defines(params: SwitchParams, pins: str, ip: str, mac: str,
                    fanout: str = DEFAULT_FANOUT) -> dict[str, object]:
    """The defines both programs (swml_switch.c, swml_fanout.c) are compiled with."""
    return {"SWML_K": params.k, "SWML_SLOTS": params.slots, "SWML_PORT": params.port,
            "SWML_PIN_DIR": bpf.c_string(pins), **address_defines(ip, mac),
            **({"SWML_FANOUT_UNICAST": 1} if fanout == "unicast" else {}), **_fanout_chunk()}


def _fanout_chunk() -> dict[str, int]:
    """SWML_FANOUT_CHUNK=N in the environment: the tc fan-out copies to N
    members a program, not 16 (xdp/swml_fanout.c), so that a test of a few
    members goes through its tail calls too."""
    raw = os.environ.get("SWML_FANOUT_CHUNK", "").strip()
    if not raw:
        return {}
    if not raw.isdigit() or not 1 <= int(raw) <= wire.MAX_WORLD:
        raise DataplaneError(f"SWML_FANOUT_CHUNK must be a member count in 1..{wire.MAX_WORLD}, "
                             f"not {raw!r}")
    return {"SWML_FANOUT_CHUNK": int(raw)}


def address_defines(ip: str, mac: str) -> dict[str, int]:
    """The switch's own addresses as the program's defines (swml_switch.c):
    it takes only frames to these, as this host reads the bytes."""
    b = bytes(int(x, 16) for x in mac.split(":"))
    return {"SWML_SWITCH_IP": wire.ip_to_be32(ip),
            "SWML_SWITCH_MAC_HI": int.from_bytes(b[:4], "little"),
            "SWML_SWITCH_MAC_LO": int.from_bytes(b[4:6], "little")}


def _netns_names_to_try(state: dict | None) -> list[str | None]:
    """Where to look for the interface: the daemon's own network namespace
    (found by its inode among the named ones) first, then this one."""
    want = (state or {}).get("netns_inode")
    where: list[str | None] = []
    if want is not None and want != netns_inode():
        try:
            names = sorted(os.listdir(net.NETNS_DIR))
        except OSError:
            names = []
        for name in names:
            try:
                if os.stat(net.NETNS_DIR / name).st_ino == want:
                    where.append(name)
                    break
            except OSError:
                continue
    return where + [None]


def _is_ours(prog_id: int, state: dict | None) -> bool:
    """The program the state file names, or (whatever the state file says) a
    program loaded as the switch's."""
    if state and state.get("prog_id") == prog_id:
        return True
    try:
        return bpf.prog_name(prog_id) == PROG_NAME[:15]
    except bpf.BpfError:
        return False
