"""The files through which another shell finds a running switch, and the lock
that keeps one daemon an interface. Read by `swml-switch status`, `down`, the
lab and the benchmarks; written by the daemon (daemon.py).

- /run/swml/IFACE.json: data plane, parameters, pid, jobs; readable by anyone,
  no secrets; rewritten on every change.
- /run/swml/IFACE.tokens.json: the digests of running jobs' tokens, which a
  daemon that re-adopts the jobs needs; root's alone.
- /run/swml/IFACE.lock: `up` takes an exclusive lock on it before it touches
  anything, and holds it for its life (the kernel releases it when the process
  dies, even by SIGKILL).

(For the XDP data plane the pinned maps under /sys/fs/bpf/swml/IFACE/ complete
the picture; they are xdp_dataplane.py's.)
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import struct

STATE_DIR = "/run/swml"


class LockError(RuntimeError):
    """The interface's lock cannot be taken, for the user in one line."""


def state_path(iface: str) -> str:
    return f"{STATE_DIR}/{iface}.json"


def tokens_path(iface: str) -> str:
    return f"{STATE_DIR}/{iface}.tokens.json"


def operator_path(iface: str) -> str:
    """The operator token of the daemon on `iface`: who can read it (root)
    may change jobs' shares through the control port (`swml-switch job`)."""
    return f"{STATE_DIR}/{iface}.operator"


def lock_path(iface: str) -> str:
    return f"{STATE_DIR}/{iface}.lock"


# --- the lock -----------------------------------------------------------------

def take_lock(iface: str) -> int:
    """The interface's lock, held until the returned fd is closed (or the
    process dies); LockError if another daemon holds it. A POSIX record
    lock, so that others can ask who holds it without taking it (F_GETLK)."""
    os.makedirs(STATE_DIR, exist_ok=True)
    try:
        fd = os.open(lock_path(iface), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise LockError(f"cannot open {lock_path(iface)}: {e.strerror}") from None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            raise LockError(f"cannot lock {lock_path(iface)}: {e.strerror}") from None
        holder = lock_holder(iface)
        raise LockError(f"swml-switch is already up on {iface}"
                        + (f" (pid {holder})" if holder else "")
                        + f"; `swml-switch down {iface}` first") from None
    return fd


_FLOCK = struct.Struct("hhxxxxqqixxxx")   # struct flock on Linux (l_type, l_whence, l_start, l_len, l_pid)


def lock_holder(iface: str) -> int | None:
    """The pid of the daemon holding the interface's lock (as this process's
    pid namespace sees it); None if nobody holds it. Takes no lock itself."""
    try:
        fd = os.open(lock_path(iface), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        got = fcntl.fcntl(fd, fcntl.F_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
    finally:
        os.close(fd)
    l_type, _, _, _, pid = _FLOCK.unpack(got)
    return None if l_type == fcntl.F_UNLCK else (pid or None)


# --- reading ------------------------------------------------------------------

def read_state(iface: str) -> dict | None:
    try:
        with open(state_path(iface)) as f:
            st = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if "dataplane" not in st:  # written by a daemon older than the choice: an XDP one
        st.update(dataplane="xdp", label=f"{st.get('mode')} XDP")
    return st


def all_states() -> list[dict]:
    if not os.path.isdir(STATE_DIR):
        return []
    out = []
    for name in sorted(os.listdir(STATE_DIR)):
        if name.endswith(".json") and not name.startswith("lab-") and not name.endswith(".tokens.json"):
            st = read_state(name[:-5])
            if st and "iface" in st:
                out.append(st)
    return out


def read_token_digests(iface: str) -> dict[str, str]:
    """Job name -> hex digest of its token, as the last daemon kept them; empty
    where it kept none."""
    try:
        with open(tokens_path(iface)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


# --- writing and removing -----------------------------------------------------

def write_state(iface: str, state: dict, token_digests: dict[str, str]) -> None:
    """Replace the interface's state and token files (the tokens root's alone)."""
    os.makedirs(STATE_DIR, exist_ok=True)
    _write_json(tokens_path(iface), token_digests, 0o600)
    _write_json(state_path(iface), state, 0o644)


def write_operator_token(iface: str) -> str:
    """A fresh operator token for the daemon starting on `iface`, in a file
    only root reads; the token."""
    os.makedirs(STATE_DIR, exist_ok=True)
    token = secrets.token_hex(16)
    _write_text(operator_path(iface), token + "\n", 0o600)
    return token


def read_operator_token(iface: str) -> str:
    """The operator token of the daemon on `iface` (OSError where there is
    none or this user may not read it)."""
    with open(operator_path(iface)) as f:
        return f.read().strip()


def remove_state(iface: str) -> bool:
    """Remove the state and token files (not the lock); returns whether there
    was a state file."""
    had_state = False
    for path in (state_path(iface), tokens_path(iface), operator_path(iface)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            had_state = had_state or path == state_path(iface)
    return had_state


def remove_leftover_files(iface: str) -> bool:
    """Remove the state, token and lock files a daemon left for `iface`, unless a
    daemon holds its lock now; returns whether they were removed. (A daemon
    leaves its lock file on purpose: unlinking a lock another process waits on
    would let two daemons in. Whoever retires an interface for good, the lab
    for one, calls this.)"""
    if lock_holder(iface) is not None:
        return False
    remove_state(iface)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(lock_path(iface))
    return True


def _write_json(path: str, obj, mode: int) -> None:
    """Replace `path` atomically with a file of that mode (never briefly wider)."""
    _write_text(path, json.dumps(obj, indent=1), mode)


def _write_text(path: str, text: str, mode: int) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    os.fchmod(fd, mode)   # also when the file was left by an earlier daemon
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
