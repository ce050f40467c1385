"""`swml-lab`: build, inspect and remove emulated clusters in network namespaces.

Subcommands are plain click commands on the `main` group. A new one reuses
`lab_options` (the -n/--prefix/--rate trio), `lab_errors` (LabError and OS errors
become one-line click errors) and `host_table`:

    @main.command()
    @lab_options
    def demo(workers, prefix, rate):
        with lab_errors(), Lab(workers, prefix, rate) as lab:
            click.echo(host_table(lab))
"""
from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from switchml_xdp import wire
from switchml_xdp.net import NetError
from switchml_xdp.lab import Host, Lab, LabError, cleanup_leftovers
from switchml_xdp.lab import lifecycle
from switchml_xdp.lab.addressing import MAX_WORKERS, is_namespace_of, prefix_of
from switchml_xdp.lab.lifecycle import state_path
from switchml_xdp.lab.loss import LossError, probability
from switchml_xdp.lab.netns import ns_path, nsenter_argv
from switchml_xdp.lab.shaping import MAX_QUEUE_PACKETS, MAX_RATE_MBIT
from switchml_xdp.switch.dataplane import DEFAULT_FANOUT, FANOUTS

from .common import CONTEXT, allreduce_options, version_option


@click.group(context_settings=CONTEXT)
@version_option
def main() -> None:
    """Emulated switch + workers in network namespaces, on one machine (needs root)."""


def lab_options(f):
    """-n/--workers, --prefix and --rate, for every subcommand that builds a lab."""
    f = click.option("--rate", type=click.FloatRange(0, MAX_RATE_MBIT, min_open=True),
                     default=None, metavar="MBIT",
                     help="Shape every worker link to MBIT Mbit/s each way (TBF).")(f)
    f = click.option("--prefix", default=None,
                     help="Name prefix of everything the lab makes (default: swl + 5 hex digits).")(f)
    f = click.option("-n", "--workers", type=click.IntRange(1, MAX_WORKERS), default=2,
                     show_default=True, help="Number of worker namespaces.")(f)
    return f


class Probability(click.ParamType):
    """A probability given as a fraction (0.05) or a percentage (5%)."""
    name = "P"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        try:
            return probability(value, param.name if param else "probability")
        except LossError as e:
            self.fail(str(e), param, ctx)


def loss_options(f):
    """--loss, --dup and --loss-port: the lab's loss injector (switchml_xdp/lab/loss.py)."""
    f = click.option("--loss-port", type=click.IntRange(0, 65535), default=None, metavar="PORT",
                     help="UDP port (from or to) subject to loss and duplication "
                          "[default: the switch's data port, 48864; 0 = all UDP].")(f)
    f = click.option("--dup", type=Probability(), default=None,
                     help="Duplicate data-port UDP frames that pass with probability P, "
                          "on every worker link, both ways.")(f)
    f = click.option("--loss", type=Probability(), default=None,
                     help="Drop data-port UDP frames with probability P (0.05 or 5%) on every "
                          "worker link, both ways (ARP, ping, TCP are never dropped).")(f)
    return f


@contextlib.contextmanager
def lab_errors() -> Iterator[None]:
    """Turn the lab's failures into one-line click errors (exit status 1)."""
    try:
        yield
    except (LabError, NetError) as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        raise click.ClickException(f"{e.strerror or e}{where}") from None


def _pct(p: float) -> str:
    return f"{p * 100:.4g}%"


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
            row += tuple(f"{_pct(s['up'][k])}/{_pct(s['down'][k])}" for k in ("loss", "dup"))
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
    """The command that runs `swml-worker bench` as each rank of one job, in its namespace."""
    lab_cmd, worker_cmd = command_name("swml-lab"), command_name("swml-worker")
    n = len(lab.workers)
    return [f"{_sudo()}{lab_cmd} exec {w.ns} -- {worker_cmd} bench --switch {lab.switch.ip} "
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
@loss_options
@click.option("--queue", type=click.IntRange(1, MAX_QUEUE_PACKETS), default=None,
              metavar="PACKETS", help="Every shaped queue's depth in packets, like a switch "
              "port's buffer (needs --rate) [default: TBF's 20 ms]")
@click.option("--no-multicast", is_flag=True,
              help="The bridge carries no IPv4 multicast from the switch, like a cloud VPC "
                   "(start the switch with --fanout unicast there); not with loss.")
@click.option("--switch", "start_switch", is_flag=True,
              help="Also start `swml-switch up` in the lab's switch namespace, in the background "
                   "(it stops when the lab is removed), and print how to run a worker in each "
                   "worker namespace.")
@click.option("--switch-args", default="", metavar="ARGS",
              help="Options for that switch, as on the `swml-switch up` command line "
                   "(e.g. '-k 64 --dataplane userspace').")
def up(workers: int, prefix: str | None, rate: float | None, loss: float | None,
       dup: float | None, loss_port: int | None, queue: int | None, no_multicast: bool,
       start_switch: bool, switch_args: str) -> None:
    """Build a lab and leave it up (remove it with `swml-lab down PREFIX`)."""
    from switchml_xdp.lab.cluster import start_background_switch

    args = tuple(shlex.split(switch_args))
    if args and not start_switch:
        raise click.BadParameter("only with --switch", param_hint="--switch-args")
    if start_switch:
        _check_switch_args(args)
        if workers > wire.MAX_WORLD:
            raise click.BadParameter(f"a job has at most {wire.MAX_WORLD} ranks", param_hint="-n")
    with lab_errors():
        lab = Lab(workers=workers, prefix=prefix, rate_mbit=rate, keep=True,
                  loss=loss, dup=dup, loss_port=loss_port, queue_packets=queue,
                  multicast=not no_multicast).start()
        ready = None
        if start_switch:
            try:
                ready = start_background_switch(lab, args)
            except BaseException:
                lab.close()
                raise
    shaping = f"worker links shaped to {rate:g} Mbit/s" if rate else "links unshaped"
    if queue:
        shaping += f", {queue}-packet queues"
    if no_multicast:
        shaping += "; no multicast from the switch"
    if loss is not None or dup is not None or loss_port is not None:
        port = wire.DEFAULT_PORT if loss_port is None else loss_port
        shaping += (f"; loss {_pct(loss or 0)}, dup {_pct(dup or 0)} on worker links both ways "
                    f"({f'UDP port {port}' if port else 'all UDP'})")
    lab_cmd = command_name("swml-lab")
    click.echo(f"lab {lab.prefix} is up: {len(lab.workers)} workers, {shaping}")
    click.echo(host_table(lab))
    if ready:
        click.echo(f"\nswitch: {ready.removeprefix('swml-switch: ')}")
        click.echo(f"  its output: {lifecycle.switch_log_path(lab.prefix)}")
        click.echo(f"  live view:  {_sudo()}{lab_cmd} exec {lab.switch.ns} -- "
                   f"{command_name('swml-switch')} status --watch")
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


def _namespace_of(host: str, prefix: str | None) -> str:
    """The namespace HOST names: a lab namespace itself (swl12345-w0), or a host
    name (w0, sw) of lab `prefix`, or of the caller's only lab."""
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
    return Lab.from_state(prefix).host(host).ns


@main.command("exec", context_settings={"ignore_unknown_options": True})
@click.option("--lab", "prefix", default=None, metavar="PREFIX",
              help="The lab whose host HOST is (default: the lab in HOST's name, or your only lab).")
@click.argument("host")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(prefix: str | None, host: str, command: tuple[str, ...]) -> None:
    """Run COMMAND inside the network namespace of HOST, e.g.
    `swml-lab exec swl12345-w0 -- swml-worker bench ...` (HOST: a lab's namespace,
    or sw, w0, w1 ... with --lab)."""
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


@main.command()
@lab_options
@allreduce_options("16MiB", iterations=5, warmup=1)
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="check every element of every result")
@click.option("--fanout", type=click.Choice(FANOUTS), default=DEFAULT_FANOUT, show_default=True,
              help="the switch's `--fanout`; with unicast the lab carries no multicast from the "
                   "switch, as a cloud VPC")
def demo(workers, prefix, rate, size, iterations, warmup, dtype, backend, verify, fanout):
    """Switch + WORKERS workers in a lab, running an allreduce benchmark.

    Every argument is checked before anything is built."""
    from switchml_xdp.lab.demo import run_demo

    if prefix:
        raise click.BadParameter("demo makes a fresh lab each run", param_hint="--prefix")
    if workers > wire.MAX_WORLD:
        raise click.BadParameter(f"a job has at most {wire.MAX_WORLD} ranks", param_hint="--workers")
    with lab_errors():
        try:
            run_demo(workers, size, iterations, warmup, dtype, backend, verify, rate, out=click.echo,
                     fanout=fanout)
        except RuntimeError as e:
            raise click.ClickException(str(e)) from None


@main.command()
@click.option("-n", "--workers", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Number of lab hosts (each runs --ranks-per-host ranks; a job has at most 64 hosts).")
@click.option("--epochs", type=click.IntRange(1, None), default=30, show_default=True,
              help="Passes over the training set.")
@click.option("--batch", type=click.IntRange(1, None), default=16, show_default=True,
              help="Batch size per rank.")
@click.option("--lr", type=click.FloatRange(0, None, min_open=True), default=0.05, show_default=True,
              help="Learning rate (SGD).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the model's weights and the data split (the same for both runs).")
@click.option("--bucket-kb", type=click.FloatRange(0, None, min_open=True), default=1.0,
              show_default=True, help="DDP bucket size cap in KiB.")
@click.option("--backend", default="auto", show_default=True, type=click.Choice(["auto", "afxdp", "udp"]),
              help="The swml worker's datapath.")
@click.option("--rate", type=click.FloatRange(0, MAX_RATE_MBIT, min_open=True), default=None,
              metavar="MBIT", help="Shape every worker link to MBIT Mbit/s each way (TBF).")
@click.option("--ranks-per-host", type=click.IntRange(1, 16), default=1, show_default=True,
              help="Ranks on each lab host, as torchrun --nproc_per_node: the swml run then "
                   "reduces each host's ranks first and streams one leader a host (the swml "
                   "process group); with 1, it uses the DDP hook.")
@click.option("--png", default="swml-train.png", show_default=True, type=click.Path(dir_okay=False),
              help="Where to save the loss and accuracy curves.")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False),
              help="Also save both runs' curves as JSON.")
def train(workers, epochs, batch, lr, seed, bucket_kb, backend, rate, ranks_per_host, png,
          json_path):
    """Train an MLP on scikit-learn's digits with DDP, through the switch and with Gloo.

    Same seeds both times; prints final accuracy and time per epoch of both and
    saves a PNG of the loss and accuracy curves (needs the torch extra,
    scikit-learn and matplotlib)."""
    try:
        import matplotlib  # noqa: F401
        import sklearn  # noqa: F401

        import switchml_xdp.torch  # noqa: F401  (says how to install torch if it is missing)
        from switchml_xdp.lab.train_example import TrainConfig, run_lab_training
    except ImportError as e:
        raise click.ClickException(f"swml-lab train needs torch, scikit-learn and matplotlib: {e}") from None
    cfg = TrainConfig(epochs=epochs, batch=batch, lr=lr, seed=seed, bucket_kb=bucket_kb,
                      ranks_per_host=ranks_per_host)
    with lab_errors():
        try:
            run_lab_training(workers, cfg, backend, png, json_path, rate, out=click.echo)
        except RuntimeError as e:
            raise click.ClickException(str(e)) from None


def _list_of(kind, what: str):
    """A click callback: "2,4,8" -> (2, 4, 8); percentages allowed for probabilities."""
    def convert(ctx, param, value):
        if value is None or isinstance(value, tuple):
            return value
        items = [v for v in str(value).replace(" ", "").split(",") if v]
        try:
            if kind is float:
                return tuple(probability(v, what) for v in items)
            return tuple(kind(v) for v in items)
        except (ValueError, LabError) as e:
            raise click.BadParameter(f"{value!r}: {e}") from None
    return convert


@main.command()
@click.option("-n", "--workers", default="2,4,8", show_default=True, callback=_list_of(int, "workers"),
              help="worker counts, comma-separated (one lab each)")
@click.option("--rate", type=click.FloatRange(0, MAX_RATE_MBIT, min_open=True), default=None,
              metavar="MBIT", help="every worker link's rate, each way [default: 50, low enough "
                                   "that 2 cores keep up with 8 workers]")
@click.option("--size", default="8MiB", show_default=True, help="float32 tensor size (bytes; KiB/MiB/...)")
@click.option("--iterations", default=5, show_default=True, type=click.IntRange(1, None),
              help="timed allreduces per measurement")
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(0, None),
              help="untimed allreduces before them")
@click.option("--loss", "losses", default="0,0.1%,1%", show_default=True,
              callback=_list_of(float, "loss"), help="loss rates per link and direction")
@click.option("-k", "--elements", "ks", default="64,256", show_default=True,
              callback=_list_of(int, "k"), help="elements a packet (swml systems)")
@click.option("--systems", default="swml-afxdp,swml-udp,userspace,gloo", show_default=True,
              callback=_list_of(str, "systems"),
              help="what to run: swml-afxdp / swml-udp (the XDP switch, workers on the afxdp or "
                   "udp backend), userspace (the same protocol served by a user-space switch "
                   "process on a UDP socket instead of XDP: the baseline that shows what XDP "
                   "buys), gloo (torch.distributed's ring allreduce over TCP); and the 16-bit "
                   "pair: swml-afxdp16 (the switch's 16-bit block format) and gloo-fp16 (Gloo on "
                   "a float16 copy, as torch's fp16 compression hook)")
@click.option("--job-slots", type=click.IntRange(8, 1024), default=None,
              help="slots a job gets on the switches [default: what covers 8 ms of the "
                   "link's sending (a lost packet's recovery), 16..512]")
@click.option("--out", "out_dir", default=None,
              help="directory for lab_bench.json, lab_bench.md and the PNG plots [default: a new "
                   "./swml-lab-bench-DATE-TIME; the figures README quotes are in bench/results]")
@click.option("--no-check", is_flag=True, help="skip checking the first result against the exact sum")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE",
              help="extra environment for every rank process (e.g. SWML_AFXDP_SPIN=200)")
@click.option("--wait-quiet", default=600.0, show_default=True, type=click.FloatRange(0, None),
              metavar="SECONDS", help="before each measurement wait up to SECONDS for the machine to "
                                      "be quiet (no other lab, little CPU use); 0: never wait")
@click.option("--queue", type=click.IntRange(1, MAX_QUEUE_PACKETS), default=None,
              metavar="PACKETS", help="Every shaped queue's depth in packets (a switch port's "
              "buffer) [default: TBF's 20 ms]")
@click.option("--fanout", type=click.Choice(FANOUTS), default=DEFAULT_FANOUT, show_default=True,
              help="the XDP switch's `--fanout` (the lab keeps multicast: this measures the cost)")
def bench(workers, rate, queue, size, iterations, warmup, losses, ks, systems, job_slots, out_dir, no_check,
          env, wait_quiet, fanout):
    """Allreduce through switchml-xdp (afxdp, udp), a user-space switch and Gloo,
    on shaped lab links, sweeping workers, loss and k; JSON, Markdown, PNG plots.

    The default sweep (3 worker counts x 3 loss rates x 2 k x 4 systems) takes
    about 25 minutes on a quiet 2-core machine, longer while it waits for
    the machine to be quiet (--wait-quiet); e.g. `-n 2 --loss 0 -k 256`
    takes a few minutes."""
    import time

    from switchml_xdp.bench import lab_bench
    from switchml_xdp.bench.allreduce_bench import parse_size

    bad = [s for s in systems if s not in lab_bench.SYSTEMS]
    if bad:
        raise click.BadParameter(f"unknown system(s) {', '.join(bad)}; choose from "
                                 f"{', '.join(lab_bench.SYSTEMS)}", param_hint="--systems")
    if not workers or min(workers) < 1 or max(workers) > 64:
        raise click.BadParameter("worker counts must be in 1..64", param_hint="--workers")
    if any(not 1 <= k <= 364 for k in ks):
        raise click.BadParameter("k must be in 1..364", param_hint="--elements")
    try:
        size_bytes = parse_size(size)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--size") from None
    if out_dir is None:
        out_dir = f"swml-lab-bench-{time.strftime('%Y%m%d-%H%M%S')}"
        if Path(out_dir).exists():
            raise click.ClickException(f"{out_dir} exists; give --out")
    cfg = lab_bench.BenchConfig(
        workers=workers, rate_mbit=rate or lab_bench.DEFAULT_RATE_MBIT, queue_packets=queue,
        size=size_bytes,
        iterations=iterations, warmup=warmup, losses=losses, ks=ks, systems=systems,
        out_dir=out_dir, job_slots=job_slots, check=not no_check,
        env=dict(e.split("=", 1) for e in env if "=" in e),
        wait_quiet=wait_quiet, fanout=fanout,
        command="swml-lab bench" + "".join(f" {shlex.quote(a)}" for a in sys.argv[2:]))
    with lab_errors():
        lab_bench.run_bench(cfg, out=click.echo)


# --- swml-lab vm (issue 14): the same in qemu VMs; everything in switchml_xdp/lab/vm.py ---
@main.command()
@click.option("-n", "--workers", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Number of worker VMs (one more VM runs the switch).")
@click.option("--size", default="1MiB", show_default=True, help="tensor size (bytes; K/M/G/KiB/MiB/GiB)")
@click.option("--iterations", default=5, show_default=True, type=click.IntRange(1, None),
              help="timed allreduces")
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(0, None),
              help="untimed allreduces before them")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "int32"]),
              help="element type")
@click.option("--accel", default="auto", show_default=True, type=click.Choice(["auto", "kvm", "tcg"]),
              help="auto: KVM if a short probe boot works, else TCG")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="check every element of every result")
def vm(workers, size, iterations, warmup, dtype, accel, verify):
    """Switch + WORKERS workers in qemu VMs (virtio-net, native XDP), running the benchmark."""
    from switchml_xdp.lab.vm import run_vm_demo

    with lab_errors():
        run_vm_demo(workers, size, iterations, warmup, dtype, verify, accel, out=click.echo)


if __name__ == "__main__":
    main()
