"""`python -m switchml_xdp.bench.engine_micro`: a row for each format and
call path, whose loop checks its output against quant.py; a bad option is
one line, no traceback (docs/performance.md, "Where the engine's cycles go")."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from switchml_xdp.bench import engine_micro

pytest.importorskip("switchml_xdp._engine", reason="the C engine is not built")


def run(*args: str):
    return CliRunner().invoke(engine_micro.main, list(args))


def test_a_row_for_each_format_and_call_path():
    got = run("--n", "3000", "--k", "100", "--repeat", "1", "--passes", "1", "--json")
    assert got.exit_code == 0, got.output
    rows = json.loads(got.output)
    assert [(r["format"], r["one_pass"]) for r in rows] == [
        ("offset32", False), ("offset32", True), ("int16", False), ("int16", True),
        ("int32", False)]
    for r in rows:
        assert r["loop"] > 0 and r["elements_per_s"] > 0
        assert set(engine_micro.STAGES) <= set(r)


def test_the_table_and_the_float64_loops():
    got = run("--n", "1000", "--repeat", "1", "--passes", "1", "--simd", "none",
              "--formats", "offset32", "--auth", "full")
    assert got.exit_code == 0, got.output
    assert "float32 SUM, one pass" in got.output and "vector level 0" in got.output


@pytest.mark.parametrize("args, says", [
    (("--formats", "float64"), "unknown format"),
    (("--k", "100000"), "engine_micro:"),
    (("--world", "0"), "world in [1, 65535]"),
])
def test_bad_options_are_one_line(args, says):
    got = run(*args, "--n", "1000", "--repeat", "1", "--passes", "1")
    assert got.exit_code != 0 and says in got.output
    assert "Traceback" not in got.output
