"""The trivial reflector on the box's port (xdp/swml_reflect.c): what the
raw ping-pong (raw_path.py) measures against, in place of the switch.

It answers UDP to `port` (default the data port: the switch and the reflector
exclude each other on an interface, one XDP program each, so the port is free
while the reflector is up, and the raw frames meet whatever the network does to
swml's: a firewall rule opened for it, the lab's loss injector, a DSCP policy)
sent to the interface's own address. Attached through a BPF link: it goes when
the process that put it up ends, however it ends, and it never displaces a
program someone else attached (the switch's).

    with Reflector("eth1") as r:       # `swml-switch reflect eth1`
        ...                            # workers run raw_path.measure() against it
        r.counters()                   # {"reflected": n, "passed": m}
"""
from __future__ import annotations

from .. import bpf, net, wire

SOURCE = "swml_reflect.c"
PROG_NAME = "swml_reflect"


class ReflectorError(RuntimeError):
    """The reflector cannot be put up; says why in one line."""


def compile_reflector(ip: str, port: int) -> bpf.Program:
    """xdp/swml_reflect.c for the box at `ip`, answering `port`, loaded."""
    try:
        return bpf.compile_program(SOURCE, PROG_NAME, {
            "SWML_REFLECT_PORT": port, "SWML_REFLECT_IP": f"{wire.ip_to_be32(ip):#x}u"})
    except bpf.BpfError as e:
        raise ReflectorError(f"cannot load the reflector ({SOURCE}): {e}") from None


class Reflector:
    """xdp/swml_reflect.c on `iface` (in namespace `netns`), a context manager."""

    def __init__(self, iface: str, port: int = wire.DEFAULT_PORT, mode: str | None = None, *,
                 netns: str | None = None, quiet: bool = False):
        if not 1 <= port <= 65535:
            raise ReflectorError(f"port must be in 1..65535, not {port}")
        self.iface, self.port, self.netns = iface, port, netns
        reason = bpf.compiler_missing()
        if reason:
            raise ReflectorError(f"cannot load the reflector: {reason}")
        try:
            self.ip = net.link_ipv4(iface, netns)
            current = bpf.attachment(iface, netns=netns)
        except (net.NetError, bpf.XdpError) as e:
            raise ReflectorError(str(e)) from None
        if current.mode is not None:
            raise ReflectorError(f"{iface} already has an XDP program (id {current.prog_id}): "
                                 "the switch? The reflector takes the port in its place")
        self._prog = compile_reflector(self.ip, port)
        try:
            self._link = bpf.attach_link(iface, self._prog.fd, mode, netns=netns, quiet=quiet)
        except bpf.XdpError as e:
            self._prog.close()
            raise ReflectorError(str(e)) from None
        self.mode = self._link.mode

    def counters(self) -> dict[str, int]:
        """Frames reflected and passed since it went up (summed over CPUs)."""
        rows = self._prog.table("reflect_counters")
        return {name: int(sum(rows[rows.Key(i)])) for i, name in enumerate(("reflected", "passed"))}

    def close(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None
            self._prog.close()

    def __enter__(self) -> Reflector:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
