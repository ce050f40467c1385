"""`swml-switch`: run the aggregation switch on an interface (up), inspect it
from any shell (status), set a job's share on it (job), and remove it (down);
or put the raw path's reflector in its place (reflect)."""
from __future__ import annotations

import json
import logging

import click

from .. import wire
from ..switch import daemon
from ..switch.dataplane import FANOUTS, SwitchParams
from ..switch.share_policy import POLICIES
from ..switch.shares import DEFAULT_MAX_WEIGHT, ShareConfig
from . import status_view
from .common import CONTEXT, DscpClasses, IPv4Address, Listen, Rate, version_option
from .switch_config import config_option


@click.group(context_settings=CONTEXT)
@version_option
def main() -> None:
    """switchml-xdp aggregation switch (XDP or user-space data plane + control daemon)."""


@main.command()
@config_option
@click.argument("iface", required=False)
@click.argument("more_ports", nargs=-1, metavar="[IFACE ...]")
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
@click.option("--fanout", type=click.Choice(FANOUTS), default=None,
              help="how RESULTs reach a job's members: one frame to the job's multicast group, "
                   "or a unicast copy to each member, for networks without multicast (cloud "
                   "VPCs); xdp data plane only [default: the running switch's when taking one "
                   "over, else multicast]")
@click.option("--auth", type=click.Choice(list(wire.AUTH_MODES)), default="header",
              show_default=True,
              help="what every RESULT's authenticator covers: its header (job, slot, seq, call "
                   "tag, exponent: a forger cannot make a RESULT), or the payload too (neither "
                   "can one who saw a RESULT alter its values; costs the switch ~0.65 us a "
                   "RESULT at k=256; docs/security.md)")
@click.option("--lease", type=click.FloatRange(0.2, 600), default=daemon.DEFAULT_LEASE_S,
              show_default=True, help="seconds without a heartbeat before a job is aborted")
@click.option("--require-token", is_flag=True,
              help="refuse jobs without a token (by default a job joined without one is open to "
                   "anyone who can reach the control port, and `status` marks it unprotected)")
@click.option("--initial-seq", type=click.IntRange(0, 0xFFFFFFFF), default=0, show_default=True,
              help="sequence number of every job's first packet (for tests: near 2**32, a job "
                   "runs through the wrap of the 32-bit counter)")
@click.option("--metrics", type=Listen(), default=None,
              help="also serve Prometheus metrics at http://[ADDR:]PORT/metrics (counters by "
                   "reason, per-job packets and bytes, jobs, members, slots; docs/operations.md) "
                   "[default: off; ADDR: every address]")
@click.option("--capacity", type=Rate(), default=None, metavar="RATE",
              help="what this box's port carries, in bits/s (40G, 100M): a job over several "
                   "boxes gives each a share of every tensor in proportion (docs/scale-out.md) "
                   "[default: the port's link speed as the kernel reports it]")
@click.option("--uplink", default=None, metavar="IFACE",
              help="a rack box: its port towards the parent box (with its own IPv4 address); "
                   "every job here joins the parent's as one member and sends each round "
                   "complete here up (docs/scale-out.md); xdp data plane only, with --parent")
@click.option("--parent", type=IPv4Address(), default=None, metavar="IP",
              help="a rack box: the parent box's address, reached through --uplink")
@click.option("--parent-control-port", type=click.IntRange(1, 65535),
              default=wire.DEFAULT_CONTROL_PORT, show_default=True,
              help="the parent box's control port")
@click.option("--share", type=click.Choice(POLICIES), default=None,
              help="divide the box's capacity between the jobs with data to send: fair "
                   "(equal parts), weighted (by each job's weight), srpt (the least left of "
                   "its call first); each job's ranks are told their rate in every RESULT "
                   "(docs/operations.md) [default: none, jobs share as their windows settle]")
@click.option("--max-weight", type=click.FloatRange(0, None, min_open=True),
              default=DEFAULT_MAX_WEIGHT, show_default=True,
              help="the largest weight a job may ask for at join (asks above it get it)")
@click.option("--dscp", type=DscpClasses(), default=None, metavar="LIST",
              help="mark each job's RESULTs with a DSCP, which its ranks copy onto their DATA, "
                   "from LIST (e.g. 46,34,26,0, highest priority first) by the job's place "
                   "under --share, so that a fabric's priority queues serve jobs as the box does")
@click.option("-v", "--verbose", is_flag=True, help="log joins, leaves and aborts")
def up(config, iface, more_ports, elements, slots, job_slots, port, control_port, dataplane, mode, fanout,
       auth, lease, require_token, initial_seq, metrics, capacity, uplink, parent,
       parent_control_port, share, max_weight, dscp, verbose):
    """Load the switch on IFACE and serve the control protocol until Ctrl-C.

    A box with several ports: `up eth1 eth2 ...`, the ports members of one
    bridge that holds the box's address; one slot pool for all, each member's
    RESULTs out of its own port (docs/scale-out.md). The first names the box
    (`status`, `down`).

    Options may also come from a TOML file (--config; /etc/swml/switch.toml is
    read when it exists): its keys are the long option names and `iface`, e.g.
    `iface = "eth1"`, `elements = 64`, `require-token = true`. What the command
    line gives wins."""
    if iface is None:
        raise click.UsageError("give IFACE, or `iface = \"...\"` in the config file"
                               + (f" ({config})" if config else ""))
    if (uplink is None) != (parent is None):
        raise click.UsageError("a rack box needs both --uplink IFACE and --parent IP "
                               "(or neither)")
    if dscp and share is None:
        raise click.UsageError("--dscp marks jobs by their place under --share: give --share too")
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="swml-switch: %(message)s")
    try:
        dp = daemon.make_dataplane(dataplane, iface, SwitchParams(elements, slots, port), mode,
                                   fanout, [iface, *more_ports], uplink)
        daemon.run(dp, control_port, job_slots, lease, require_token, initial_seq=initial_seq,
                   metrics=metrics, auth=auth, capacity_bps=capacity,
                   parent=(parent, parent_control_port) if parent else None,
                   share=ShareConfig(share, max_weight, dscp or ()) if share else None)
    except daemon.SwitchError as e:
        raise click.ClickException(str(e)) from None


@main.command()
@click.argument("iface")
def down(iface):
    """Stop the switch on IFACE: daemon, XDP program, pinned maps, state file (root)."""
    try:
        click.echo(f"swml-switch: {iface}: {daemon.down(iface)}")
    except daemon.SwitchError as e:
        raise click.ClickException(str(e)) from None


@main.command()
@click.argument("iface", required=False)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output (with rates)")
@click.option("--watch", "-w", is_flag=True,
              help="a live view, redrawn every INTERVAL: per job packets/s, Gbit/s, completions/s, "
                   "retransmissions answered/s; drops by reason per second (Ctrl-C ends it)")
@click.option("--interval", "-i", type=click.FloatRange(0, 3600), default=1.0, show_default=True,
              metavar="SECONDS",
              help="seconds between the two samples whose difference gives the rates "
                   "(0: no rates, counters only)")
@click.option("--count", type=click.IntRange(1, None), default=None, metavar="N",
              help="with --watch: stop after N redraws [default: until Ctrl-C]")
@click.option("--all", "-a", "show_all", is_flag=True,
              help="also the counters and drop reasons that are zero (left out by default)")
def status(iface, as_json, watch, interval, count, show_all):
    """Jobs, workers, counters and rates of the switch on IFACE, or of every
    switch on this machine.

    Any user may run it: the counters come through the daemon's control port
    (run it in the switch's network namespace), or, for root, from the XDP
    switch's pinned maps from anywhere."""
    if watch:
        if as_json:
            raise click.UsageError("--watch and --json do not go together")
        if interval <= 0:
            raise click.BadParameter("--watch needs an interval > 0", param_hint="--interval")
        status_view.watch(interval, count, iface=iface, show_all=show_all)
        return
    sts = status_view.sample_with_rates(interval, iface=iface)
    if iface is not None and not sts:
        raise click.ClickException(f"no switch is up on {status_view.escaped(iface)}")
    if as_json:
        click.echo(json.dumps({"switches": sts}, indent=1))
        return
    if not sts:
        click.echo("no switch is up on this machine")
        return
    click.echo("\n".join(status_view.format_text(s, show_all) for s in sts))


@main.command()
@click.argument("name")
@click.option("--weight", metavar="W", default=None,
              help="the job's weight under --share weighted: a number above zero, at most the "
                   "box's --max-weight (its part of the box is its weight over all running jobs')")
@click.option("--dscp", metavar="D", default=None,
              help="pin the job's DSCP mark (0..63), which its RESULTs carry and its ranks copy "
                   "onto their DATA, in place of the mark its place under --share gives it")
@click.option("--iface", default=None, metavar="IFACE",
              help="the box's interface, where several switches are up on this machine")
@click.option("--token-file", default=None, metavar="PATH",
              help="the daemon's operator token [default: /run/swml/IFACE.operator, root's alone]")
def job(name, weight, dscp, iface, token_file):
    """Set the running job NAME's weight and/or DSCP mark on the box started
    with --share (root: the box's operator; docs/operations.md, "Setting
    weights").

    Prints what changed (`job train: weight 3 (was 1)`); a refusal is one
    line and changes nothing."""
    from .switch_job import JobCommandError, set_share

    try:
        click.echo(set_share(name, weight, dscp, iface, token_file))
    except JobCommandError as e:
        raise click.ClickException(str(e)) from None


@main.command()
@click.argument("iface")
@click.option("--port", type=click.IntRange(1, 65535), default=wire.DEFAULT_PORT,
              show_default=True, help="the UDP port it answers (the data port: free while the "
                                      "switch is down)")
@click.option("--mode", type=click.Choice(["native", "generic"]), default=None,
              help="XDP mode [default: native, falling back to generic]")
@click.option("--seconds", type=click.FloatRange(0.1, None), default=None,
              help="go down after this long [default: at Ctrl-C]")
def reflect(iface, port, mode, seconds):
    """The path's ceiling: in the switch's place on IFACE, send every UDP
    frame to its address and PORT back where it came from (root;
    docs/performance.md, "The path's ceiling"). Workers measure against it with `swml-worker bench
    --baseline raw`; the switch cannot be up on IFACE meanwhile."""
    import signal
    import sys
    import time

    from ..bench.reflector import Reflector, ReflectorError

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))   # through the `with`: counts printed
    try:
        with Reflector(iface, port, mode) as r:
            until = "" if seconds is None else f" for {seconds:g} s"
            click.echo(f"swml-switch: {iface}: reflecting UDP to port {port} ({r.mode} XDP)"
                       f"{until}; Ctrl-C stops it", err=True)
            try:
                time.sleep(seconds if seconds is not None else 1e9)
            except KeyboardInterrupt:
                pass
            finally:
                click.echo(f"swml-switch: {iface}: reflected {r.counters()['reflected']} frames",
                           err=True)
    except ReflectorError as e:
        raise click.ClickException(str(e)) from None


if __name__ == "__main__":
    main()
