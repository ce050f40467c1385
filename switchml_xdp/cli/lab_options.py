"""What `swml-lab`'s commands share: the options that build a lab (-n,
--prefix, --rate) and set its loss injector, how lab failures reach the
command line, and comma-separated lists of values."""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import click

from switchml_xdp import wire
from switchml_xdp.lab import LabError
from switchml_xdp.lab.addressing import MAX_BOXES, MAX_WORKERS
from switchml_xdp.lab.box_ports import MAX_PORTS
from switchml_xdp.lab.burst import BurstModel, mean_length
from switchml_xdp.lab.link_mtu import DEFAULT_MTU, MIN_MTU
from switchml_xdp.lab.link_mtu import effective as effective_mtu
from switchml_xdp.lab.loss import LossError, probability
from switchml_xdp.lab.racks import LAYOUTS, MAX_RACKS, rack_sizes
from switchml_xdp.lab.shaping import MAX_RATE_MBIT, check_bands
from switchml_xdp.net import NetError

from .common import Parsed


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


def box_options(f):
    """--boxes, --ports and --box-rate: a lab of several switch hosts, or a
    switch of several ports, each link shaped."""
    f = click.option("--box-rate", type=click.FloatRange(0, MAX_RATE_MBIT, min_open=True),
                     default=None, metavar="MBIT",
                     help="Shape every box's link (every port's) to MBIT Mbit/s each way.")(f)
    f = click.option("--ports", type=click.IntRange(1, MAX_PORTS), default=1, show_default=True,
                     help="The switch as a box with that many ports, each on a bridge segment "
                          "of its own (worker i on segment i mod PORTS; docs/scale-out.md).")(f)
    f = click.option("--boxes", type=click.IntRange(1, MAX_BOXES), default=1, show_default=True,
                     help="Number of boxes (switch hosts: sw, sw1, ...) on the bridge.")(f)
    return f


def mtu_option(f):
    """--mtu: every lab link's MTU (lab/link_mtu.py)."""
    return click.option("--mtu", type=click.IntRange(MIN_MTU, wire.MAX_MTU), default=None,
                        metavar="BYTES",
                        help=f"Every lab link's MTU: veths, bridges, the box's ports [default: "
                             f"{DEFAULT_MTU}]. Up to {wire.MAX_MTU}, a frame of one page for "
                             f"native XDP, which carries k up to {wire.MAX_K}: k <= (MTU - "
                             f"{wire.IP_OVERHEAD}) / 4.")(f)


def port_hooks_option(f):
    """--port-hooks: which bridge ports run the lab's XDP pass hook (lab/wiring.py, PORT_HOOKS)."""
    from switchml_xdp.lab.wiring import PORT_HOOKS

    return click.option("--port-hooks", type=click.Choice(PORT_HOOKS), default="every",
                        show_default=True,
                        help="Which bridge ports run the lab's XDP pass hook: every port, or the "
                             "boxes' alone, where the workers' frames (Gloo's 64 KB TCP segments) "
                             "cross the bridge as their stack made them; not with loss (its "
                             "injector is a hook on every port) or --racks.")(f)


def check_port_hooks(port_hooks: str, lossy: bool, other: bool) -> None:
    """BadParameter (--port-hooks) for hooks on the boxes alone with loss, or where `other`
    (racks, jobs: labs of their own wiring)."""
    if port_hooks != "every" and (lossy or other):
        raise click.BadParameter("not with loss, --jobs or --racks (the loss injector is a hook "
                                 "on every port)", param_hint="--port-hooks")


def check_k_fits(ks, mtu: int | None) -> None:
    """BadParameter (-k) for a k the lab's MTU does not carry, saying the MTU it needs."""
    from switchml_xdp.mtu import mtu_needed

    too_big = [k for k in ks if mtu_needed(k) > effective_mtu(mtu)]
    if too_big:
        raise click.BadParameter(f"k={max(too_big)} needs --mtu {mtu_needed(max(too_big))} or more "
                                 f"(the lab's MTU is {effective_mtu(mtu)})", param_hint="--elements")


def rack_options(f):
    """--racks, --per-rack, --uplink-rate and --layout: a lab of racks
    (switchml_xdp/lab/racks.py); racks_of() checks them together."""
    f = click.option("--layout", type=click.Choice(LAYOUTS), default=None,
                     help="With --racks: tree (a rack box in every rack, a child of the parent) "
                          "or flat (every worker on the parent across the core) [default: tree].")(f)
    f = click.option("--uplink-rate", type=click.FloatRange(0, MAX_RATE_MBIT, min_open=True),
                     default=None, metavar="MBIT",
                     help="With --racks: shape every rack's uplink to the core to MBIT Mbit/s "
                          "each way (e.g. 4 workers at 100 behind 100: a 1:4 core).")(f)
    f = click.option("--per-rack", default=None, metavar="N[,N..]",
                     help="With --racks: workers in each rack, one count or one a rack "
                          "(e.g. 2,3,4).")(f)
    f = click.option("--racks", type=click.IntRange(1, MAX_RACKS), default=None,
                     help="Racks of workers, each behind an uplink to a core segment with the "
                          "parent box (docs/scale-out.md, \"A tree of boxes\").")(f)
    return f


def racks_of(racks: int | None, per_rack: str | None, uplink_rate: float | None = None,
             layout: str | None = None) -> list[int] | None:
    """Each rack's worker count, or None without --racks; a click error in one
    line for options that do not go together."""
    if racks is None:
        for value, name in ((per_rack, "--per-rack"), (uplink_rate, "--uplink-rate"),
                            (layout, "--layout")):
            if value is not None:
                raise click.BadParameter("only with --racks", param_hint=name)
        return None
    ctx = click.get_current_context()
    for name in ("workers", "boxes", "ports", "box_rate"):
        if ctx.params.get(name) is not None and \
                ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            raise click.BadParameter("not with --racks (--per-rack says where the workers are)",
                                     param_hint=f"--{name.replace('_', '-')}")
    try:
        return rack_sizes(racks, per_rack if per_rack is not None else "2")
    except LabError as e:
        raise click.BadParameter(str(e), param_hint="--per-rack") from None


def probability_type(what: str) -> Parsed:
    """A probability of `what` given as a fraction (0.05) or a percentage (5%)."""
    return Parsed("P", functools.partial(probability, what=what), float)


def burst_option(also: str = ""):
    """--burst: the loss comes in bursts (switchml_xdp/lab/burst.py); `also`
    ends its help."""
    return click.option("--burst", type=Parsed("FRAMES", mean_length, float), default=None,
                        help="The loss comes in bursts of FRAMES frames on average (a "
                             "Gilbert-Elliott model: --loss is then the mean rate, every frame "
                             "of a burst is lost, none between bursts)." + also)


def check_burst(burst: float | None, losses) -> None:
    """--burst needs loss rates to spread, each one its bursts can reach: a
    one-line click error otherwise."""
    if burst is None:
        return
    if not any(losses):
        raise click.BadParameter("needs --loss (the mean rate its bursts carry)",
                                 param_hint="--burst")
    try:
        for p in filter(None, losses):
            BurstModel.of(p, burst)
    except LossError as e:
        raise click.BadParameter(str(e), param_hint="--burst") from None


def loss_text(loss: float, burst: float | None) -> str:
    """"5%", or "5% in bursts of 4 frames"."""
    return pct(loss) + (f" in bursts of {burst:g} frames" if burst and loss else "")


def link_loss(setting: dict) -> str:
    """One link and direction's loss (lab.loss_settings()): "5%", or the mean
    rate and mean stay of a burst model, "5%b4"."""
    model = setting.get("burst")
    if model is None:
        return pct(setting["loss"])
    return f"{pct(model.mean_loss(setting['loss']))}b{model.mean_stay:.3g}"


def loss_options(f):
    """--loss, --dup, --burst and --loss-port: the lab's loss injector (switchml_xdp/lab/loss.py)."""
    f = click.option("--loss-port", type=click.IntRange(0, 65535), default=None, metavar="PORT",
                     help="UDP port (from or to) subject to loss and duplication "
                          "[default: the switch's data port, 48864; 0 = all UDP].")(f)
    f = click.option("--dup", type=probability_type("dup"), default=None,
                     help="Duplicate data-port UDP frames that pass with probability P, "
                          "on every worker link, both ways.")(f)
    f = click.option("--loss", type=probability_type("loss"), default=None,
                     help="Drop data-port UDP frames with probability P (0.05 or 5%) on every "
                          "worker link, both ways (ARP, ping, TCP are never dropped).")(f)
    return burst_option()(f)


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


def run_rows(run, cfg) -> None:
    """A bench's rows, run(cfg, out=click.echo), its failures in one line
    each; then where its JSON went (cfg.json_path)."""
    with lab_errors():
        try:
            run(cfg, out=click.echo)
        except RuntimeError as e:
            raise click.ClickException(str(e)) from None
    click.echo(f"rows: {cfg.json_path}")


def pct(p: float) -> str:
    return f"{p * 100:.4g}%"


def dscp_bands_of(ctx, param, value):
    """A click callback: "46,34,0" -> (46, 34, 0), the lab's DSCP bands
    (switchml_xdp/lab/shaping.py check_bands), or a one-line click error."""
    try:
        return check_bands(list_of(int, "dscp")(ctx, param, value))
    except LabError as e:
        raise click.BadParameter(str(e)) from None


def list_of(kind, what: str):
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
