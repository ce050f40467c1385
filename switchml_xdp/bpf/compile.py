"""Compile the project's BPF C (xdp/) with bcc and load its programs.

Everything that compiles BPF goes through `compile_program`: one set of
compiler flags, and one process-wide lock, because bcc (clang/LLVM underneath)
is not thread-safe: two workers of one process compiling at once crash it.

bcc reports a failed compile or a rejected program as a bare Exception and
writes the compiler's or the verifier's words on file descriptor 2. While
compiling, fd 2 goes to a file (other threads' output written meanwhile is
replayed afterwards, not lost), so that BpfError can carry the useful line,
and the whole text as `.log`.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from ..layout import xdp_dir
from .errors import BpfError

# -I: sources include the shared headers by name. The -Wno-* silence what bcc's
# rewriter provokes in well-formed BPF C (map helpers, packet pointer casts).
SHARED_CFLAGS = ("-Wno-unused-value", "-Wno-pointer-sign", "-Wno-compare-distinct-pointer-types")

_BCC_LOCK = threading.RLock()


def c_string(text: str) -> str:
    """A define's value as a C string literal (e.g. a pin directory)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def cflags(defines: Mapping[str, object] = {}) -> list[str]:
    """The compiler flags of every program: shared ones plus -DNAME=VALUE
    (values pasted as written; wrap strings with c_string())."""
    flags = [f"-I{xdp_dir()}", *SHARED_CFLAGS]
    for name, value in defines.items():
        if isinstance(value, bool):
            value = int(value)
        flags.append(f"-D{name}={value}")
    return flags


def resolve(source: str | Path) -> Path:
    """An xdp/ source by its name relative to xdp/ (e.g. "lab/swml_pass.c"), or a path."""
    path = Path(source)
    return path if path.is_absolute() else xdp_dir() / path


@contextlib.contextmanager
def _stderr_to(log: list[str]) -> Iterator[None]:
    """Send fd 2 to a file for the duration; its text is appended to `log`."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            log.append(tmp.read().decode(errors="replace"))


def _useful_line(log: str) -> str:
    """The line of a clang or verifier log that says what is wrong."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    if errors:
        return re.sub(r"^\S*/", "", errors[0])  # "swml_switch.c:12:3: error: ..."
    for i, line in enumerate(lines):             # the verifier's last word before its summary
        if i and (line.startswith("processed ") or line.startswith("verification time")):
            return lines[i - 1]
    return lines[-1] if lines else ""


def _bpf_call(what: str, fn, *args):
    """fn(*args) under the lock with fd 2 captured; BpfError if bcc raised."""
    log: list[str] = []
    try:
        with _BCC_LOCK, _stderr_to(log):
            result = fn(*args)
    except Exception as e:  # noqa: BLE001 - bcc raises bare Exception
        text = "".join(log)
        detail = _useful_line(text)
        reason = " ".join(str(e).split())
        raise BpfError(f"{what}: {reason}" + (f": {detail}" if detail else ""), text) from None
    if log and log[0]:
        sys.stderr.write(log[0])  # warnings, or other threads' output: not ours to drop
    return result


def compiler_missing() -> str | None:
    """None if this process can compile and load BPF here, else why not in one
    line (for callers that choose a fallback or skip a test)."""
    if os.geteuid() != 0:
        return "needs root (loading BPF programs)"
    try:
        import bcc  # noqa: F401 - Debian's python3-bpfcc, seen through the venv
    except ImportError:
        return "needs bcc (Debian package python3-bpfcc; `make setup` makes a venv that sees it)"
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        return "the kernel has no BTF (bpf_spin_lock in map values needs it)"
    return None


class Program:
    """A compiled source and its loaded program(s)."""

    def __init__(self, bpf, source: Path, prog: str | None):
        self._bpf = bpf
        self.source = source
        self.name = prog
        self._fd = self.load(prog) if prog else -1

    @property
    def fd(self) -> int:
        """The fd of the program compile_program loaded."""
        if self._fd < 0:
            raise BpfError(f"no program loaded from {self.source.name} (maps_only)")
        return self._fd

    def load(self, name: str, kind: str = "xdp") -> int:
        """Load another function of the source, as "xdp", "xdp_devmap" (XDP
        run on a frame leaving through a device map) or "sched_cls" (tc); its fd."""
        from bcc import BPF, BPFAttachType

        kinds = {"xdp": (BPF.XDP, -1), "xdp_devmap": (BPF.XDP, BPFAttachType.XDP_DEVMAP),
                 "sched_cls": (BPF.SCHED_CLS, -1)}
        if kind not in kinds:
            raise BpfError(f"program kind must be one of {', '.join(kinds)}, not {kind!r}")
        prog_type, attach_type = kinds[kind]
        fn = _bpf_call(f"cannot load {name} from {self.source.name}", self._bpf.load_func,
                       name.encode(), prog_type, None, attach_type)
        return fn.fd

    def table(self, name: str):
        """The bcc table (map) `name`."""
        return self._bpf[name.encode()]

    def map_fd(self, name: str) -> int:
        return self.table(name).map_fd

    def close(self) -> None:
        """Unload: programs not attached (or linked) elsewhere and unpinned maps go."""
        if self._bpf is not None:
            with _BCC_LOCK:
                self._bpf.cleanup()
            self._bpf = None

    def __enter__(self) -> Program:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def compile_program(source: str | Path, prog: str | None, defines: Mapping[str, object] = {}, *,
                    maps_only: bool = False) -> Program:
    """Compile `source` with the shared flags and `defines`, and load its
    function `prog` as XDP (with maps_only, load nothing: the maps are made,
    and pinned where the source says). BpfError with a one-line reason."""
    try:
        from bcc import BPF
    except ImportError:
        raise BpfError("bcc is not importable (Debian package python3-bpfcc)") from None
    path = resolve(source)
    if not path.is_file():
        raise BpfError(f"no BPF source {path}")
    bpf = _bpf_call(f"cannot compile {path.name}", lambda: BPF(src_file=str(path).encode(),
                                                               cflags=cflags(defines)))
    try:
        return Program(bpf, path, None if maps_only else prog)
    except BaseException:
        with _BCC_LOCK:
            bpf.cleanup()
        raise
