"""The docs stand alone and say where things are: every path that docs/*.md and
README.md name exists, every link between them resolves, every section they
cite by name is there, and nothing in the repository points to a design file
outside it (the design contract is docs/design.md).

Plain text reading only (no import of the package): milliseconds.
"""
from __future__ import annotations

import glob
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]

# What a backticked name must end with to be taken for a file of the repository
# (besides any name with a "/" in it).
EXTENSIONS = (".py", ".c", ".h", ".md", ".sh", ".toml")

# Backticked names with a "/" that are not paths of the repository, each with why.
NOT_REPO_PATHS = [
    (r"^/(run|sys|etc|opt|proc|dev|lib|usr|tmp)/",
     "a path on the machine at run time (state files, pins, config), not in the checkout"),
    (r"^\./swml-lab-bench-",
     "the folder a benchmark run makes in the caller's directory"),
    (r"^[a-z]+://", "a URL"),
    (r"^SWML_[A-Z0-9_/]+$", "a family of environment variables (SWML_X_INITIAL/_MIN/_MAX)"),
]

# Top-level folders whose names, written in prose without backticks, are paths too.
PROSE_ROOTS = ("docs", "tests", "switchml_xdp", "xdp", "worker", "scripts", "vagrant",
               "bench", "packaging")

# Files that may keep their history as it was written (measurements of a day).
HISTORY = ("bench/results/",)

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)?)`")  # may wrap onto a second line
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
_ROOTS = "|".join(PROSE_ROOTS)
PROSE_PATH = re.compile(rf"(?<![\w/.`-])((?:{_ROOTS})/[\w./*-]*[\w*/])")
# `docs/page.md, "Section"`, `page.md "Section"`, `(docs/page.md "Section")`
SECTION_CITE = re.compile(r"([\w-]+\.md)\)?,?\s+\"([^\"\n]+)\"")


def _rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


def _text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _prose(path: str) -> str:
    """The page without its fenced code blocks (commands, output, code)."""
    return FENCE.sub("", _text(path))


def _test_files() -> dict[str, list[str]]:
    """Test files by their name: a test is named by its file and function, the
    tier folder it sits in (tests/unit, tests/lab, ...) being the suite's business."""
    found: dict[str, list[str]] = {}
    for dirpath, _dirs, files in os.walk(os.path.join(ROOT, "tests")):
        for name in files:
            if name.startswith("test_") and name.endswith(".py"):
                found.setdefault(name, []).append(os.path.join(dirpath, name))
    return found


def _defines(path: str, name: str) -> bool:
    name = name.split("[")[0]                    # a parametrized case: test_x[SIGKILL]
    return re.search(rf"^\s*(async\s+)?(def|class)\s+{re.escape(name)}\b", _text(path),
                     re.M) is not None


def _exempt(span: str) -> bool:
    return any(re.search(pattern, span) for pattern, _why in NOT_REPO_PATHS)


def _looks_like_path(span: str) -> bool:
    if " " in span or not re.fullmatch(r"[\w./*<>\[\]:-]+", span):
        return False
    return "/" in span or span.split("::")[0].endswith(EXTENSIONS)


def _check_path(span: str, tests: dict[str, list[str]], last_test: list[str]) -> str | None:
    """None if the path (and the function after `::`) exists, else why not."""
    path, _, func = span.partition("::")
    if path == "...":                            # `...::test_y`: the file named just before
        if not last_test:
            return "`...::` with no test file named before it"
        candidates = last_test
    elif "/" not in path and path.startswith("test_") and path.endswith(".py"):
        candidates = tests.get(path, [])
        if not candidates:
            return "no such test file under tests/"
    elif "*" in path:
        candidates = glob.glob(os.path.join(ROOT, path))
        if not candidates:
            return "the pattern matches no file"
        return None
    else:
        full = os.path.join(ROOT, path)
        if not os.path.exists(full):
            return "no such path (paths are written from the repository's root)"
        candidates = [full]
    if candidates and candidates[0].endswith(".py"):
        last_test[:] = candidates
    if func and not any(_defines(c, func) for c in candidates):
        return f"{func.split('[')[0]} is not defined there"
    return None


def test_every_backticked_path_exists():
    tests, bad = _test_files(), []
    for doc in DOCS:
        last_test: list[str] = []
        for m in CODE_SPAN.finditer(_prose(doc)):
            span = m.group(1).replace("\n", " ")
            if not _looks_like_path(span) or _exempt(span):
                continue
            why = _check_path(span, tests, last_test)
            if why:
                bad.append(f"{_rel(doc)}: `{span}`: {why}")
    assert not bad, "\n".join(bad)


def test_every_path_in_prose_exists():
    bad = []
    for doc in DOCS:
        text = CODE_SPAN.sub("", _prose(doc))
        text = LINK.sub("", text)
        for m in PROSE_PATH.finditer(text):
            path = m.group(1).rstrip(".")
            if not glob.glob(os.path.join(ROOT, path)):
                bad.append(f"{_rel(doc)}: {path}")
    assert not bad, "\n".join(bad)


# Modules made at build time, not in the checkout: the C engine, the layout.
BUILT_MODULES = {"_engine", "_layout"}


def _module_missing(dotted: str) -> bool:
    """`switchml_xdp.bench.switch_cost` names a module (what follows a module
    may be an attribute of it: `switchml_xdp.quant.simulate_allreduce`)."""
    here = ROOT
    for part in dotted.split("."):
        if os.path.isfile(os.path.join(here, part + ".py")) or part in BUILT_MODULES:
            return False
        if not os.path.isdir(os.path.join(here, part)):
            init = os.path.join(here, "__init__.py")     # `switchml_xdp.Worker`: in __all__
            return not (os.path.isfile(init) and f'"{part}"' in _text(init))
        here = os.path.join(here, part)
    return False


def test_every_module_named_exists():
    bad = []
    for doc in DOCS:
        for m in re.finditer(r"\bswitchml_xdp(?:\.\w+)+", _prose(doc)):
            if _module_missing(m.group(0)):
                bad.append(f"{_rel(doc)}: {m.group(0)}")
    assert not bad, "\n".join(bad)


def _anchors(path: str) -> set[str]:
    """GitHub's anchors of a page's headings."""
    out = set()
    for line in _prose(path).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def _headings(path: str) -> list[str]:
    """The page's headings, and the bold words that open a list item (the
    entries of design-decisions.md are cited by them)."""
    out = []
    for line in _prose(path).splitlines():
        if re.match(r"#{1,6}\s", line):
            out.append(re.sub(r"^#+\s+", "", line))
        elif m := re.match(r"\s*- \*\*(.+?)\*\*", line):
            out.append(m.group(1))
    return [h.replace("`", "").lower() for h in out]


def test_every_link_resolves():
    bad = []
    for doc in DOCS:
        for m in LINK.finditer(_prose(doc)):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
            if not os.path.exists(full) or not full.startswith(ROOT + os.sep):
                bad.append(f"{_rel(doc)}: ({target}): no such file in the repository")
            elif anchor and full.endswith(".md") and anchor not in _anchors(full):
                bad.append(f"{_rel(doc)}: ({target}): no heading with that anchor")
    assert not bad, "\n".join(bad)


def test_every_cited_section_exists():
    """`docs/quantization.md, "The 16-bit format"`: a heading of that page
    begins with, or holds, the quoted words."""
    pages = {os.path.basename(d): d for d in DOCS if os.path.dirname(d).endswith("docs")}
    bad = []
    for doc in DOCS:
        text = re.sub(r"\s+", " ", CODE_SPAN.sub(r"\1", _prose(doc)))
        for m in SECTION_CITE.finditer(text):
            page, section = m.group(1), m.group(2).lower()
            if page not in pages:
                continue                         # a missing page is the path tests' to report
            if not any(section in h for h in _headings(pages[page])):
                bad.append(f'{_rel(doc)}: {page}, "{m.group(2)}": no such section')
    assert not bad, "\n".join(bad)


def _repository_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the file list comes from git")
    return [p for p in out.decode().split("\0") if p and not p.startswith(HISTORY)]


def test_no_file_points_outside_the_repository_for_the_design():
    outside = "DESIGN" + ".md"                   # not written whole, so this file is no hit
    bad = []
    for path in _repository_files():
        full = os.path.join(ROOT, path)
        try:
            with open(full, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue                             # binary, or removed in the working tree
        for n, line in enumerate(text.splitlines(), 1):
            if outside in line:
                bad.append(f"{path}:{n}: {line.strip()}")
    assert not bad, "cite docs/design.md (and a section) instead:\n" + "\n".join(bad)


def test_docs_cite_sections_not_issue_numbers():
    bad = []
    for doc in DOCS:
        for n, line in enumerate(_text(doc).splitlines(), 1):
            if re.search(r"\bissue\s+\d", line, re.I):
                bad.append(f"{_rel(doc)}:{n}: {line.strip()}")
    assert not bad, "name the page and section that explains it:\n" + "\n".join(bad)
