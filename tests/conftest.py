"""The test tiers, one folder each, marked by their folder so that `-m` can pick
them too (docs/testing.md):

    unit   no root, no network namespaces, no BPF compiler: seconds (make test-unit)
    bpf    the XDP programs alone through BPF_PROG_TEST_RUN, and the kernel door
    lab    the real switch and workers in network namespaces (the session's lab8)
    vm     qemu VMs and the vagrant lab

Helpers the tiers share live in tests/support/ (on sys.path: pyproject.toml's
pytest `pythonpath`)."""
from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "bpf", "lab", "vm")


def tier_of(path: Path) -> str:
    """The tier of a test file: the folder under tests/ it lives in."""
    tier = path.resolve().relative_to(TESTS).parts[0]
    if tier not in TIERS:
        raise pytest.UsageError(f"{path}: a test belongs in one of tests/{{{','.join(TIERS)}}}/")
    return tier


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(getattr(pytest.mark, tier_of(item.path)))
