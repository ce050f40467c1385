"""`swml-switch status` as plain text: 80 columns at most, counters that are
zero left out unless asked for (`--all`), and nothing a client sent (job
names, MACs, addresses, in a daemon's reply or an older state file) printed
without its non-printable characters escaped (docs/operations.md, "Looking
at it")."""
from __future__ import annotations

import textwrap
import time

from .. import wire

WIDTH = 80
LONGEST_SHOWN = 120   # characters of one string from a state file or a reply

#: The counters that are not drops: what happened to the packets the switch took.
OUTCOMES = [n for n in wire.COUNTER_NAMES if n not in wire.DROP_REASONS]


def _escape(s: str, longest: int | None) -> str:
    """repr-style escapes for what a terminal would act on (control and
    format characters, unpaired surrogates) and for the backslash itself."""
    text = "".join(c if c.isprintable() and c != "\\" else ascii(c)[1:-1] for c in s)
    return text if longest is None or len(text) <= longest else text[:longest - 3] + "..."


def escaped(v, longest: int | None = LONGEST_SHOWN):
    """`v` (a sample of collect_status or a part of one) with every string in
    it, keys too, safe to print, and cut to `longest` characters."""
    if isinstance(v, str):
        return _escape(v, longest)
    if isinstance(v, dict):
        return {escaped(k, longest): escaped(x, longest) for k, x in v.items()}
    if isinstance(v, list):
        return [escaped(x, longest) for x in v]
    return v


def escaped_sample(st: dict) -> dict:
    """One switch's sample, escaped; its note (the status command's own words,
    with an error's text) whole."""
    out = escaped(st)
    if st.get("note"):
        out["note"] = escaped(st["note"], None)
    return out


def wrap(text: str, indent: str = "", more: str = "    ") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + more,
                         break_on_hyphens=False) or [indent.rstrip()]


# A rack box's rows (a tree of boxes): up to its parent and back down.
TREE_OUTCOMES = ("sent_up", "resent_up", "up_held", "from_parent", "parent_copy", "bad_parent")


def outcomes(st: dict) -> list[str]:
    """OUTCOMES that this switch can count: the unicast fan-out's only with
    it, the tree's on a rack box."""
    return [n for n in OUTCOMES
            if (st.get("fanout") == "unicast" or not n.startswith("unicast_"))
            and (st.get("tree") or n not in TREE_OUTCOMES)]


def rate(v: float | None, fmt: str = ".0f") -> str:
    return "-" if v is None else format(v, fmt)


def slots_in_use(st: dict) -> int:
    return sum(j["slots"] for j in st["jobs"] if j["state"] == "running")


def bits_per_s(bps: int | None) -> str:
    """10 Gbit/s, 200 Mbit/s; "unknown" for None."""
    if bps is None:
        return "unknown"
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g} {unit}"
    return f"{bps} bit/s"


def headline(st: dict) -> list[str]:
    p = st["params"]
    first = (f"switch {st['iface']}: {st['label']}, k={p['k']}, fanout "
             f"{st.get('fanout', 'multicast')}, slots {slots_in_use(st)}/{p['slots']} in use, "
             f"capacity {bits_per_s(st.get('capacity_bps'))}")
    second = (f"data {st['ip']}:{p['port']}, control {st['ip']}:{st['control_port']}, "
              f"daemon pid {st['pid']} {'running' if st['alive'] else 'NOT RUNNING'}, "
              f"up {time.time() - st['started']:.0f} s")
    return wrap(first) + wrap(second, "  ")


def group_of(job: dict) -> str:
    """The job's multicast group, where RESULTs go ("-" while it joins)."""
    return str((job.get("group") or {}).get("ip") or "-")


def no_job_rates_reason(st: dict) -> str | None:
    """Why the jobs have no rates, or None if they have them."""
    rates = st.get("rates")
    if rates is None:
        return None
    if not rates["per_job"]:
        return "this switch does not count packets per job (no per-job rates)"
    return None


def counts(label: str, values: dict[str, float], names, show_all: bool, fmt: str) -> list[str]:
    """`label: name value, ...`, wrapped; zeros only with show_all."""
    shown = [f"{n} {rate(values.get(n), fmt)}" for n in names if show_all or values.get(n)]
    return wrap(f"{label}: " + (", ".join(shown) or "none"), "  ")


def rate_text(bps: float) -> str:
    """75.0 Mbit/s: a measured rate, one decimal in its unit."""
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.1f} {unit}"
    return f"{bps:.0f} bit/s"


def bytes_text(n: int) -> str:
    """12.0 MiB: a byte count, one decimal in its binary unit."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def share_parts(share: dict) -> list[str]:
    """A job's part under `up --share` (docs/operations.md, "Shares between
    jobs"): its share of the box, weight, the rate it is told and the rate
    it sends, what its ranks said they have left (when said), its mark;
    in pieces that a wrapped line keeps whole."""
    parts = [f"share {share['share']:.2f} (weight {share['weight']:g})",
             f"target {rate_text(share['target_bps'])}",
             f"actual {rate_text(share['actual_bps'])}"]
    if share.get("remaining_bytes"):
        parts.append(f"left {bytes_text(share['remaining_bytes'])}")
    if share.get("dscp") is not None:
        parts.append(f"dscp {share['dscp']}")
    return parts


def share_text(share: dict) -> str:
    return " ".join(share_parts(share))


def wrap_parts(parts: list[str], indent: str, more: str = "    ") -> list[str]:
    """`parts` joined by spaces in lines of at most WIDTH, none cut."""
    lines = [indent + parts[0]]
    for p in parts[1:]:
        if len(lines[-1]) + 1 + len(p) <= WIDTH:
            lines[-1] += " " + p
        else:
            lines.append(indent + more + p)
    return lines


def shares_line(st: dict) -> list[str]:
    """The box's policy between jobs, where it has one."""
    info = st.get("shares")
    if not info:
        return []
    marks = ",".join(map(str, info.get("dscp") or [])) or "none"
    return wrap(f"shares {info['policy']} of {bits_per_s(info['capacity_bps'])}, weights up to "
                f"{info['max_weight']:g}, dscp classes {marks}", "  ")


JOB_HEAD = f"  {'id':>3} {'job':<16} {'ranks':>5} {'state':<7} {'slots':<11} group"


def job_lines(st: dict, j: dict, job_rate: dict | None) -> list[str]:
    rng = f"{j['slot_base']}-{j['slot_base'] + j['slots'] - 1}" if j["slot_base"] is not None else "-"
    name, ranks = str(j["name"]), f"{len(j['members'])}/{j['world']}"
    rest = f"{ranks:>5} {str(j['state']):<7} {rng:<11} {group_of(j)}"
    if len(name) <= 16:
        lines = [f"  {j['id'] or '-':>3} {name:<16} {rest}"]
    else:   # a long name on its own line, the columns under it
        lines = [f"  {j['id'] or '-':>3} {name}", f"  {'':>3} {'':<16} {rest}"]
    if not j.get("protected", True):
        lines.append("        (unprotected: no token)")
    if j.get("share"):
        lines += wrap_parts(share_parts(j["share"]), " " * 8)
    if job_rate:
        lines += wrap(f"{rate(job_rate['packets_per_s'])} pkt/s, "
                      f"{rate(job_rate['gbit_per_s'], '.3f')} Gbit/s, "
                      f"{rate(job_rate['completions_per_s'])} compl/s, "
                      f"{rate(job_rate['retransmissions_answered_per_s'])} retx ans/s", " " * 8)
    for r, m in j["members"].items():
        declared = " declared" if "learnt_mac" in m else ""
        left = " (left)" if m["left"] else ""
        rack = " (behind the rack box)" if "rack" in m else ""
        lines += wrap(f"rank {r}: {m['ip']}:{m['port']} {m['mac'] or '(no MAC)'}{declared}{left}"
                      f"{rack}", " " * 8)
        if declared:   # --fanout unicast: where its RESULTs go, learnt from its packets
            lines += wrap(f"RESULTs to {m['learnt_mac'] or '(none learnt yet)'}", " " * 10)
    return lines + child_lines(j)


def tree_lines(st: dict) -> list[str]:
    """A rack box's place in a tree of boxes: its parent, and each job's
    rank and ranks there (docs/scale-out.md, "A tree of boxes")."""
    tree = st.get("tree")
    if not tree:
        return []
    lines = wrap(f"rack box below the parent {tree['parent']}:{tree['parent_control_port']} "
                 f"through {tree['uplink']} ({tree['ip']})", "  ")
    for name, j in tree["jobs"].items():
        lines += wrap(f"job {name}: parent job {j['parent_job']}, this box its rank {j['rank']} "
                      f"for ranks {', '.join(map(str, j['ranks']))}", "    ")
    return lines


def child_lines(j: dict) -> list[str]:
    """A parent's job: the rack boxes below it, each one member on the wire."""
    return [ln for c in j.get("children") or []
            for ln in wrap(f"rack box {c['box']}: rank {c['rank']} on the wire, for ranks "
                           f"{', '.join(map(str, c['ranks']))}", " " * 8)]


def port_lines(st: dict) -> list[str]:
    """Per port of the box (xdp/swml_maps.h, struct swml_port_stats): the
    switch's frames in and out, where the data plane counts them."""
    rows = st.get("port_stats") or []
    lines = [f"  port {str(r['port'])}: in {r['rx_packets']} packets, {r['rx_bytes']} bytes; "
             f"out {r['tx_packets']} packets, {r['tx_bytes']} bytes" for r in rows]
    return [ln for line in lines for ln in wrap(line, "", "      ")]


def format_text(st: dict, show_all: bool = False) -> str:
    """One switch, in lines of at most 80 columns."""
    st = escaped_sample(st)
    rates = st.get("rates") or {}
    lines = headline(st) + shares_line(st) + tree_lines(st) + port_lines(st)
    if st["jobs"]:
        lines.append(JOB_HEAD)
        for j in st["jobs"]:
            lines += job_lines(st, j, rates.get("jobs", {}).get(str(j["id"])))
    else:
        lines.append("  no jobs")
    c = st.get("counters")
    if c:
        lines += counts("packets", c, outcomes(st), show_all, "")
        lines += counts("dropped", c, wire.DROP_REASONS, show_all, "")
    if rates:
        per_s = f"per second over {rates['interval_s']:.1f} s"
        lines += counts(per_s, rates["counters"], outcomes(st), show_all, ".0f")
        lines += counts("dropped per second", rates["drops"], wire.DROP_REASONS, show_all, ".1f")
    if (why := no_job_rates_reason(st)) and st["jobs"]:
        lines += wrap(why, "  ")
    if st.get("note"):
        lines += wrap(st["note"], "  ")
    return "\n".join(lines)
