"""Fixtures of the lab tier: the session's lab of 8 workers with the real switch
daemon in it (k=256; a bcc compile costs about 1.5 s here, so tests share it where
they can), and a lab of its own for a test that kills or restarts things."""
from __future__ import annotations

import pytest

from requires import NO_LAB


@pytest.fixture
def fresh_lab(request):
    """A lab of its own for a test that kills or restarts things; the number of
    workers comes from `@pytest.mark.lab_workers(N)` (default 1)."""
    if NO_LAB:
        pytest.skip(NO_LAB)
    from switchml_xdp.lab import Lab

    mark = request.node.get_closest_marker("lab_workers")
    with Lab(workers=mark.args[0] if mark else 1) as lab:
        yield lab


@pytest.fixture(scope="module")
def two_box_lab():
    """A lab of two workers and two boxes, for a module."""
    if NO_LAB:
        pytest.skip(NO_LAB)
    from switchml_xdp.lab import Lab

    with Lab(workers=2, boxes=2) as lab:
        yield lab


@pytest.fixture(scope="session")
def lab8():
    """A lab with 8 workers, for the whole session."""
    if NO_LAB:
        pytest.skip(NO_LAB)
    from switchml_xdp.lab import Lab

    with Lab(workers=8) as lab:
        yield lab


@pytest.fixture(scope="session")
def switch(lab8):
    """The real switch daemon (k=256) serving in lab8's switch namespace."""
    from switchml_xdp.lab.cluster import SwitchProcess

    with SwitchProcess(lab8, ["--lease", "2"]) as sw:
        yield sw
    assert sw.proc.returncode == 0, "\n".join(sw.output[-20:])


@pytest.fixture(params=["udp", "afxdp"])
def worker_backend(request):
    """Each worker backend in turn; afxdp skipped, with the reason, where it cannot run."""
    if request.param == "afxdp":
        from switchml_xdp.client.afxdp_backend import unavailable_reason
        if (why := unavailable_reason()):
            pytest.skip(f"afxdp backend unavailable: {why}")
    return request.param
