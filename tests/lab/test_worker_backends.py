"""The worker's backends behind one interface: both are `Backend`s, both
honour the one abort contract the same way, and the one retransmission policy
(retransmit.py) follows its rules, checked on a fake clock."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from lab_jobs import start_idle_rank
from retransmit_timers import FIXED_POLICY
from switchml_xdp.client.abort import JobAborted
from switchml_xdp.client.retransmit import ENGINE_POLICY

# --------------------------------------------------------- the abort signal


# --------------------------------------------------- the retransmission policy


# ------------------------------------------- both backends, one abort contract


def _backend_unavailable(backend: str) -> str | None:
    if backend == "udp":
        return None
    from switchml_xdp.client.api import _afxdp_unavailable_reason

    return _afxdp_unavailable_reason()


@pytest.mark.parametrize("backend", ["udp", "afxdp"])
def test_both_backends_are_backends_and_raise_job_aborted_with_the_reason(lab8, switch, backend):
    from switchml_xdp import Worker
    from switchml_xdp.client.backend import STAT_KEYS, Backend

    reason = _backend_unavailable(backend)
    if reason:
        pytest.skip(f"{backend}: {reason}")
    job = f"abort-{backend}"
    idle = start_idle_rank(lab8, lab8.workers[1], job, 1, 2)
    try:
        with lab8.enter(lab8.workers[0]):
            w = Worker(lab8.switch.ip, job, 0, 2, backend=backend, verbose=False)
        with w:
            assert idle.stdout.readline().strip() == "joined"
            assert isinstance(w._backend, Backend) and w._backend.name == backend
            stats = w.stats()
            assert set(STAT_KEYS) <= set(stats)
            # Each backend runs its policy (the engine's in C): no round trip
            # measured yet, so the initial RTO.
            assert stats["rto_us"] == round(type(w._backend).default_policy.initial_s * 1e6)
            fut = w.allreduce_async(np.ones(1 << 16, np.float32))
            time.sleep(0.5)
            assert not fut.done()  # rank 1 sends nothing: rank 0 waits in its backend
            t0 = time.monotonic()
            threading.Timer(0.0, w._control.abort.set, ["the test pulled the plug"]).start()
            with pytest.raises(JobAborted, match=rf"^job '{job}' aborted: the test pulled the plug$"):
                fut.result(timeout=10)
            assert time.monotonic() - t0 < 2.0
            with pytest.raises(JobAborted, match="the test pulled the plug"):
                w.allreduce(np.ones(10, np.int32))
    finally:
        idle.kill()
        idle.wait()


@pytest.mark.parametrize("policy", [ENGINE_POLICY, FIXED_POLICY], ids=["adaptive", "fixed"])
def test_the_engine_follows_the_policy_it_is_given(lab8, switch, policy, monkeypatch):
    """The C engine implements both kinds of policy (worker/stream.c)."""
    from switchml_xdp import Worker
    from switchml_xdp.client.afxdp_backend import AfxdpBackend

    reason = _backend_unavailable("afxdp")
    if reason:
        pytest.skip(f"afxdp: {reason}")
    monkeypatch.setattr(AfxdpBackend, "default_policy", policy)
    with lab8.enter(lab8.workers[0]):
        w = Worker(lab8.switch.ip, f"policy-{policy.adaptive}", 0, 1, backend="afxdp",
                   verbose=False)
    with w:
        a = np.arange(1 << 16, dtype=np.int32)
        w.allreduce(a)
        assert a[-1] == (1 << 16) - 1
        stats = w.stats()
    if policy.adaptive:
        assert stats["srtt_us"] > 0 and stats["rto_us"] >= policy.min_s * 1e6
    else:
        assert stats["srtt_us"] == 0 and stats["rto_us"] == round(policy.initial_s * 1e6)
