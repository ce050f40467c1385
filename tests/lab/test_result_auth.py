"""docs/security.md, "RESULT authenticators", in the lab: root on a host of the
segment that is no member hears a job's RESULTs and sends forged ones as raw
frames from the switch's own MAC, IPv4 address and data port, with the right
job, tag and op and changed values, while an honest job reduces int32 tensors
checked exactly on every call. Every forgery is refused and counted
(`forged`) on every rank, on either worker backend, and no call is wrong.

With `--auth header` the forger sends RESULTs for the packets in flight (the
next seqs); with `--auth full` also the RESULT it heard with its values
changed, which only an authenticator over the payload refuses (the unit tests
show the header alone lets that one through where a member lost the real one).
"""
from __future__ import annotations

import secrets

import pytest

from control_helpers import wait_for
from honest_job import HonestJob
from requires import NO_LAB
from spoofed_results import SpoofedResults
from switchml_xdp import wire

CALLS = 300


@pytest.fixture(scope="module")
def lab3():
    """A lab of this module's own: each test runs a switch of its own (--auth),
    which the session's lab may not (its switch is up for the whole session)."""
    if NO_LAB:
        pytest.skip(NO_LAB)
    from switchml_xdp.lab import Lab

    with Lab(workers=3) as lab:
        yield lab


@pytest.mark.parametrize("auth", ["header", "full"])
def test_results_forged_with_the_switch_s_address_are_refused_and_counted(lab3, worker_backend,
                                                                          auth):
    from switchml_xdp.lab.cluster import SwitchProcess

    with SwitchProcess(lab3, ["--lease", "10", "--auth", auth]) as sw:
        job = HonestJob(lab3, f"auth-{auth}-{worker_backend}", secrets.token_hex(16),
                        lab3.workers[:2], worker_backend, n=32 * wire.DEFAULT_K)
        job.start_rank1()
        forger = None
        try:
            job.wait_running()
            info = job.workers[0].info
            assert info.auth == wire.AUTH_MODES[auth]
            forger = SpoofedResults(lab3, lab3.workers[2], info, lab3.workers[:2],
                                    ahead=info.slots, race=auth == "full").start()
            wait_for(lambda: min(job.calls) >= CALLS or job.errors, 240,
                     f"{CALLS} calls of the honest job under attack")
            forged = [w.stats()["forged"] for w in job.workers]
        except BaseException:
            job.stop.set()
            raise
        finally:
            if forger is not None:
                forger.stop()
        job.finish(min_calls=CALLS)   # every call was exact (checked by each rank)
    assert sw.proc.returncode == 0, "\n".join(sw.output[-20:])
    assert forger.heard > 10 and forger.sent > 1000, (forger.heard, forger.sent)
    assert all(f > 0 for f in forged), forged   # refused and counted on every rank
