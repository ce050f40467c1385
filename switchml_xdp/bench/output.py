"""How the benchmark commands print their rows: as JSON (--json), or as a
table with a legend that says what the columns measured; and how a bench's
bar chart gets matplotlib and is saved."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

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


def pyplot():
    """matplotlib's pyplot without a display, or None where it is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


NO_PLOT = "no plot: matplotlib is not installed"


def save_chart(plt, fig, ax, path) -> str:
    """The chart with its legend written to `path`; what was written, in a line."""
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot: {path}"


def save_doc(doc: dict, json_path: str | None, png_path: str | None, plot, out) -> dict:
    """A bench's document to json_path and its chart, plot(doc, path), to
    png_path, each where given; the document."""
    if json_path:
        Path(json_path).write_text(json.dumps(doc, indent=1) + "\n")
    if png_path:
        out(plot(doc, Path(png_path)))
    return doc
