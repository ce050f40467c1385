"""What every swml-* command line shares: --version from the package metadata,
and parameter types whose errors say in one line what is wrong."""
from __future__ import annotations

import importlib
import ipaddress
import re
import socket
from collections.abc import Callable

import click

PACKAGE = "switchml-xdp"
CONTEXT = {"help_option_names": ["-h", "--help"]}

_DOTTED = re.compile(r"[0-9.]+")


def version_option(f):
    """--version: the installed package's version (pyproject.toml), not a copy of it."""
    return click.version_option(package_name=PACKAGE, message="%(prog)s (switchml-xdp) %(version)s")(f)


class IPv4Address(click.ParamType):
    """An IPv4 address, or a host name that resolves to one (given as the address).

    Digits and dots are taken as an address and never looked up, so that
    10.0.0.999 is refused as a malformed address instead of failing later as
    an unknown host name."""
    name = "IPV4"

    def convert(self, value, param, ctx):
        text = str(value).strip()
        if _DOTTED.fullmatch(text):
            try:
                return str(ipaddress.IPv4Address(text))
            except ValueError:
                self.fail(f"{text!r} is not an IPv4 address (four numbers 0-255, e.g. 10.0.0.1)",
                          param, ctx)
        try:
            return socket.getaddrinfo(text, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
        except (socket.gaierror, UnicodeError, IndexError):
            self.fail(f"{text!r} is neither an IPv4 address nor a host name with one", param, ctx)


class Boxes(click.ParamType):
    """One switch box or several, comma-separated: IPv4 addresses or host
    names (as IPv4Address takes them), each once."""
    name = "IPV4[,IPV4...]"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        from ..client.boxes import parse_switches

        try:
            boxes = parse_switches(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)
        addresses = [IPv4Address().convert(b, param, ctx) for b in boxes]
        try:
            return parse_switches(addresses)   # two names of one address
        except ValueError as e:
            self.fail(str(e), param, ctx)


class Parsed(click.ParamType):
    """A value that `parse` reads from its text, whose ValueError becomes
    click's one-line error; a value that already is a `done` (a default) passes."""

    def __init__(self, name: str, parse: Callable[[str], object], done: type):
        self.name, self.parse, self.done = name, parse, done

    def convert(self, value, param, ctx):
        if isinstance(value, self.done):
            return value
        try:
            return self.parse(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


def _imported(module: str, function: str) -> Callable[[str], object]:
    """module.function, imported when first called: a command that is given
    no such option does not import what parses it."""
    return lambda text: getattr(importlib.import_module(module, __package__), function)(text)


class Sweep(Parsed):
    """Sizes from MIN to MAX: 4KiB:256MiB, 4KiB:64MiB:4 (the benchmark's parse_sweep)."""

    def __init__(self):
        super().__init__("MIN:MAX[:FACTOR]", _imported("..bench.allreduce_bench", "parse_sweep"), list)


class Size(Parsed):
    """A tensor size in bytes: 4096, 64MiB, 1M (the benchmark's parse_size)."""

    def __init__(self):
        super().__init__("SIZE", _imported("..bench.allreduce_bench", "parse_size"), int)


class Listen(Parsed):
    """[ADDRESS:]PORT of a TCP listener, as (address, port); every address if none."""

    def __init__(self):
        super().__init__("[ADDR:]PORT", _imported("..switch.metrics", "parse_listen"), tuple)


class Rate(Parsed):
    """A rate in bits/s: 40G, 100M, 2.5g (switch/capacity.py's parse_rate)."""

    def __init__(self):
        super().__init__("RATE", _imported("..switch.capacity", "parse_rate"), int)


class DscpClasses(Parsed):
    """DSCP values, highest priority first: 46,34,26,0 (switch/share_policy.py)."""

    def __init__(self):
        super().__init__("LIST", _imported("..switch.share_policy", "parse_dscp_classes"), tuple)


def allreduce_options(size: str, iterations: int, warmup: int, iterations_flags=("--iterations",)):
    """--size, --iterations, --warmup, --dtype, --backend: how a benchmark
    reduces (swml-worker bench, swml-lab demo), with each command's defaults."""
    def decorate(f):
        f = click.option("--backend", default="auto", show_default=True,
                         type=click.Choice(["auto", "afxdp", "udp"]),
                         help="datapath: afxdp (AF_XDP, root), udp (kernel sockets), "
                              "auto (afxdp where it can)")(f)
        f = click.option("--dtype", default="float32", show_default=True,
                         type=click.Choice(["float32", "int32"]),
                         help="element type (float32 is quantized to int32 on the wire)")(f)
        f = click.option("--warmup", default=warmup, show_default=True, type=click.IntRange(0, None),
                         help="untimed allreduces before them")(f)
        f = click.option(*iterations_flags, "iterations", default=iterations, show_default=True,
                         type=click.IntRange(1, None), help="timed allreduces")(f)
        return click.option("--size", default=size, show_default=True, type=Size(),
                            help="tensor size in bytes (suffixes K, M, G, KiB, MiB, GiB)")(f)
    return decorate
