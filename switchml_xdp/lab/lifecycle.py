"""What outlives a Lab object: its state file, the process-wide exit hooks that
tear live labs down, and the removal of labs whose owner is gone.

A lab describes itself in /run/swml/lab-PREFIX.json (hosts, the user who made
it, and the owner pid, None for a lab left up on purpose) before it makes
anything, so the CLI and a later cleanup can find it, and `swml-lab down --all`
can tell the caller's labs from other users'. Labs in use are registered here; atexit and SIGTERM close
them, so an interrupted run leaves no namespaces behind.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import pwd
import signal
import threading
from pathlib import Path
from typing import Protocol

from ..switch import state_files
from . import loss, netns
from .addressing import MAX_BOXES, PREFIX_STEM, box_host, is_namespace_of, prefix_of, rack_port_host

# beside the switches' own state files: one directory for what `swml-*` leaves in /run
STATE_DIR = Path(state_files.STATE_DIR)


class Closable(Protocol):
    prefix: str

    def close(self) -> None: ...


# ---------------------------------------------------------------- state files

def state_path(prefix: str) -> Path:
    """Where a lab describes itself (hosts, owner) for the CLI and for cleanup."""
    return STATE_DIR / f"lab-{prefix}.json"


def write_state(prefix: str, description: dict) -> None:
    """Write the description atomically (readers never see half of it)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    path = state_path(prefix)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(description, indent=2) + "\n")
    tmp.replace(path)


def read_state(prefix: str) -> dict | None:
    """The description of lab `prefix`, or None if it has none."""
    try:
        return json.loads(state_path(prefix).read_text())
    except FileNotFoundError:
        return None


def switch_log_path(prefix: str, box: int = 0) -> Path:
    """Where the switch that `swml-lab up --switch` starts in the background
    on box `box` writes."""
    return STATE_DIR / f"lab-{prefix}.switch{box or ''}.log"


def caller_uid() -> int:
    """The user on whose behalf this runs: the one who called sudo, where sudo
    made us root (labs need root, so the uid alone would make everyone root)."""
    sudo_uid = os.environ.get("SUDO_UID", "")
    if os.getuid() == 0 and sudo_uid.isdigit():
        return int(sudo_uid)
    return os.getuid()


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def owner_fields() -> dict:
    """What a lab's description says about who made it."""
    uid = caller_uid()
    return {"owner_uid": uid, "owner_user": user_name(uid)}


# ---------------------------------------------------- live labs, exit and SIGTERM

_live: set[Closable] = set()
_live_lock = threading.Lock()
_atexit_installed = False
_sigterm_installed = False


def track(lab: Closable) -> None:
    """Close `lab` when the process exits or gets SIGTERM, unless untracked first."""
    _install_exit_hooks()
    with _live_lock:
        _live.add(lab)


def untrack(lab: Closable) -> None:
    with _live_lock:
        _live.discard(lab)


def _is_tracked(prefix: str) -> bool:
    with _live_lock:
        return any(lab.prefix == prefix for lab in _live)


def _close_live_labs() -> None:
    with _live_lock:
        labs = list(_live)
    for lab in labs:
        lab.close()


def _on_sigterm(previous, signum, frame) -> None:
    """Tear live labs down, then let SIGTERM do what it would have done."""
    _close_live_labs()
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_exit_hooks() -> None:
    """atexit always; SIGTERM when we can (signal handlers are main-thread only)."""
    global _atexit_installed, _sigterm_installed
    if not _atexit_installed:
        atexit.register(_close_live_labs)
        _atexit_installed = True
    if not _sigterm_installed and threading.current_thread() is threading.main_thread():
        previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, functools.partial(_on_sigterm, previous))
        _sigterm_installed = True


# ------------------------------------------------------------------ leftovers

def _owner_alive(prefix: str) -> bool:
    """True if the lab's state file names a running owner, or says keep (owner None)."""
    try:
        owner = json.loads(state_path(prefix).read_text()).get("owner_pid", 0)
    except (OSError, ValueError):
        return False
    if owner is None:
        return True
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return owner != os.getpid() or _is_tracked(prefix)


def lab_namespaces(prefix: str | None = None) -> list[str]:
    """Namespaces of lab `prefix`, or every namespace named "swl*" if None."""
    if prefix is None:
        return [ns for ns in netns.list_netns() if ns.startswith(PREFIX_STEM)]
    return [ns for ns in netns.list_netns() if is_namespace_of(prefix, ns)]


def remove_lab_files(prefix: str) -> None:
    """The state file and pinned maps of lab `prefix`, and whatever a switch
    daemon on a box's interface (a rack box's too) left (pins, state, token
    and lock files), once its namespaces are gone. Every box a lab may have
    is looked at: the state file that says how many may be gone already."""
    from .. import bpf  # late: `swml-lab down` needs neither at import
    from ..switch import state_files

    state_path(prefix).unlink(missing_ok=True)
    loss.remove_pins(prefix)
    for box in range(MAX_BOXES):
        switch_log_path(prefix, box).unlink(missing_ok=True)
        for switch_iface in (box_host(prefix, box).iface, rack_port_host(prefix, box).iface):
            if state_files.remove_leftover_files(switch_iface):
                bpf.remove_pins(bpf.pin_dir(switch_iface))


def _owner_pid(prefix: str) -> int | None:
    """The live process that uses lab `prefix` (a demo, a test session), if any."""
    state = read_state(prefix) or {}
    pid = state.get("owner_pid")
    if pid is None or not _owner_alive(prefix):
        return None
    return pid


def known_prefixes() -> set[str]:
    """Every lab this machine has: by state file, and by "swl*" namespace."""
    found = {prefix_of(ns) for ns in lab_namespaces()}
    for path in STATE_DIR.glob("lab-*.json"):
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(state, dict) and "bridge" in state and state.get("prefix"):
            found.add(state["prefix"])
    return found


def remove_own_labs(uid: int | None = None) -> tuple[list[str], list[tuple[str, str]]]:
    """`swml-lab down --all`: remove the labs of user `uid` (default: the
    caller) that nothing uses any more: left up on purpose (`swml-lab up`) or
    orphaned by a process that died. Other users' labs, labs in use by a live
    process and labs whose owner is not on record are left alone.
    Returns (namespaces removed, [(prefix, why it was left)])."""
    uid = caller_uid() if uid is None else uid
    removed: list[str] = []
    spared: list[tuple[str, str]] = []
    for prefix in sorted(known_prefixes()):
        state = read_state(prefix)
        owner = state.get("owner_uid") if state else None
        if owner is None:
            spared.append((prefix, "its maker is not on record"))
        elif owner != uid:
            spared.append((prefix, f"it belongs to {state.get('owner_user') or user_name(owner)}"))
        elif (pid := _owner_pid(prefix)) is not None:
            spared.append((prefix, f"process {pid} is using it"))
        else:
            removed += cleanup_leftovers(prefix)
    return removed, spared


def cleanup_leftovers(prefix: str | None = None, orphans_only: bool = False) -> list[str]:
    """Remove lab namespaces (and the processes in them, and state files).

    prefix: that lab only; None: every namespace whose name starts with "swl".
    orphans_only: spare labs whose owning process still runs or that were left
    up on purpose (`swml-lab up`), so that a test session tidying up after a
    killed run does not pull a concurrent run's lab from under it.
    Returns the namespaces removed.
    """
    names = lab_namespaces(prefix)
    prefixes = {prefix_of(ns) for ns in names}
    if prefix is not None:
        prefixes.add(prefix)
    else:
        prefixes |= {p.name[len("lab-"):-len(".json")]
                     for p in STATE_DIR.glob(f"lab-{PREFIX_STEM}*.json")}
    if orphans_only:
        prefixes = {p for p in prefixes if not _owner_alive(p)}
        names = [ns for ns in names if prefix_of(ns) in prefixes]
    netns.terminate_pids(netns.pids_in(names))
    removed = [ns for ns in names if netns.remove_netns(ns)]
    for p in prefixes:
        remove_lab_files(p)
    return removed
