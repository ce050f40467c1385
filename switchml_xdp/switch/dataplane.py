"""The switch's data plane: compile xdp/swml_switch.c for one interface, load
it, attach it, and pin its maps.

Specialisation happens at load time through compiler defines (k, slot count,
port, pin directory), so every bound in the program is a constant the verifier
can see.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .. import bpf, wire
from ..bpf import ensure_bpffs  # noqa: F401  (lab/loss.py's import, until it uses the door)

PROG_NAME = "swml_switch"


class DataplaneError(RuntimeError):
    pass


@dataclass(frozen=True)
class SwitchParams:
    k: int = wire.DEFAULT_K
    slots: int = wire.DEFAULT_SLOTS
    port: int = wire.DEFAULT_PORT

    def validate(self) -> None:
        if not 1 <= self.k <= wire.MAX_K:
            raise DataplaneError(f"--elements must be in 1..{wire.MAX_K} (1500-byte MTU), got {self.k}")
        if not 1 <= self.slots <= 65535:
            raise DataplaneError(f"--slots must be in 1..65535, got {self.slots}")
        if not 1 <= self.port <= 65535:
            raise DataplaneError(f"--port must be in 1..65535, got {self.port}")


def compile_switch(iface: str, params: SwitchParams):
    """Compile and load the switch program; its maps are created and pinned
    under /sys/fs/bpf/swml/IFACE, or re-opened if already pinned there.
    Returns (program, program): the program and what has its `.fd`."""
    params.validate()
    bpf.ensure_bpffs()
    os.makedirs(bpf.pin_dir(iface), exist_ok=True)
    defines = {"SWML_K": params.k, "SWML_SLOTS": params.slots, "SWML_PORT": params.port,
               "SWML_PIN_DIR": bpf.c_string(bpf.pin_dir(iface))}
    try:
        prog = bpf.compile_program("swml_switch.c", PROG_NAME, defines)
    except bpf.BpfError as e:
        raise DataplaneError(f"cannot load the switch program: {e}") from e
    return prog, prog


def attach_switch(iface: str, prog_fd: int, mode: str | None, replace: bool = False) -> str:
    """Attach (see switchml_xdp.bpf.attach); returns the mode in use."""
    return bpf.attach(iface, prog_fd, mode, replace=replace)


def remove_pins(iface: str) -> None:
    bpf.remove_pins(bpf.pin_dir(iface))
