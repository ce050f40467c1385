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
from collections.abc import Iterator

import click

from switchml_xdp.lab.netns import nsenter_argv
from switchml_xdp.lab.topology import (
    MAX_RATE_MBIT, MAX_WORKERS, Host, Lab, LabError, cleanup_leftovers, state_path,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
        from switchml_xdp.lab.loss import LossError, probability
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
    except LabError as e:
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


@main.command()
@lab_options
@loss_options
def up(workers: int, prefix: str | None, rate: float | None, loss: float | None,
       dup: float | None, loss_port: int | None) -> None:
    """Build a lab and leave it up (remove it with `swml-lab down PREFIX`)."""
    with lab_errors():
        lab = Lab(workers=workers, prefix=prefix, rate_mbit=rate, keep=True,
                  loss=loss, dup=dup, loss_port=loss_port).start()
    shaping = f"worker links shaped to {rate:g} Mbit/s" if rate else "links unshaped"
    if loss is not None or dup is not None or loss_port is not None:
        from switchml_xdp import wire
        port = wire.DEFAULT_PORT if loss_port is None else loss_port
        shaping += (f"; loss {_pct(loss or 0)}, dup {_pct(dup or 0)} on worker links both ways "
                    f"({f'UDP port {port}' if port else 'all UDP'})")
    example = " ".join(nsenter_argv(lab.workers[0].ns, ["ping", "-c1", lab.switch.ip]))
    click.echo(f"lab {lab.prefix} is up: {len(lab.workers)} workers, {shaping}")
    click.echo(host_table(lab))
    click.echo("\nrun a command inside a host:  nsenter --net=/run/netns/NAMESPACE CMD")
    click.echo(f"  e.g. {example}")
    click.echo(f"description: {state_path(lab.prefix)}")
    click.echo(f"remove it:   swml-lab down {lab.prefix}")


@main.command()
@click.argument("prefix", required=False)
@click.option("--all", "all_", is_flag=True, help='Remove every lab (namespaces named "swl*").')
def down(prefix: str | None, all_: bool) -> None:
    """Remove the lab PREFIX (its namespaces, processes, description)."""
    if bool(prefix) == all_:
        raise click.UsageError("give either a lab PREFIX or --all")
    with lab_errors():
        had_state = prefix is not None and state_path(prefix).exists()
        removed = cleanup_leftovers(prefix)
    if prefix is not None and not removed and not had_state:
        raise click.ClickException(f"no lab with prefix {prefix!r}")
    click.echo(f"removed {len(removed)} namespace(s)" + (f": {' '.join(removed)}" if removed else ""))


if __name__ == "__main__":
    main()


@main.command()
@lab_options
@click.option("--size", default="16MiB", show_default=True, help="tensor size (bytes; K/M/G/KiB/MiB/GiB)")
@click.option("--iterations", default=5, show_default=True, type=click.IntRange(1, None))
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(0, None))
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "int32"]))
@click.option("--backend", default="auto", show_default=True, type=click.Choice(["auto", "afxdp", "udp"]))
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="check every element of every result")
def demo(workers, prefix, rate, size, iterations, warmup, dtype, backend, verify):
    """Switch + WORKERS workers in a lab, running an allreduce benchmark."""
    from switchml_xdp.lab.demo import run_demo

    if prefix:
        raise click.BadParameter("demo makes a fresh lab each run", param_hint="--prefix")
    with lab_errors():
        try:
            run_demo(workers, size, iterations, warmup, dtype, backend, verify, rate, out=click.echo)
        except RuntimeError as e:
            raise click.ClickException(str(e)) from None
