"""Where the engine's cycles go, with no network: ns per packet of each step
the C engine takes for a block (its exponent, quantize, the frame's headers,
parse and authenticate the RESULT, dequantize), each stage alone and all of
them one packet after the other (the loop), and the loop's elements/s on one
core (docs/performance.md, "Where the engine's cycles go"). The RESULTs are
what the switch answers to `world` copies of this rank's DATA, so the output
must equal the Python reference's allreduce of those copies: it is checked.
A quantized format runs twice: with the calls stream.c makes, and with
quant.h's one-pass calls (offset and payload copy folded in).

    python -m switchml_xdp.bench.engine_micro [--k 256] [--n 1048576] [--world 4]
        [--formats offset32,int16,int32] [--auth header|full]
        [--simd best|none|avx2] [--repeat 5] [--json]
"""
from __future__ import annotations

import statistics

import click
import numpy as np

from .. import quant, quant16, wire
from .output import echo_rows

FORMATS = {"offset32": wire.FMT_OFFSET32, "int16": wire.FMT_INT16, "int32": wire.FMT_INT32}
WHAT = {"offset32": "float32 SUM", "int16": "float32 SUM, 16-bit", "int32": "int32 SUM"}
STAGES = ("exponent", "quantize", "build", "parse", "authenticate", "dequantize")
SIMD = {"none": 0, "avx2": 1, "best": 1}  # quant.h's swml_quant_simd levels


def engine():
    """switchml_xdp._engine, or a click error saying how to get it."""
    try:
        from .. import _engine
    except ImportError as e:
        raise click.ClickException(f"the C engine is not built ({e}): pip install -e .") from e
    return _engine


def tensor(fmt: str, n: int, seed: int = 1) -> np.ndarray:
    """n elements as a gradient might hold them: normal floats over a few
    magnitudes; small int32 for the int32 SUM (no wrap over the world)."""
    rng = np.random.default_rng(seed)
    if fmt == "int32":
        return rng.integers(-(1 << 20), 1 << 20, n, dtype=np.int32)
    return (rng.standard_normal(n) * np.exp2(rng.integers(-8, 8, n))).astype(np.float32)


def reference(fmt: str, x: np.ndarray, k: int, world: int) -> np.ndarray:
    """What an allreduce of world copies of x gives: the Python definition."""
    if fmt == "int32":
        return (x.astype(np.int64) * world).astype(np.int32)
    if fmt == "int16":
        return quant16.simulate_allreduce16([x] * world, k)
    return quant.simulate_allreduce([x] * world, k)


def measure(fmt: str, one_pass: bool, k: int, n: int, world: int, auth: int, passes: int,
            repeat: int) -> dict:
    """One row: the median over `repeat` runs of each stage's and the loop's
    ns per packet; the loop's elements/s. Raises if the output is wrong."""
    eng = engine()
    x = tensor(fmt, n)
    y = np.empty_like(x)
    runs = []
    for _ in range(repeat):
        runs.append(eng.engine_micro(x, y, k, world, FORMATS[fmt], auth, passes, one_pass))
    want = reference(fmt, x, k, world)
    if not np.array_equal(y.view(np.int32), want.view(np.int32)):
        raise click.ClickException(f"{fmt}: the engine's output differs from the reference")
    packets = runs[0]["packets"]
    row = {"format": fmt, "one_pass": one_pass, "k": k, "n": n, "world": world,
           "auth": wire_auth_name(auth), "simd": eng.quant_simd()}
    for stage in (*STAGES, "loop_ns"):
        row[stage.removesuffix("_ns")] = statistics.median(r[stage] for r in runs) / packets
    row["elements_per_s"] = k / row["loop"] * 1e9
    return row


def wire_auth_name(auth: int) -> str:
    return "full" if auth == wire.AUTH_FULL else "header"


def line(row: dict) -> str:
    stages = "".join(f"{row[s]:>8.1f}" for s in (*STAGES, "loop"))
    per_elem = row["loop"] / row["k"]
    what = WHAT[row["format"]] + (", one pass" if row["one_pass"] else "")
    return (f"{what:<30}{stages}{per_elem:>9.3f}"
            f"{row['elements_per_s'] / 1e9:>9.2f}")


HEADER = (f"{'ns/packet':<30}" + "".join(f"{s[:8]:>8}" for s in STAGES) + f"{'loop':>8}"
          f"{'ns/elem':>9}{'G el/s':>9}")


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--k", default=256, show_default=True, help="Elements a packet.")
@click.option("--n", default=1 << 20, show_default=True, help="Elements of the tensor.")
@click.option("--world", default=4, show_default=True, help="Ranks (sets L and the sums).")
@click.option("--formats", default="offset32,int16,int32", show_default=True,
              help="Comma-separated: offset32 (float32 SUM), int16 (its 16-bit format), int32.")
@click.option("--auth", type=click.Choice(["header", "full"]), default="header",
              show_default=True, help="What the RESULT authenticator covers.")
@click.option("--simd", type=click.Choice(list(SIMD)), default="best", show_default=True,
              help="Quantization's vector kernels: the best the CPU has, or at most this.")
@click.option("--passes", default=5, show_default=True, help="Times over the tensor a run.")
@click.option("--repeat", default=5, show_default=True, help="Runs; each figure is their median.")
@click.option("--json", "as_json", is_flag=True, help="Rows as JSON.")
def main(k, n, world, formats, auth, simd, passes, repeat, as_json):
    names = [f.strip() for f in formats.split(",") if f.strip()]
    unknown = [f for f in names if f not in FORMATS]
    if unknown or not names:
        raise click.BadParameter(f"unknown format(s) {unknown}; pick from {sorted(FORMATS)}",
                                 param_hint="--formats")
    if k < 1 or n < 1 or not 1 <= world <= 0xFFFF or passes < 1 or repeat < 1:
        raise click.BadParameter("k, n, passes and repeat must be >= 1, world in [1, 65535]")
    auth_mode = wire.AUTH_FULL if auth == "full" else wire.AUTH_HEADER
    level = engine().quant_simd(SIMD[simd])
    runs = [(f, one) for f in names for one in ((False, True) if f != "int32" else (False,))]
    try:
        rows = [measure(f, one, k, n, world, auth_mode, passes, repeat) for f, one in runs]
    except ValueError as e:  # the engine's one-line refusal (k too large, ...)
        raise click.ClickException(str(e)) from e
    echo_rows(rows, as_json, HEADER, line,
              f"k={k}, n={n}, world={world}, RESULT auth {auth}, vector level {level} (0 none, "
              f"1 AVX2); median of {repeat} runs of "
              f"{passes} passes; each stage alone over all blocks, loop: the stages one "
              "packet after the other (no network: rings, kicks and the switch are not in it)")


if __name__ == "__main__":
    main()
