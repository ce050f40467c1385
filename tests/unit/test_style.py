"""The house style, checked by the tools that define it: ruff for Python
(pyproject.toml's [tool.ruff]) and clang-format for C (.clang-format), over the
files git knows of (tracked, or new and not ignored)."""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parents[2]


def _files(*patterns: str) -> list[str]:
    """The checkout's files matching `patterns`, relative to its top: tracked
    ones still present, and untracked ones that .gitignore does not exclude."""
    if shutil.which("git") is None or not (TOP / ".git").exists():
        pytest.skip("not a git checkout: the files to check come from git ls-files")
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                          "--", *patterns], cwd=TOP, capture_output=True, check=True).stdout
    names = sorted({n for n in out.decode().split("\0") if n})
    return [n for n in names if (TOP / n).is_file()]


def _ruff() -> list[str]:
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.skip("ruff is not installed: make setup-test installs it (the [test] extra)")


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=TOP, capture_output=True, text=True, timeout=120)


def test_ruff_is_clean():
    ruff = _ruff()
    files = _files("*.py")
    r = _run([*ruff, "check", "--no-cache", "--output-format", "concise", *files])
    if r.returncode != 0:
        pytest.fail("ruff check found problems (`ruff check --fix` mends those marked [*]):\n"
                    f"{r.stdout}{r.stderr}", pytrace=False)


def test_clang_format_is_clean():
    clang_format = shutil.which("clang-format")
    if clang_format is None:
        pytest.skip("clang-format is not installed: make setup installs it (Debian's clang-format)")
    files = _files("*.c", "*.h")
    r = _run([clang_format, "--dry-run", "--Werror", *files])
    if r.returncode != 0:
        lines = Counter(m[1] for m in re.finditer(r"^(.+?):\d+:\d+: error", r.stderr, re.M))
        where = "\n".join(f"  {f}: {n} lines" for f, n in sorted(lines.items()))
        pytest.fail("C files not in .clang-format's style (`clang-format -i FILE` formats one):\n"
                    f"{where}\n{r.stderr[:4000]}", pytrace=False)
