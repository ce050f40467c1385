"""Where pinned BPF objects live: one bpffs directory per switch interface
(and per lab) under PIN_ROOT, so `status`, `down` and a restarted daemon find
the maps without the program that created them."""
from __future__ import annotations

import os
import shutil
import subprocess

from .errors import BpfError

BPFFS = "/sys/fs/bpf"
PIN_ROOT = f"{BPFFS}/swml"


def pin_dir(iface: str) -> str:
    """The directory of the switch's pinned maps on `iface`."""
    return f"{PIN_ROOT}/{iface}"


def ensure_bpffs(pin_path: str | None = None) -> None:
    """Mount bpffs at /sys/fs/bpf if it is not, and make PIN_ROOT (and
    `pin_path` below it, where given: bcc pins only into a directory that
    exists)."""
    if not os.path.ismount(BPFFS):
        os.makedirs(BPFFS, exist_ok=True)
        r = subprocess.run(["mount", "-t", "bpf", "bpf", BPFFS], capture_output=True, text=True)
        if r.returncode != 0:
            raise BpfError(f"cannot mount bpffs at {BPFFS}: {r.stderr.strip()}")
    os.makedirs(PIN_ROOT, exist_ok=True)
    if pin_path is not None:
        real = os.path.realpath(pin_path)
        if os.path.commonpath([real, PIN_ROOT]) != PIN_ROOT:
            raise BpfError(f"refusing to pin outside {PIN_ROOT}/: {pin_path}")
        os.makedirs(real, exist_ok=True)


def remove_pins(path: str) -> bool:
    """Unpin everything under `path` (a directory below PIN_ROOT) and the
    directory itself; False if it was not there. The maps themselves go when
    no program holds them either."""
    real = os.path.realpath(path)
    if os.path.commonpath([real, PIN_ROOT]) != PIN_ROOT or real == PIN_ROOT:
        raise BpfError(f"refusing to remove pins outside {PIN_ROOT}/: {path}")
    if not os.path.isdir(real):
        return False
    shutil.rmtree(real)
    return True
