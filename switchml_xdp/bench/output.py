"""How the benchmark commands print their rows: as JSON (--json), or as a
table with a legend that says what the columns measured."""
from __future__ import annotations

import json
from collections.abc import Callable

import click


def echo_rows(rows: list[dict], as_json: bool, header: str, line: Callable[[dict], str],
              legend: str) -> None:
    """The rows as indented JSON; else `header`, line(row) for each row, `legend`."""
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    click.echo(header)
    for row in rows:
        click.echo(line(row))
    click.echo(legend)
