"""The XDP data plane: xdp/swml_switch.c compiled for one interface, attached
to it, its maps pinned under /sys/fs/bpf/swml/IFACE.

Specialisation happens at load time through compiler defines (k, slot count,
port, pin directory), so every bound in the program is a constant the verifier
can see. Program and pins stay when the daemon dies: the data plane goes on
serving its running jobs, `status` and `down` find it from any shell, and a
restarted daemon adopts it (the new program reuses the pinned maps and
replaces the old one in one netlink call: the data plane never stops).
"""
from __future__ import annotations

import logging
import os

from .. import bpf, net, wire
from .dataplane import Dataplane, DataplaneError, SwitchParams, netns_inode
from .maps import SwitchMaps

PROG_NAME = "swml_switch"

log = logging.getLogger("swml.switch")


class XdpDataplane(Dataplane):
    name = "xdp"
    needs_root = True

    def __init__(self, iface: str, params: SwitchParams, mode: str | None = None):
        """mode: "native" or "generic"; None: native, falling back to generic
        (or the adopted data plane's mode)."""
        super().__init__(iface, params)
        self.requested_mode = mode
        self._mode: str | None = None
        self.prog_id = 0
        self._prog: bpf.Program | None = None

    @property
    def label(self) -> str:
        return f"{self._mode} XDP"

    @property
    def mode(self) -> str | None:
        return self._mode

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
        try:
            mac = net.link_mac(self.iface)
        except net.NetError as e:
            raise DataplaneError(str(e)) from None
        defines = {"SWML_K": self.params.k, "SWML_SLOTS": self.params.slots,
                   "SWML_PORT": self.params.port, "SWML_PIN_DIR": bpf.c_string(pins),
                   **address_defines(ip, mac)}
        try:
            bpf.ensure_bpffs(pins)
            # The maps are created and pinned, or re-opened where pinned already.
            self._prog = bpf.compile_program("swml_switch.c", PROG_NAME, defines)
        except bpf.BpfError as e:
            raise DataplaneError(f"cannot load the switch program: {e}") from None
        self.maps = SwitchMaps(self.iface, self.params.k)
        return self.maps

    def start(self, adopt: dict | None) -> None:
        try:
            self._mode = bpf.attach(self.iface, self._prog.fd,
                                    self.requested_mode or (adopt or {}).get("mode"), replace=True)
            self.prog_id = self._attachment().prog_id
        except bpf.XdpError as e:
            raise DataplaneError(str(e)) from None

    def close(self) -> None:
        if self.prog_id:  # ours was attached: undo it all
            try:
                bpf.detach(self.iface, prog_id=self.prog_id)
            except bpf.XdpError as e:
                log.warning("%s", e)
        if self.maps is not None:
            self.maps.close()
        if self._prog is not None:
            self._prog.close()
        if self.prog_id:
            bpf.remove_pins(bpf.pin_dir(self.iface))

    def state(self) -> dict:
        return {**super().state(), "prog_id": self.prog_id}

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
        where = _netns_names_to_try(state)
        for netns in where:
            try:
                att = bpf.attachment(iface, netns=netns)
            except bpf.XdpError:
                continue   # not there
            if att.prog_id and _is_ours(att.prog_id, state):
                try:
                    if bpf.detach(iface, netns=netns, prog_id=att.prog_id):
                        did.append("detached XDP" + (f" in network namespace {netns}" if netns else ""))
                except bpf.XdpError as e:
                    failed.append(str(e))
            elif att.prog_id:
                did.append(f"left XDP program {att.prog_id} attached (not the switch's)")
            break
        else:
            if state and state.get("netns_inode") not in (None, netns_inode()):
                failed.append(f"{iface} is not in this network namespace and the switch's namespace "
                              f"(inode {state['netns_inode']}) has no name under /run/netns: run "
                              f"`swml-switch down {iface}` inside it to detach the program")
        if failed:
            return did, failed + [f"pinned maps kept in {bpf.pin_dir(iface)}"]
        if bpf.remove_pins(bpf.pin_dir(iface)):
            did.append("removed pinned maps")
        return did, failed


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
