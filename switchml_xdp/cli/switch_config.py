"""`swml-switch up --config PATH`: the switch's options from a TOML file, so a
systemd unit (`swml-switch up --config /etc/swml/switch.toml`) and real
deployments need no long command lines.

    # /etc/swml/switch.toml
    iface = "eth1"
    elements = 256
    require-token = true
    metrics = 9100

Keys are the long option names of `swml-switch up` (without "--") and
`iface`; values are checked as the command line checks them, and a bad key
or value is refused in one line naming the file and the key. Options given
on the command line win over the file's. Without --config,
/etc/swml/switch.toml is read when it exists.
"""
from __future__ import annotations

import os
import tomllib

import click

DEFAULT_CONFIG = "/etc/swml/switch.toml"


def _long_names(command: click.Command) -> dict[str, click.Parameter]:
    """{"elements": <param>, "job-slots": ..., "iface": <argument>} for `command`."""
    names: dict[str, click.Parameter] = {}
    for p in command.params:
        if isinstance(p, click.Argument):
            names[p.name] = p
        for opt in p.opts:
            if opt.startswith("--"):
                names[opt[2:]] = p
    names.pop("config", None)
    names.pop("more_ports", None)   # the box's other ports: the command line's only
    names.pop("help", None)
    return names


def load_config(ctx: click.Context, path: str) -> dict:
    """The file's settings as click's default_map (parameter name -> value),
    each checked by its option's type; ClickException in one line if not."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise click.ClickException(f"{path}: no such config file") from None
    except PermissionError:
        raise click.ClickException(f"{path}: not readable by this user") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise click.ClickException(f"{path}: not valid TOML: {e}") from None
    params = _long_names(ctx.command)
    defaults = {}
    for key, value in data.items():
        param = params.get(key)
        if param is None:
            raise click.ClickException(f"{path}: unknown key {key!r}; keys are "
                                       f"{', '.join(sorted(params))}")
        if isinstance(value, (dict, list)):
            raise click.ClickException(f"{path}: {key}: a single value, not a "
                                       f"{'table' if isinstance(value, dict) else 'list'}")
        if getattr(param, "is_flag", False) and not isinstance(value, bool):
            raise click.ClickException(f"{path}: {key}: true or false, not {value!r}")
        try:
            defaults[param.name] = param.type_cast_value(ctx, value)
        except click.BadParameter as e:
            raise click.ClickException(f"{path}: {key}: {e.message}") from None
    return defaults


def _apply(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    path = value
    if path is None and os.path.exists(DEFAULT_CONFIG):
        path = DEFAULT_CONFIG
    if path is not None and not ctx.resilient_parsing:
        ctx.default_map = {**(ctx.default_map or {}), **load_config(ctx, path)}
    return path


def config_option(f):
    """--config PATH (eager: its values become the defaults of the other options)."""
    return click.option("--config", type=click.Path(dir_okay=False), default=None, is_eager=True,
                        expose_value=True, callback=_apply, metavar="PATH",
                        help=f"TOML file of options (keys: the long option names and iface); "
                             f"the command line overrides it [default: {DEFAULT_CONFIG} if it "
                             f"exists]")(f)
