"""`swml-lab`: build, inspect and remove emulated clusters in network namespaces.

Here: the `main` group and the commands that manage labs (up, exec, down);
the commands that run a workload in a lab of their own (demo, train, bench,
vm) are in cli/lab_runs.py. Subcommands are plain click commands. A new one
reuses `lab_options` (the -n/--prefix/--rate trio), `lab_errors` (LabError
and OS errors become one-line click errors), both in cli/lab_options.py, and
`host_table`:

    @main.command()
    @lab_options
    def show(workers, prefix, rate):
        with lab_errors(), Lab(workers, prefix, rate) as lab:
            click.echo(host_table(lab))
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import click

from switchml_xdp import wire
from switchml_xdp.lab import Host, Lab, LabError, cleanup_leftovers, igmp, lifecycle
from switchml_xdp.lab.addressing import is_namespace_of, prefix_of
from switchml_xdp.lab.lifecycle import state_path
from switchml_xdp.lab.netns import ns_path, nsenter_argv
from switchml_xdp.lab.racks import open_lab
from switchml_xdp.lab.shaping import MAX_QUEUE_PACKETS
from switchml_xdp.lab.wiring import HOST_QUEUE_PACKETS

from .common import CONTEXT, version_option
from .lab_options import (
    box_options,
    check_burst,
    check_port_hooks,
    dscp_bands_of,
    lab_errors,
    lab_options,
    link_loss,
    loss_options,
    loss_text,
    mtu_option,
    pct,
    port_hooks_option,
    rack_options,
    racks_of,
)
from .lab_runs import bench, demo, train, vm


@click.group(context_settings=CONTEXT)
@version_option
def main() -> None:
    """Emulated switch + workers in network namespaces, on one machine (needs root)."""


def host_table(lab: Lab | None = None, hosts: list[Host] | None = None) -> str:
    """Aligned table of hosts: name, namespace, iface, ip, mac; and, for a lab
    with the loss injector, each link's loss and dup as up/down."""
    hosts = hosts if hosts is not None else lab.hosts
    loss = lab.loss_settings() if lab is not None else {}
    rows = [("host", "namespace", "iface", "ip", "mac") + (("loss up/down", "dup up/down") if loss else ())]
    for h in hosts:
        row = (h.name, h.ns, h.iface, h.ip, h.mac)
        if loss:
            s = loss[h.name]
            row += (f"{link_loss(s['up'])}/{link_loss(s['down'])}",
                    f"{pct(s['up']['dup'])}/{pct(s['down']['dup'])}")
        rows.append(row)
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)


def command_name(name: str) -> str:
    """How to call one of our programs from another shell: its bare name where
    PATH finds this installation's, its full path otherwise (sudo resets PATH)."""
    ours = Path(sys.executable).parent / name
    if ours.exists() and shutil.which(name) != str(ours):
        return str(ours)
    return name


def _sudo() -> str:
    """"sudo -E " for a caller who reached root through sudo (-E: keep $SWML_TOKEN)."""
    return "sudo -E " if "SUDO_UID" in os.environ else ""


def worker_commands(lab: Lab, job: str = "j1") -> list[str]:
    """The command that runs `swml-worker bench` as each rank of one job, in
    its namespace, through every box."""
    lab_cmd, worker_cmd = command_name("swml-lab"), command_name("swml-worker")
    n = len(lab.workers)
    boxes = ",".join(b.ip for b in lab.switches)
    return [f"{_sudo()}{lab_cmd} exec {w.ns} -- {worker_cmd} bench --switch {boxes} "
            f"--job {job} --rank {rank} --world {n}" for rank, w in enumerate(lab.workers)]


def _check_switch_args(args: tuple[str, ...]) -> None:
    """Parse the `swml-switch up` options now, so a bad one fails before the lab is built."""
    from .switch import up as switch_up

    try:
        switch_up.make_context("swml-switch up", ["IFACE", *args])
    except click.ClickException as e:
        raise click.BadParameter(e.format_message(), param_hint="--switch-args") from None


@main.command()
@lab_options
@box_options
@loss_options
@click.option("--queue", type=click.IntRange(1, MAX_QUEUE_PACKETS), default=None,
              metavar="PACKETS", help="Every shaped switch port's queue depth in packets, its "
              "buffer (needs --rate or --box-rate; the hosts' own interfaces keep "
              f"{HOST_QUEUE_PACKETS}) "
              "[default: TBF's 20 ms]")
@click.option("--dscp-bands", default=None, metavar="LIST", callback=dscp_bands_of,
              help="Every box's shaped port serves the workers' frames by DSCP, LIST highest "
                   "priority first (e.g. 46,34,26,0; any other DSCP goes with the last), as a "
                   "fabric's priority queues would (needs --rate and --box-rate; the switch "
                   "marks jobs with --switch-args '--share fair --dscp LIST').")
@click.option("--no-multicast", is_flag=True,
              help="The bridge carries no IPv4 multicast from the switch, like a cloud VPC "
                   "(start the switch with --fanout unicast there); not with loss.")
@click.option("--snooping", is_flag=True,
              help="The bridge snoops IGMP, with a querier on an uplink as on managed "
                   "networks: it sends the job's group only to ports whose host joined it "
                   "(and floods no unknown group), and sends no query when a port comes up.")
@click.option("--query-interval", type=click.FloatRange(1, igmp.MAX_QUERY_INTERVAL_S),
              default=None, metavar="SECONDS",
              help="The querier's interval (needs --snooping) "
                   f"[default: {igmp.REAL_QUERY_INTERVAL_S} s, as on real networks].")
@click.option("--switch", "start_switch", is_flag=True,
              help="Also start `swml-switch up` in every box's namespace, in the background "
                   "(it stops when the lab is removed), and print how to run a worker in each "
                   "worker namespace.")
@click.option("--switch-args", default="", metavar="ARGS",
              help="Options for that switch, as on the `swml-switch up` command line "
                   "(e.g. '-k 64 --dataplane userspace').")
@rack_options
@mtu_option
@port_hooks_option
def up(workers: int, prefix: str | None, rate: float | None, boxes: int, ports: int,
       box_rate: float | None, loss: float | None, dup: float | None, burst: float | None,
       loss_port: int | None, queue: int | None, dscp_bands: tuple[int, ...] | None, no_multicast: bool,
       snooping: bool, query_interval: float | None, start_switch: bool, switch_args: str,
       racks: int | None, per_rack: str | None, uplink_rate: float | None,
       layout: str | None, mtu: int | None, port_hooks: str) -> None:
    """Build a lab and leave it up (remove it with `swml-lab down PREFIX`)."""
    from switchml_xdp.lab.box_runs import capacity_args
    from switchml_xdp.lab.cluster import start_background_switch

    args = tuple(shlex.split(switch_args))
    if args and not start_switch:
        raise click.BadParameter("only with --switch", param_hint="--switch-args")
    sizes = racks_of(racks, per_rack, uplink_rate, layout)
    check_burst(burst, [loss])
    check_port_hooks(port_hooks, (loss, dup, loss_port) != (None,) * 3, sizes is not None)
    if sizes is not None:
        for value, name in ((no_multicast, "--no-multicast"), (snooping, "--snooping"),
                            (loss_port, "--loss-port"), (dscp_bands, "--dscp-bands"), (mtu, "--mtu")):
            if value:
                raise click.BadParameter("not with --racks", param_hint=name)
        if start_switch:
            _check_switch_args(args)
        _up_racks(sizes, layout or "tree", prefix, rate, uplink_rate, loss, dup, queue,
                  args if start_switch else None, burst)
        return
    if dscp_bands and (rate is None or box_rate is None):
        raise click.BadParameter("needs --rate and --box-rate (the bands order a box's shaped "
                                 "port)", param_hint="--dscp-bands")
    if query_interval is not None and not snooping:
        raise click.BadParameter("only with --snooping", param_hint="--query-interval")
    if snooping and no_multicast:
        raise click.BadParameter("a bridge without multicast has nothing to snoop",
                                 param_hint="--snooping")
    if snooping and query_interval is None:
        query_interval = igmp.REAL_QUERY_INTERVAL_S
    if start_switch:
        _check_switch_args(args)
        if workers > wire.MAX_WORLD:
            raise click.BadParameter(f"a job has at most {wire.MAX_WORLD} ranks", param_hint="-n")
    with lab_errors():
        lab = Lab(workers=workers, prefix=prefix, rate_mbit=rate, keep=True,
                  loss=loss, dup=dup, loss_port=loss_port, queue_packets=queue, burst=burst,
                  multicast=not no_multicast, igmp=snooping,
                  query_interval_s=query_interval, boxes=boxes, box_rate_mbit=box_rate,
                  ports=ports, dscp_bands=dscp_bands, mtu=mtu, port_hooks=port_hooks).start()
        ready = []
        if start_switch:
            try:
                # A shaped box tells joiners its rate, unless --switch-args says otherwise.
                own = any(a.split("=", 1)[0] == "--capacity" for a in args)
                told = [] if own else capacity_args(box_rate)
                ready = [start_background_switch(lab, [*args, *told], box=b) for b in range(boxes)]
            except BaseException:
                lab.close()
                raise
    shaping = f"worker links shaped to {rate:g} Mbit/s" if rate else "worker links unshaped"
    if boxes > 1:
        shaping = f"{boxes} boxes, " + shaping
    if ports > 1:
        shaping = f"a switch of {ports} ports, each on a segment of its own, " + shaping
    if box_rate:
        shaping += f", box links to {box_rate:g} Mbit/s"
    if queue:
        shaping += f", {queue}-packet queues"
    if mtu:
        shaping += f", MTU {mtu}"
    if dscp_bands:
        shaping += f", DSCP bands {','.join(map(str, dscp_bands))} on box ports"
    if no_multicast:
        shaping += "; no multicast from the switch"
    if snooping:
        shaping += f"; IGMP snooping, a query every {query_interval:g} s"
    if loss is not None or dup is not None or loss_port is not None:
        port = wire.DEFAULT_PORT if loss_port is None else loss_port
        shaping += (f"; loss {loss_text(loss or 0, burst)}, dup {pct(dup or 0)} on worker links both ways "
                    f"({f'UDP port {port}' if port else 'all UDP'})")
    lab_cmd = command_name("swml-lab")
    click.echo(f"lab {lab.prefix} is up: {len(lab.workers)} workers, {shaping}")
    click.echo(host_table(lab))
    for b, line in enumerate(ready):
        click.echo(f"\nswitch{f' on {lab.switches[b].name}' if b else ''}: "
                   f"{line.removeprefix('swml-switch: ')}")
        click.echo(f"  its output: {lifecycle.switch_log_path(lab.prefix, b)}")
        click.echo(f"  live view:  {_sudo()}{lab_cmd} exec {lab.switches[b].ns} -- "
                   f"{command_name('swml-switch')} status --watch")
    if ready:
        click.echo("\nrun one job, a worker in each namespace (each in its own shell; "
                   "the job's token through the environment):")
        click.echo("  export SWML_TOKEN=$(openssl rand -hex 16)")
        for line in worker_commands(lab):
            click.echo(f"  {line}")
    click.echo(f"\nrun a command inside a host:  {_sudo()}{lab_cmd} exec NAMESPACE -- CMD")
    click.echo(f"  (the same as {' '.join(nsenter_argv('NAMESPACE', ['CMD']))}),")
    click.echo(f"  e.g. {_sudo()}{lab_cmd} exec {lab.workers[0].ns} -- ping -c1 {lab.switch.ip}")
    click.echo(f"description: {state_path(lab.prefix)}")
    click.echo(f"remove it:   {_sudo()}{lab_cmd} down {lab.prefix}")


def _up_racks(sizes: list[int], layout: str, prefix: str | None, rate: float | None,
              uplink_rate: float | None, loss: float | None, dup: float | None,
              queue: int | None, switch_args: tuple[str, ...] | None,
              burst: float | None = None) -> None:
    """`swml-lab up --racks`: a lab of racks left up; with switch_args, the
    parent's switch and (tree) every rack box's as its child, in the background."""
    from switchml_xdp.lab.cluster import start_background_switch
    from switchml_xdp.lab.racks import RacksLab

    with lab_errors():
        lab = RacksLab(None, sizes, layout, prefix, rate, uplink_rate, keep=True, loss=loss,
                       dup=dup, queue_packets=queue, burst=burst).start()
        ready = []
        if switch_args is not None:
            try:
                ready.append(start_background_switch(lab, switch_args))
                ready += [start_background_switch(lab, [*switch_args, *lab.rack_box_args(r)],
                                                  box=1 + r)
                          for r in range(len(lab.switches) - 1)]
            except BaseException:
                lab.close()
                raise
    links = ", ".join(
        [f"worker links {rate:g} Mbit/s" if rate else "worker links unshaped",
         f"uplinks {uplink_rate:g} Mbit/s" if uplink_rate else "uplinks unshaped",
         *([f"loss {loss_text(loss or 0, burst)}, dup {pct(dup or 0)} on worker links and uplinks"]
           if loss is not None or dup is not None else [])])
    lab_cmd = command_name("swml-lab")
    click.echo(f"lab {lab.prefix} is up: racks of {','.join(map(str, sizes))} workers, "
               f"{layout}, {links}")
    click.echo(host_table(lab))
    for box, line in zip(lab.switches, ready):
        click.echo(f"switch on {box.name}: {line.removeprefix('swml-switch: ')}")
    if ready:
        click.echo("\nrun one job, a worker in each namespace, each joining "
                   + ("its rack's box" if layout == "tree" else "the parent across the core")
                   + " (the job's token through the environment):")
        click.echo("  export SWML_TOKEN=$(openssl rand -hex 16)")
        for rank, w in enumerate(lab.workers):
            click.echo(f"  {_sudo()}{lab_cmd} exec {w.ns} -- {command_name('swml-worker')} bench "
                       f"--switch {lab.box_of(w).ip} --job j1 --rank {rank} "
                       f"--world {len(lab.workers)}")
    click.echo(f"description: {state_path(lab.prefix)}")
    click.echo(f"remove it:   {_sudo()}{lab_cmd} down {lab.prefix}")


def _namespace_of(host: str, prefix: str | None) -> str:
    """The namespace HOST names: a lab namespace itself (swl12345-w0), or a host
    name (w0, sw, sw1) of lab `prefix`, or of the caller's only lab."""
    known = lifecycle.known_prefixes()
    if prefix is None and prefix_of(host) in known and is_namespace_of(prefix_of(host), host):
        return host
    if prefix is None:
        mine = sorted(p for p in known
                      if (lifecycle.read_state(p) or {}).get("owner_uid") == lifecycle.caller_uid())
        if len(mine) != 1:
            raise LabError(f"{host!r} is not a lab namespace; give its full name (e.g. "
                           f"{(mine or ['swl12345'])[0]}-{host})"
                           + (f" or --lab PREFIX: you have {len(mine)} labs" if mine else ""))
        prefix = mine[0]
    return open_lab(prefix).host(host).ns


@main.command("exec", context_settings={"ignore_unknown_options": True})
@click.option("--lab", "prefix", default=None, metavar="PREFIX",
              help="The lab whose host HOST is (default: the lab in HOST's name, or your only lab).")
@click.argument("host")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(prefix: str | None, host: str, command: tuple[str, ...]) -> None:
    """Run COMMAND inside the network namespace of HOST, e.g.
    `swml-lab exec swl12345-w0 -- swml-worker bench ...` (HOST: a lab's namespace,
    or sw, sw1 ..., w0, w1 ... with --lab)."""
    if os.geteuid() != 0:
        raise click.ClickException("swml-lab exec needs root (it enters a network namespace): "
                                   "run it with sudo")
    with lab_errors():
        ns = _namespace_of(host, prefix)
        if not ns_path(ns).exists():
            raise LabError(f"namespace {ns} is gone")
    argv = nsenter_argv(ns, command)
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        raise click.ClickException(f"cannot run {argv[0]}: {e.strerror}") from None


@main.command()
@click.argument("prefix", required=False)
@click.option("--all", "all_", is_flag=True,
              help="Remove every lab of yours that nothing uses (left up by `swml-lab up`, or "
                   "whose program died); other users' labs and labs in use are left alone.")
def down(prefix: str | None, all_: bool) -> None:
    """Remove the lab PREFIX (its namespaces, processes, switch, description)."""
    if bool(prefix) == all_:
        raise click.UsageError("give either a lab PREFIX or --all")
    if os.geteuid() != 0:
        raise click.ClickException("swml-lab down needs root (it removes network namespaces): "
                                   "run it with sudo")
    with lab_errors():
        if all_:
            removed, spared = lifecycle.remove_own_labs()
        else:
            had_state = state_path(prefix).exists()
            removed, spared = cleanup_leftovers(prefix), []
            if not removed and not had_state:
                raise click.ClickException(f"no lab with prefix {prefix!r}")
    click.echo(f"removed {len(removed)} namespace(s)" + (f": {' '.join(removed)}" if removed else ""))
    for p, why in spared:
        click.echo(f"left lab {p} alone: {why} (`swml-lab down {p}` removes it)")


for _command in (demo, train, bench, vm):
    main.add_command(_command)


if __name__ == "__main__":
    main()
