"""What `swml-switch status` shows: every switch on this machine, its jobs and
members, its counters and their rates (switch/rates.py), as text, as JSON, or
as a live view (`--watch`, with rich).

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


def _daemon_status(st: dict) -> dict | None:
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


def collect_status() -> list[dict]:
    """Every switch on this machine, from its state file (readable by anyone),
    and its counters from the pinned maps (XDP, root only) or else from its
    daemon's control port (user-space tables live in the daemon's memory;
    other users cannot open the pins). Where neither works, `note` says why.
    "sampled_at" (monotonic seconds) dates the counters, for rates."""
    out = []
    root = os.geteuid() == 0
    for st in state_files.all_states():
        st = dict(st, alive=state_files.lock_holder(st["iface"]) is not None)
        if root and st["dataplane"] == "xdp" and SwitchMaps.exist(st["iface"]) and _from_pins(st):
            pass
        elif st["alive"] and (reply := _daemon_status(st)) is not None:
            st["counters"] = reply["counters"]
            st["job_stats"] = reply.get("job_stats")
            st["jobs"] = reply["jobs"]
            st["active_job_ids"] = [j["id"] for j in reply["jobs"] if j["state"] == "running"]
        elif st["alive"] and "note" not in st:
            st["note"] = (f"counters: this switch's control port {st['ip']}:{st['control_port']} "
                          f"cannot be reached from this network namespace (run status in the "
                          f"switch's)" + ("" if root else "; only root can read the pinned maps"))
        st["sampled_at"] = time.monotonic()
        out.append(st)
    return out


def sample_with_rates(interval: float, previous: list[dict] | None = None) -> list[dict]:
    """collect_status() with "rates" over `interval` seconds (0: no rates), or
    against `previous` (the last sample of a watch) when given."""
    if previous is None:
        if interval <= 0:
            return collect_status()
        previous = collect_status()
        time.sleep(interval)
    return add_rates(previous, collect_status())


# --------------------------------------------------------------- plain text

#: The counters that are not drops: what happened to the packets the switch took.
OUTCOMES = [n for n in wire.COUNTER_NAMES if n not in wire.DROP_REASONS]


def outcomes(st: dict) -> list[str]:
    """OUTCOMES that this switch can count: the unicast fan-out's only with it."""
    if st.get("fanout") == "unicast":
        return OUTCOMES
    return [n for n in OUTCOMES if not n.startswith("unicast_")]


def _rate(v: float | None, fmt: str = ".0f") -> str:
    return "-" if v is None else format(v, fmt)


def slots_in_use(st: dict) -> int:
    return sum(j["slots"] for j in st["jobs"] if j["state"] == "running")


def headline(st: dict) -> str:
    p = st["params"]
    return (f"switch {st['iface']}: {st['label']}, k={p['k']}, slots {slots_in_use(st)}/{p['slots']} "
            f"in use, fanout {st.get('fanout', 'multicast')}, "
            f"data {st['ip']}:{p['port']}, control {st['ip']}:{st['control_port']}, "
            f"daemon pid {st['pid']} {'running' if st['alive'] else 'NOT RUNNING'}, "
            f"up {time.time() - st['started']:.0f} s")


def no_job_rates_reason(st: dict) -> str | None:
    """Why the jobs have no rates, or None if they have them."""
    rates = st.get("rates")
    if rates is None:
        return None
    if not rates["per_job"]:
        return "this switch does not count packets per job (no per-job rates)"
    return None


def format_text(st: dict) -> str:
    rates = st.get("rates") or {}
    job_rates = rates.get("jobs", {})
    lines = [headline(st)]
    if st["jobs"]:
        head = f"  {'id':>3} {'job':<16} {'world':>5} {'joined':>6} {'slots':<12} {'state':<8}"
        if job_rates:
            head += f" {'pkt/s':>9} {'Gbit/s':>7} {'compl/s':>8} {'retx ans/s':>10}"
        lines.append(head.rstrip())
        for j in st["jobs"]:
            rng = f"{j['slot_base']}-{j['slot_base'] + j['slots'] - 1}" if j["slot_base"] is not None else "-"
            row = (f"  {j['id'] or '-':>3} {j['name']:<16} {j['world']:>5} "
                   f"{len(j['members']):>6} {rng:<12} {j['state']:<8}")
            r = job_rates.get(str(j["id"]))
            if r:
                row += (f" {_rate(r['packets_per_s']):>9} {_rate(r['gbit_per_s'], '.3f'):>7} "
                        f"{_rate(r['completions_per_s']):>8} "
                        f"{_rate(r['retransmissions_answered_per_s']):>10}")
            if not j.get("protected", True):
                row += " (unprotected: no token)"
            lines.append(row.rstrip())
            for r_, m in j["members"].items():
                mac = m["mac"]
                if "learnt_mac" in m:   # --fanout unicast: where its RESULTs go
                    mac = f"{mac} declared, RESULTs to {m['learnt_mac'] or '(none learnt yet)'}"
                left = " (left)" if m["left"] else ""
                lines.append(f"        rank {r_}: {m['ip']}:{m['port']} {mac}{left}")
    else:
        lines.append("  no jobs")
    c = st.get("counters")
    if c:
        lines.append("  packets: " + ", ".join(f"{n} {c[n]}" for n in outcomes(st)))
        drops = {n: c[n] for n in wire.DROP_REASONS if c[n]}
        lines.append("  dropped: " + (", ".join(f"{n} {v}" for n, v in drops.items()) or "none"))
    if rates:
        cr = rates["counters"]
        lines.append(f"  per second over {rates['interval_s']:.1f} s: "
                     + ", ".join(f"{n} {_rate(cr.get(n))}" for n in outcomes(st)))
        drops = {n: v for n, v in rates["drops"].items() if v}
        lines.append("  dropped per second: "
                     + (", ".join(f"{n} {_rate(v, '.1f')}" for n, v in drops.items()) or "none"))
    if (why := no_job_rates_reason(st)) and st["jobs"]:
        lines.append(f"  {why}")
    if st.get("note"):
        lines.append(f"  {st['note']}")
    return "\n".join(lines)


# ------------------------------------------------------------- live (rich)

JOB_COLUMNS = ("  pkt/s: the job's packets in; Gbit/s: their bytes; compl/s: slot rounds "
               "completed (results sent); retx ans/s: retransmissions answered with a stored result")

def render_frame(switches: list[dict]):
    """One frame of `status --watch`: per switch a headline, its jobs with
    their rates, and drops by reason per second (a rich renderable)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    if not switches:
        return Text("no switch is up on this machine")
    parts = []
    for st in switches:
        rates = st.get("rates") or {}
        parts.append(Text(headline(st), style="bold"))
        jobs = Table(box=None, pad_edge=False, header_style="bold")
        for name, justify in (("id", "right"), ("job", "left"), ("world", "right"),
                              ("joined", "right"), ("state", "left"), ("pkt/s", "right"),
                              ("Gbit/s", "right"), ("compl/s", "right"),
                              ("retx ans/s", "right")):
            jobs.add_column(name, justify=justify)
        for j in st["jobs"]:
            r = rates.get("jobs", {}).get(str(j["id"]), {})
            jobs.add_row(str(j["id"] or "-"), j["name"], str(j["world"]), str(len(j["members"])),
                         j["state"], _rate(r.get("packets_per_s")),
                         _rate(r.get("gbit_per_s"), ".3f"), _rate(r.get("completions_per_s")),
                         _rate(r.get("retransmissions_answered_per_s")))
        parts.append(jobs if st["jobs"] else Text("  no jobs"))
        if st["jobs"]:
            parts.append(Text(JOB_COLUMNS, style="dim"))
        if rates:
            cr = rates["counters"]
            parts.append(Text("  per second: " + ", ".join(
                f"{n} {_rate(cr.get(n))}" for n in outcomes(st))))
            drops = Table(box=None, pad_edge=False, header_style="bold")
            drops.add_column("dropped: reason")
            drops.add_column("per second", justify="right")
            drops.add_column("total", justify="right")
            for name in wire.DROP_REASONS:
                drops.add_row(name, _rate(rates["drops"].get(name), ".1f"),
                              str(st["counters"].get(name, 0)))
            parts.append(drops)
        else:
            parts.append(Text("  rates: from the next sample on" if st.get("counters") else ""))
        for line in (no_job_rates_reason(st) if st["jobs"] else None, st.get("note")):
            if line:
                parts.append(Text(f"  {line}", style="yellow"))
        parts.append(Text(""))
    return Group(*parts)


def watch(interval: float, count: int | None = None, console=None) -> None:
    """Redraw the frame every `interval` seconds until Ctrl-C (or `count` frames)."""
    from rich.live import Live

    previous = collect_status()
    shown = 0
    with Live(render_frame(previous), console=console, auto_refresh=False) as live:
        try:
            while count is None or shown < count:
                time.sleep(interval)
                current = sample_with_rates(interval, previous)
                live.update(render_frame(current), refresh=True)
                previous = current
                shown += 1
        except KeyboardInterrupt:
            pass
