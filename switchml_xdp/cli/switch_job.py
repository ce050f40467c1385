"""`swml-switch job NAME --weight W [--dscp D]`: the box's operator sets a
running job's weight under `up --share` and/or pins its DSCP mark
(docs/operations.md, "Setting weights").

The switch is found as `status` finds it (its state file under /run/swml),
the request goes to its control port with the daemon's operator token,
which only root reads (switch/state_files.py, operator_path): who cannot
read it is told so in one line, before anything is sent. Bad values are
refused here in the daemon's words (switch/share_policy.py, parse_weight),
what the daemon refuses is its one line.
"""
from __future__ import annotations

from ..switch import state_files
from ..switch.dataplane import netns_inode
from ..switch.share_policy import parse_weight
from . import status_view
from .status_text import escaped


class JobCommandError(RuntimeError):
    """Why the command changed nothing, in one line."""


def parse_dscp(text: str) -> int:
    """A DSCP mark 0..63 from the command line; ValueError in the daemon's words."""
    try:
        value = int(str(text), 10)
    except ValueError:
        raise ValueError(f"a DSCP mark is an integer 0..63, not {text!r}") from None
    if not 0 <= value <= 63:
        raise ValueError(f"a DSCP mark is an integer 0..63, not {value}")
    return value


def find_switch(iface: str | None) -> dict:
    """The state of the switch running here (on `iface` where given); of
    several, the one in this network namespace (labs share /run/swml)."""
    states = [st for st in state_files.all_states()
              if (iface is None or st["iface"] == iface)
              and state_files.lock_holder(st["iface"]) is not None]
    if not states:
        raise JobCommandError(f"no switch is up on {escaped(iface)}" if iface is not None
                              else "no switch is up on this machine")
    here = [st for st in states if st.get("netns_inode") == netns_inode()]
    if len(states) > 1 and len(here) == 1:
        return here[0]
    if len(states) > 1:
        raise JobCommandError(f"switches are up on {', '.join(escaped(s['iface']) for s in states)}:"
                              f" say which with --iface")
    return states[0]


def read_token(iface: str, token_file: str | None) -> str:
    """The daemon's operator token, from `token_file` or where it wrote it."""
    path = token_file or state_files.operator_path(iface)
    try:
        with open(path) as f:
            token = f.read().strip()
    except OSError as e:
        raise JobCommandError(f"only root on the box may change a job's share (cannot read "
                              f"{escaped(path)}: {e.strerror or e})") from None
    except UnicodeDecodeError:
        token = ""
    if not token:
        raise JobCommandError(f"{escaped(path)} holds no operator token")
    return token


def change_text(name: str, reply: dict, before: dict | None, weight, dscp) -> str:
    """`job NAME: weight 3 (was 1), dscp 46 (was 34)`: what was asked, from
    the reply, and what it was where status showed it before."""
    said = []
    if weight is not None:
        was = f" (was {before['weight']:g})" if before else ""
        said.append(f"weight {reply['weight']:g}{was}")
    if dscp is not None:
        was = f" (was {before['dscp']})" if before and before.get("dscp") is not None else ""
        said.append(f"dscp {reply['dscp']} pinned{was}")
    return f"job {escaped(name)}: {', '.join(said)}"


def set_share(name: str, weight: str | None, dscp: str | None, iface: str | None = None,
              token_file: str | None = None) -> str:
    """Send the operator's `job` op; the line to print. JobCommandError
    (nothing changed) for bad values, no switch, no token or a refusal."""
    from ..client.control import ControlClient, ControlError

    if weight is None and dscp is None:
        raise JobCommandError("say what to set: --weight W, --dscp D or both")
    try:
        weight = parse_weight(weight) if weight is not None else None
        dscp = parse_dscp(dscp) if dscp is not None else None
    except ValueError as e:
        raise JobCommandError(str(e)) from None
    st = find_switch(iface)
    token = read_token(st["iface"], token_file)
    status = status_view.daemon_status(st)
    if status is None:
        raise JobCommandError(f"cannot reach the control port {st['ip']}:{st['control_port']} of "
                              f"the switch on {escaped(st['iface'])} from here (run swml-switch "
                              f"job in the switch's network namespace)")
    before = next((j.get("share") for j in status.get("jobs", []) if j["name"] == name), None)
    try:
        client = ControlClient(st["ip"], st["control_port"], connect_timeout=5.0)
        try:
            reply = client.set_job_share(token, name, weight, dscp)
        finally:
            client.close()
    except ControlError as e:
        raise JobCommandError(escaped(str(e), None)) from None
    except (OSError, ValueError) as e:
        raise JobCommandError(f"the switch's control port did not answer: {e}") from None
    return change_text(name, reply, before, weight, dscp)
