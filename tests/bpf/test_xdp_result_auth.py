"""The switch program signs every RESULT (docs/security.md, "RESULT
authenticators"): the tag in its `key` field is SipHash-2-4 under the job's
result key over the header before it and, for a job with SWML_AUTH_FULL, the
payload as sent; multicast RESULTs and shadow replies alike, each payload
format, and a k whose payload is no whole number of 8-byte words."""
from __future__ import annotations

import numpy as np
import pytest

from siphash_ref import siphash
from switchml_xdp import wire
from xdp_tester import PROG_K, Action, SwitchTester, require_bpf

ODD_K = 5  # int32: 20 payload bytes, int16: 10: SipHash's tail block in play


@pytest.fixture(scope="module")
def odd_prog():
    require_bpf()
    with SwitchTester(k=ODD_K, slots=8) as tester:
        yield tester


def signed_over(run_frame_payload: bytes, job, payload_len: int) -> int:
    """The tag the reference SipHash gives for what the job's mode covers."""
    covered = run_frame_payload[:wire.AUTH_HDR_LEN]
    if job.auth == wire.AUTH_FULL:
        covered += run_frame_payload[wire.HDR_LEN:wire.HDR_LEN + payload_len]
    return siphash(job.result_key, covered)


def check_signed(tester: SwitchTester, run, job, fmt: int) -> None:
    payload = tester.result(run).frame.payload
    payload_len = tester.k * (2 if fmt == wire.FMT_INT16 else 4)
    assert len(payload) == wire.HDR_LEN + payload_len
    tag = int.from_bytes(payload[wire.AUTH_AT:wire.AUTH_AT + 8], "little")
    assert tag == signed_over(payload, job, payload_len)
    assert wire.result_authentic(payload, len(payload), job.result_key, job.auth, payload_len)
    if job.auth == wire.AUTH_FULL:  # one changed value and it is no longer the switch's
        changed = bytearray(payload)
        changed[-1] ^= 1
        assert not wire.result_authentic(changed, len(changed), job.result_key, job.auth,
                                         payload_len)


@pytest.mark.parametrize("fmt", [wire.FMT_INT32, wire.FMT_OFFSET32, wire.FMT_INT16])
@pytest.mark.parametrize("auth", [wire.AUTH_HEADER, wire.AUTH_FULL])
@pytest.mark.parametrize("k", [PROG_K, ODD_K])
def test_results_and_shadow_replies_carry_the_job_s_authenticator(sw, odd_prog, k, auth, fmt):
    tester = sw if k == PROG_K else odd_prog
    if tester is odd_prog:
        odd_prog.reset()
    job = tester.add_job(world=2, auth=auth)
    values = [np.arange(tester.k, dtype=np.int32) + r for r in range(2)]
    run = tester.round(job, 1, values, rnd=3, fmts=[fmt, fmt])
    assert run.action == Action.TX
    check_signed(tester, run, job, fmt)
    # A rank's retransmission to the completed round: the shadow reply, signed too.
    shadow = tester.run(tester.data(job, 0, 1, values[0], rnd=3, fmt=fmt,
                                    flags=wire.FLAG_RETRANS))
    assert shadow.action == Action.TX
    assert tester.result(shadow).header["flags"] & wire.FLAG_SHADOW
    check_signed(tester, shadow, job, fmt)


def test_each_job_signs_with_its_own_key(sw):
    a, b = sw.add_job(1, world=1), sw.add_job(2, world=1, slot_base=4)
    ra = sw.result(sw.round(a, 0, [np.ones(PROG_K, np.int32)])).frame.payload
    rb = sw.result(sw.round(b, 0, [np.ones(PROG_K, np.int32)])).frame.payload
    assert wire.result_authentic(ra, len(ra), a.result_key, a.auth, 0)
    assert not wire.result_authentic(ra, len(ra), b.result_key, b.auth, 0)
    assert wire.result_authentic(rb, len(rb), b.result_key, b.auth, 0)
