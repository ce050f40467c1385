"""The switch's data plane: compile xdp/swml_switch.c for one interface, load
it, attach it, and pin its maps.

Specialisation happens at load time through compiler defines (k, slot count,
port, pin directory), so every bound in the program is a constant the verifier
can see.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from ..bpf import xdp_attach
from ..cheaders import xdp_dir
from .. import wire
from .maps import PIN_ROOT, pin_dir

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


def ensure_bpffs() -> None:
    """Mount bpffs at /sys/fs/bpf if it is not (pins need it)."""
    if not os.path.ismount("/sys/fs/bpf"):
        os.makedirs("/sys/fs/bpf", exist_ok=True)
        r = subprocess.run(["mount", "-t", "bpf", "bpf", "/sys/fs/bpf"], capture_output=True, text=True)
        if r.returncode != 0:
            raise DataplaneError(f"cannot mount bpffs at /sys/fs/bpf: {r.stderr.strip()}")
    os.makedirs(PIN_ROOT, exist_ok=True)


def compile_switch(iface: str, params: SwitchParams):
    """Compile and load the switch program; its maps are created and pinned
    under /sys/fs/bpf/swml/IFACE, or re-opened if already pinned there."""
    from bcc import BPF  # imported late: `status` and tests of pure code need no bcc

    params.validate()
    ensure_bpffs()
    os.makedirs(pin_dir(iface), exist_ok=True)
    cflags = [f"-I{xdp_dir()}", f"-DSWML_K={params.k}", f"-DSWML_SLOTS={params.slots}",
              f"-DSWML_PORT={params.port}", f'-DSWML_PIN_DIR="{pin_dir(iface)}"',
              "-Wno-unused-value", "-Wno-pointer-sign", "-Wno-compare-distinct-pointer-types"]
    try:
        bpf = BPF(src_file=str(xdp_dir() / "swml_switch.c").encode(), cflags=cflags)
        fn = bpf.load_func(PROG_NAME.encode(), BPF.XDP)
    except Exception as e:  # bcc raises bare Exception with the verifier log on stderr
        raise DataplaneError(f"cannot load the switch program: {e}") from e
    return bpf, fn


def attach_switch(iface: str, prog_fd: int, mode: str | None, replace: bool = False) -> str:
    """Attach; with mode None try native first and fall back to generic,
    saying so on stderr. Returns the mode in use."""
    if mode is not None:
        xdp_attach.attach(iface, prog_fd, mode, replace)
        return mode
    try:
        xdp_attach.attach(iface, prog_fd, "native", replace)
        return "native"
    except xdp_attach.XdpError as e:
        print(f"swml-switch: native XDP unavailable on {iface} ({e}); using generic XDP", file=sys.stderr)
        xdp_attach.attach(iface, prog_fd, "generic", replace)
        return "generic"


def remove_pins(iface: str) -> None:
    d = pin_dir(iface)
    if os.path.isdir(d):
        for name in os.listdir(d):
            os.unlink(os.path.join(d, name))
        os.rmdir(d)


def prog_stats(prog_id: int) -> dict:
    """run_cnt and run_time_ns of a program (needs kernel.bpf_stats_enabled=1)."""
    r = subprocess.run(["bpftool", "prog", "show", "id", str(prog_id), "--json"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise DataplaneError(f"bpftool prog show id {prog_id}: {r.stderr.strip()}")
    info = json.loads(r.stdout)
    return {"run_cnt": info.get("run_cnt", 0), "run_time_ns": info.get("run_time_ns", 0)}
