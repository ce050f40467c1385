"""What every swml-* command line shares: --version from the package metadata,
and parameter types whose errors say in one line what is wrong."""
from __future__ import annotations

import ipaddress
import re
import socket

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


class Sweep(click.ParamType):
    """Sizes from MIN to MAX: 4KiB:256MiB, 4KiB:64MiB:4 (the benchmark's parse_sweep)."""
    name = "MIN:MAX[:FACTOR]"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        from ..bench.allreduce_bench import parse_sweep
        try:
            return parse_sweep(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


class Size(click.ParamType):
    """A tensor size in bytes: 4096, 64MiB, 1M (the benchmark's parse_size)."""
    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        from ..bench.allreduce_bench import parse_size
        try:
            return parse_size(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


class Listen(click.ParamType):
    """[ADDRESS:]PORT of a TCP listener, as (address, port); every address if none."""
    name = "[ADDR:]PORT"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        from ..switch.metrics import parse_listen
        try:
            return parse_listen(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


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
