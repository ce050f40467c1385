"""Fixtures of the unit tier: a udp backend wired to a fake switch on the loopback."""
from __future__ import annotations

import pytest

from fake_switch import GROUP, RESULT_KEY, FakeSwitch, free_port
from switchml_xdp import wire
from switchml_xdp.client.abort import AbortSignal
from switchml_xdp.client.backend import LocalEnd
from switchml_xdp.client.control import JobInfo
from switchml_xdp.client.engine_backend import engine_missing
from switchml_xdp.client.retransmit import PYTHON_POLICY
from switchml_xdp.client.udp_backend import udp_backend


@pytest.fixture(params=["engine", "python"])
def fake(request):
    """make(answer, ...) -> (FakeSwitch, udp backend on it), on each of the udp
    backend's loops: the C engine (udp_engine_backend.py) and the Python loop.
    The fake switch is a Python thread whose answers take milliseconds, so
    both loops get the Python loop's timeouts unless a test gives its own."""
    loop = request.param
    if loop == "engine" and engine_missing():
        pytest.skip(f"the udp backend's engine: {engine_missing()}")
    made = []

    def make(answer, seq_base=0, k=8, slots=4, stall_timeout=5.0, auth=wire.AUTH_HEADER,
             policy=None, switch=FakeSwitch):
        sw = switch(answer)
        info = JobInfo(name="fake", job_id=3, world=1, rank=0, k=k, slots=slots,
                       switch_ip="127.0.0.1", switch_mac="00:00:00:00:00:00", switch_port=sw.port,
                       group_ip=GROUP, group_mac="01:00:5e:4d:00:09", port=free_port(),
                       heartbeat_s=1.0, key=0x0123456789ABCDEF, seq_base=seq_base,
                       result_key=RESULT_KEY, auth=auth)
        be = udp_backend(info, LocalEnd("127.0.0.1", "lo", "00:00:00:00:00:00"), AbortSignal(),
                         policy=policy or PYTHON_POLICY, stall_timeout=stall_timeout,
                         verbose=False, engine=loop == "engine")
        made.append((sw, be))
        return sw, be

    yield make
    for sw, be in made:
        be.close()
        sw.close()


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
