"""What a test needs of the machine, and the one-line reason it skips without it."""
from __future__ import annotations

import os

import pytest

from switchml_xdp import bpf


def _why_no_lab() -> str | None:
    if os.geteuid() != 0:
        return "needs root: network namespaces, veth and XDP"
    return bpf.compiler_missing()


NO_LAB = _why_no_lab()
needs_lab = pytest.mark.skipif(NO_LAB is not None, reason=NO_LAB or "")
