"""Fixtures of the unit tier: a udp backend wired to a fake switch on the loopback."""
from __future__ import annotations

import functools

import pytest

from fake_switch import fake_udp_backend
from switchml_xdp.client.engine_backend import engine_missing


@pytest.fixture
def fake_on():
    """make(answer, engine, **keywords) -> (FakeSwitch, udp backend on it):
    fake_switch.fake_udp_backend, both closed after the test."""
    made = []

    def make(answer, engine: bool, **kwargs):
        made.append(fake_udp_backend(answer, engine, **kwargs))
        return made[-1]

    yield make
    for sw, be in made:
        be.close()
        sw.close()


@pytest.fixture(params=["engine", "python"])
def fake(request, fake_on):
    """make(answer, ...) -> (FakeSwitch, udp backend on it), on each of the udp
    backend's loops: the C engine (udp_engine_backend.py) and the Python loop.
    The fake switch is a Python thread whose answers take milliseconds, so
    both loops get the Python loop's timeouts unless a test gives its own."""
    loop = request.param
    if loop == "engine" and engine_missing():
        pytest.skip(f"the udp backend's engine: {engine_missing()}")
    return functools.partial(fake_on, engine=loop == "engine")


@pytest.fixture(autouse=True)
def nothing_may_be_built(monkeypatch):
    """The unit tier's promise, kept: any attempt to make a namespace, a lab, a
    switch or a BPF program fails the test (those belong in tests/bpf and tests/lab)."""
    import switchml_xdp.lab.cluster as cluster
    from switchml_xdp import bpf
    from switchml_xdp.lab import Lab, lifecycle, netns

    def forbidden(*a, **kw):
        raise AssertionError("a unit test built something: namespaces, labs, switches and "
                             "BPF programs belong in tests/bpf or tests/lab")

    monkeypatch.setattr(netns, "create_netns", forbidden)
    monkeypatch.setattr(Lab, "start", forbidden)
    monkeypatch.setattr(lifecycle, "write_state", forbidden)
    monkeypatch.setattr(cluster, "SwitchProcess", forbidden)
    monkeypatch.setattr(cluster, "start_background_switch", forbidden)
    monkeypatch.setattr(bpf, "compile_program", forbidden)
