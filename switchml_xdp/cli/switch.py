"""`swml-switch`: run the aggregation switch on an interface (up), inspect it
from any shell (status), and remove it (down)."""
from __future__ import annotations

import json
import logging
import os
import time

import click

from .. import wire
from ..bpf import PinnedMapError
from ..switch import daemon
from ..switch.dataplane import SwitchParams
from ..switch.maps import SwitchMaps


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """switchml-xdp aggregation switch (XDP or user-space data plane + control daemon)."""


@main.command()
@click.argument("iface")
@click.option("--elements", "-k", type=click.IntRange(1, wire.MAX_K), default=wire.DEFAULT_K,
              show_default=True, help="int32 elements a packet (fixed for the switch)")
@click.option("--slots", type=click.IntRange(1, 65535), default=wire.DEFAULT_SLOTS,
              show_default=True, help="aggregation slots shared by all jobs")
@click.option("--job-slots", type=click.IntRange(1, 65535), default=daemon.DEFAULT_JOB_SLOTS,
              show_default=True, help="slots a job gets (its window), if that many are free")
@click.option("--port", type=click.IntRange(1, 65535), default=wire.DEFAULT_PORT,
              show_default=True, help="UDP port of the data plane")
@click.option("--control-port", type=click.IntRange(1, 65535), default=wire.DEFAULT_CONTROL_PORT,
              show_default=True, help="TCP port of the control protocol")
@click.option("--dataplane", type=click.Choice(list(daemon.DATAPLANES)), default="xdp",
              show_default=True,
              help="what handles the packets: xdp (the XDP program on IFACE) or userspace "
                   "(a thread of the daemon on a UDP socket, no XDP: a baseline, or a fallback)")
@click.option("--mode", type=click.Choice(["native", "generic"]), default=None,
              help="XDP mode, for --dataplane xdp only [default: native, falling back to generic]")
@click.option("--lease", type=click.FloatRange(0.2, 600), default=daemon.DEFAULT_LEASE_S,
              show_default=True, help="seconds without a heartbeat before a job is aborted")
@click.option("--require-token", is_flag=True,
              help="refuse jobs without a token (by default a job joined without one is open to "
                   "anyone who can reach the control port, and `status` marks it unprotected)")
@click.option("--initial-seq", type=click.IntRange(0, 0xFFFFFFFF), default=0, show_default=True,
              help="sequence number of every job's first packet (for tests: near 2**32, a job "
                   "runs through the wrap of the 32-bit counter)")
@click.option("-v", "--verbose", is_flag=True, help="log joins, leaves and aborts")
def up(iface, elements, slots, job_slots, port, control_port, dataplane, mode, lease, require_token,
       initial_seq, verbose):
    """Load the switch on IFACE and serve the control protocol until Ctrl-C."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="swml-switch: %(message)s")
    try:
        dp = daemon.make_dataplane(dataplane, iface, SwitchParams(elements, slots, port), mode)
        daemon.run(dp, control_port, job_slots, lease, require_token, initial_seq)
    except daemon.SwitchError as e:
        raise click.ClickException(str(e)) from None


@main.command()
@click.argument("iface")
def down(iface):
    """Stop the switch on IFACE: daemon, XDP program, pinned maps, state file."""
    try:
        click.echo(f"swml-switch: {iface}: {daemon.down(iface)}")
    except daemon.SwitchError as e:
        raise click.ClickException(str(e)) from None


def _daemon_status(st: dict) -> dict | None:
    """The daemon's own `status` reply through its control port; None where
    this shell cannot reach it (another network namespace, a firewall)."""
    from ..worker.control import ControlClient, ControlError

    try:
        client = ControlClient(st["ip"], st["control_port"], connect_timeout=1.0)
    except ControlError:
        return None
    try:
        return client.status()
    except (ControlError, OSError, ValueError):
        return None
    finally:
        client.close()


def collect_status() -> list[dict]:
    """Every switch on this machine, from its state file (readable by anyone),
    and its counters from the pinned maps (XDP, root only) or else from its
    daemon's control port (user-space tables live in the daemon's memory;
    other users cannot open the pins). Where neither works, `note` says why."""
    out = []
    root = os.geteuid() == 0
    for st in daemon.all_states():
        st = dict(st, alive=daemon.lock_holder(st["iface"]) is not None)
        if root and st["dataplane"] == "xdp" and SwitchMaps.exist(st["iface"]):
            try:
                maps = SwitchMaps(st["iface"])
            except PinnedMapError as e:  # e.g. a switch of another version of this package
                st["note"] = f"counters: {e}"
                out.append(st)
                continue
            try:
                st["counters"] = maps.read_counters()
                st["active_job_ids"] = [j for j in range(1, wire.MAX_JOBS) if maps.job_active(j)]
            finally:
                maps.close()
        elif st["alive"] and (reply := _daemon_status(st)) is not None:
            st["counters"] = reply["counters"]
            st["jobs"] = reply["jobs"]
            st["active_job_ids"] = [j["id"] for j in reply["jobs"] if j["state"] == "running"]
        elif st["alive"]:
            st["note"] = (f"counters: the daemon's control port {st['ip']}:{st['control_port']} is not "
                          f"reachable from here" + ("" if root else ", and only root can read the "
                                                    "pinned maps"))
        out.append(st)
    return out


def _format(st: dict) -> str:
    p = st["params"]
    used = sum(j["slots"] for j in st["jobs"] if j["state"] == "running")
    lines = [f"switch {st['iface']}: {st['label']}, k={p['k']}, slots {used}/{p['slots']} in use, "
             f"data {st['ip']}:{p['port']}, control {st['ip']}:{st['control_port']}, "
             f"daemon pid {st['pid']} {'running' if st['alive'] else 'NOT RUNNING'}, "
             f"up {time.time() - st['started']:.0f} s"]
    if st["jobs"]:
        lines.append(f"  {'id':>3} {'job':<16} {'world':>5} {'joined':>6} {'slots':<12} state")
        for j in st["jobs"]:
            rng = f"{j['slot_base']}-{j['slot_base'] + j['slots'] - 1}" if j["slot_base"] is not None else "-"
            token = "" if j.get("protected", True) else " (unprotected: no token)"
            lines.append(f"  {j['id'] or '-':>3} {j['name']:<16} {j['world']:>5} "
                         f"{len(j['members']):>6} {rng:<12} {j['state']}{token}")
            for r, m in j["members"].items():
                lines.append(f"        rank {r}: {m['ip']}:{m['port']} {m['mac']}{' (left)' if m['left'] else ''}")
    else:
        lines.append("  no jobs")
    c = st.get("counters")
    if c:
        lines.append("  packets: " + ", ".join(f"{n} {c[n]}" for n in wire.COUNTER_NAMES[:6]))
        drops = {n: c[n] for n in wire.DROP_REASONS if c[n]}
        lines.append("  dropped: " + (", ".join(f"{n} {v}" for n, v in drops.items()) or "none"))
    if st.get("note"):
        lines.append(f"  {st['note']}")
    return "\n".join(lines)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def status(as_json):
    """Jobs, workers and counters of every switch on this machine."""
    sts = collect_status()
    if as_json:
        click.echo(json.dumps({"switches": sts}, indent=1))
        return
    if not sts:
        click.echo("no switch is up on this machine")
        return
    click.echo("\n".join(_format(s) for s in sts))


if __name__ == "__main__":
    main()
