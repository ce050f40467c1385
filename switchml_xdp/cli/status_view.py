"""What `swml-switch status` shows: every switch on this machine (or the one
on IFACE), its jobs and members, its counters and their rates
(switch/rates.py), as text (status_text.py), as JSON, or as a live view
(`--watch`, with rich). What a client sent is escaped before either view
prints it (status_text.escaped).

Anyone may look: the state files are readable by all, and the counters come
from the daemon's control port (its `status` op), or, for root, from the
XDP switch's pinned maps when the port cannot be reached from here."""
from __future__ import annotations

import os
import time

from .. import wire
from ..bpf import PinnedMapError
from ..switch import daemon, state_files
from ..switch.maps import SwitchMaps
from ..switch.rates import add_rates
from .status_text import (
    escaped,
    escaped_sample,
    format_text,
    group_of,
    headline,
    no_job_rates_reason,
    outcomes,
    rate,
    share_text,
    shares_line,
)

__all__ = ["collect_status", "escaped", "format_text", "render_frame", "sample_with_rates", "watch"]


def daemon_status(st: dict) -> dict | None:
    """The daemon's own `status` reply through its control port; None where
    this shell cannot reach it (another network namespace, a firewall)."""
    from ..client.control import ControlClient, ControlError

    try:
        client = ControlClient(st["ip"], st["control_port"], connect_timeout=1.0)
    except ControlError:
        return None
    try:
        reply = client.status()
    except (ControlError, OSError, ValueError):
        return None
    finally:
        client.close()
    # Labs give every switch the same address: from another network namespace
    # that address may be another switch's, whose numbers are not this one's.
    if reply.get("switch", {}).get("iface") != st["iface"]:
        return None
    return reply


def _from_pins(st: dict) -> bool:
    """Counters (and per-job counters) straight from an XDP switch's pinned maps
    (root); False, with a note, where they cannot be read."""
    try:
        maps = SwitchMaps(st["iface"])
    except PinnedMapError as e:   # e.g. pinned by another version of switchml-xdp
        st["note"] = f"counters: {e}"
        return False
    try:
        st["counters"] = maps.read_counters()
        st["job_stats"] = daemon.read_job_stats(maps)
        ports = st.get("ports") or [st["iface"]]
        st["port_stats"] = [{"port": p, **row}
                            for p, row in zip(ports, maps.read_port_stats(len(ports)))]
        st["active_job_ids"] = [j for j in range(1, wire.MAX_JOBS) if maps.job_active(j)]
        if st.get("fanout") == "unicast":
            # Where each rank's unicast RESULTs go: learnt by the data plane
            # from the rank's packets, not the MAC its join declared.
            for j in st["jobs"]:
                if j["id"] in st["active_job_ids"]:
                    for rank, m in j["members"].items():
                        m["learnt_mac"] = maps.learnt_mac(j["id"], int(rank))
    except PinnedMapError as e:  # e.g. another version's table, without a row of ours
        for key in ("counters", "job_stats", "active_job_ids"):
            st.pop(key, None)
        st["note"] = f"counters: {e}"
        return False
    finally:
        maps.close()
    return True


def _live_shares(st: dict, reply: dict | None) -> None:
    """Under `up --share`, the jobs' parts as the daemon's `reply` has them
    now; none where there is no reply: the state file's are as they were at
    its last change."""
    live = {j["name"]: j.get("share") for j in (reply or {}).get("jobs", [])}
    for j in st["jobs"]:
        j.pop("share", None)
        if live.get(j["name"]):
            j["share"] = live[j["name"]]
    if reply is not None:
        st["shares"] = reply.get("shares")


def collect_status(iface: str | None = None) -> list[dict]:
    """Every switch on this machine (the one on `iface` where given), from its
    state file (readable by anyone),
    and its counters from the pinned maps (XDP, root only) or else from its
    daemon's control port (user-space tables live in the daemon's memory;
    other users cannot open the pins). Where neither works, `note` says why.
    "sampled_at" (monotonic seconds) dates the counters, for rates."""
    out = []
    root = os.geteuid() == 0
    for st in state_files.all_states():
        if iface is not None and st["iface"] != iface:
            continue
        st = dict(st, alive=state_files.lock_holder(st["iface"]) is not None)
        if root and st["dataplane"] == "xdp" and SwitchMaps.exist(st["iface"]) and _from_pins(st):
            _live_shares(st, daemon_status(st) if st["alive"] and st.get("shares") else None)
        elif st["alive"] and (reply := daemon_status(st)) is not None:
            st["shares"] = reply.get("shares")
            st["counters"] = reply["counters"]
            st["job_stats"] = reply.get("job_stats")
            st["port_stats"] = reply.get("port_stats")
            st["jobs"] = reply["jobs"]
            st["active_job_ids"] = [j["id"] for j in reply["jobs"] if j["state"] == "running"]
        else:
            _live_shares(st, None)
            if st["alive"] and "note" not in st:
                st["note"] = (f"counters: this switch's control port {st['ip']}:"
                              f"{st['control_port']} cannot be reached from this network "
                              f"namespace (run status in the switch's)"
                              + ("" if root else "; only root can read the pinned maps"))
        st["sampled_at"] = time.monotonic()
        out.append(st)
    return out


def sample_with_rates(interval: float, previous: list[dict] | None = None,
                      iface: str | None = None) -> list[dict]:
    """collect_status(iface) with "rates" over `interval` seconds (0: no
    rates), or against `previous` (the last sample of a watch) when given."""
    if previous is None:
        if interval <= 0:
            return collect_status(iface)
        previous = collect_status(iface)
        time.sleep(interval)
    return add_rates(previous, collect_status(iface))


# ------------------------------------------------------------- live (rich)

JOB_COLUMNS = ("  pkt/s: the job's packets in; Gbit/s: their bytes; compl/s: slot rounds "
               "completed (results sent); retx ans/s: retransmissions answered with a stored result")

def render_frame(switches: list[dict], show_all: bool = False):
    """One frame of `status --watch`: per switch a headline, its jobs with
    their rates and group, and drops by reason per second, the reasons never
    seen only with show_all (a rich renderable)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    if not switches:
        return Text("no switch is up on this machine")
    parts = []
    for st in map(escaped_sample, switches):
        rates = st.get("rates") or {}
        parts.append(Text("\n".join(headline(st)), style="bold"))
        if st.get("shares"):
            parts.append(Text("\n".join(shares_line(st))))
        jobs = Table(box=None, pad_edge=False, header_style="bold")
        for name, justify in (("id", "right"), ("job", "left"), ("world", "right"),
                              ("joined", "right"), ("state", "left"), ("pkt/s", "right"),
                              ("Gbit/s", "right"), ("compl/s", "right"),
                              ("retx ans/s", "right"), ("group", "left")):
            jobs.add_column(name, justify=justify)
        for j in st["jobs"]:
            r = rates.get("jobs", {}).get(str(j["id"]), {})
            cells = (str(j["id"] or "-"), str(j["name"]), str(j["world"]), str(len(j["members"])),
                     str(j["state"]), rate(r.get("packets_per_s")), rate(r.get("gbit_per_s"), ".3f"),
                     rate(r.get("completions_per_s")), rate(r.get("retransmissions_answered_per_s")),
                     group_of(j))
            jobs.add_row(*(Text(c) for c in cells))   # Text: no rich markup in a job's name
        parts.append(jobs if st["jobs"] else Text("  no jobs"))
        for j in st["jobs"]:
            if j.get("share"):
                parts.append(Text(f"  {j['name']}: {share_text(j['share'])}"))
        if st["jobs"]:
            parts.append(Text(JOB_COLUMNS, style="dim"))
        if rates:
            cr = rates["counters"]
            seen = [f"{n} {rate(cr.get(n))}" for n in outcomes(st) if show_all or cr.get(n)]
            parts.append(Text("  per second: " + (", ".join(seen) or "none")))
            drops = Table(box=None, pad_edge=False, header_style="bold")
            drops.add_column("dropped: reason")
            drops.add_column("per second", justify="right")
            drops.add_column("total", justify="right")
            for name in wire.DROP_REASONS:
                per_s, total = rates["drops"].get(name), st["counters"].get(name, 0)
                if show_all or per_s or total:
                    drops.add_row(name, rate(per_s, ".1f"), str(total))
            if not drops.rows:
                drops.add_row("none", "", "")
            parts.append(drops)
        else:
            parts.append(Text("  rates: from the next sample on" if st.get("counters") else ""))
        for line in (no_job_rates_reason(st) if st["jobs"] else None, st.get("note")):
            if line:
                parts.append(Text(f"  {line}", style="yellow"))
        parts.append(Text(""))
    return Group(*parts)


def watch(interval: float, count: int | None = None, console=None, iface: str | None = None,
          show_all: bool = False) -> None:
    """Redraw the frame every `interval` seconds until Ctrl-C (or `count` frames)."""
    from rich.live import Live

    previous = collect_status(iface)
    shown = 0
    with Live(render_frame(previous, show_all), console=console, auto_refresh=False) as live:
        try:
            while count is None or shown < count:
                time.sleep(interval)
                current = sample_with_rates(interval, previous, iface)
                live.update(render_frame(current, show_all), refresh=True)
                previous = current
                shown += 1
        except KeyboardInterrupt:
            pass
