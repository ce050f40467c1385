"""The switch program's part in shares between jobs (docs/protocol.md,
"Pace"): it stamps the job's rate and mark (job_pace, which the control
plane's share loop writes) into every RESULT, and keeps what the ranks' DATA
say they have left of their call (job_left). Crafted frames through
BPF_PROG_TEST_RUN (tests/support/xdp_tester.py)."""
from __future__ import annotations

import pytest

from switchml_xdp import wire
from switchml_xdp.switch.maps import JobPace
from xdp_tester import PROG_K, PROG_SLOTS, Action, SwitchTester, require_bpf, vec


@pytest.fixture(scope="module")
def sw():
    require_bpf()
    t = SwitchTester(PROG_K, PROG_SLOTS)
    yield t
    t.close()


@pytest.fixture(autouse=True)
def fresh(sw):
    sw.reset()


def test_a_result_carries_the_job_s_rate_and_mark(sw):
    job = sw.add_job(job_id=7, world=2)
    rate = wire.pace_encode(24_576)   # 1536 << 4: exact in a pace code
    sw.maps.write_job_pace(7, JobPace(rate, dscp=46))
    res = sw.result(sw.round(job, 0, [vec(1), vec(2)]))
    assert res.header["pace"] == rate and wire.pace_decode(res.header["pace"]) == 24_576
    assert res.frame.tos == 46 << 2 and res.frame.ip_checksum_ok
    # The authenticator covers the stamped header.
    assert wire.result_authentic(res.frame.payload, len(res.frame.payload), job.result_key,
                                 job.auth, 0)
    assert list(res.values) == list(vec(3))


def test_without_a_mark_the_result_keeps_the_data_s_tos_and_without_shares_no_pace(sw):
    job = sw.add_job(job_id=8, world=2)
    res = sw.result(sw.round(job, 0, [vec(1), vec(2)]))
    assert (res.header["pace"], res.frame.tos) == (0, 0)
    sw.maps.write_job_pace(8, JobPace(wire.pace_encode(1000)))
    res = sw.result(sw.round(job, 1, [vec(1), vec(2)]))
    assert wire.pace_decode(res.header["pace"]) == 1000 and res.frame.tos == 0


def test_a_shadow_reply_is_stamped_too(sw):
    job = sw.add_job(job_id=9, world=2)
    sw.maps.write_job_pace(9, JobPace(wire.pace_encode(5000), dscp=10))
    sw.round(job, 2, [vec(1), vec(2)])
    run = sw.run(sw.data(job, 0, 2, vec(1), flags=wire.FLAG_RETRANS))
    assert run.action == Action.TX
    res = sw.result(run)
    assert res.header["flags"] & wire.FLAG_SHADOW
    assert wire.pace_decode(res.header["pace"]) == 5000 and res.frame.tos == 10 << 2


def test_without_shares_nothing_said_is_kept(sw):
    """A box without --share (no rate in job_pace) writes nothing per packet."""
    job = sw.add_job(job_id=12, world=2)
    sw.run(sw.data(job, 0, 0, vec(1), pace=wire.pace_encode(3 << 20)))
    assert sw.maps.read_job_progress([12])[12][1] == 0


def test_the_ranks_last_word_on_what_is_left_is_kept(sw):
    job = sw.add_job(job_id=10, world=2)
    sw.maps.write_job_pace(10, JobPace(wire.pace_encode(1000)))   # the box shares
    said = wire.pace_encode(3 << 20)
    assert sw.run(sw.data(job, 0, 0, vec(1), pace=said)).action == Action.DROP
    assert sw.maps.read_job_progress([10])[10][1] == said
    # A DATA that says nothing (0) leaves the last word as it was.
    sw.run(sw.data(job, 1, 0, vec(1), pace=0))
    bytes_in, left = sw.maps.read_job_progress([10])[10]
    assert left == said and bytes_in > 0
    # One that fails a check is not listened to.
    sw.run(sw.data(job, 0, 1, vec(1), pace=wire.pace_encode(1), key=job.key ^ 1))
    assert sw.maps.read_job_progress([10])[10][1] == said


def test_a_new_job_starts_with_nothing_said_and_no_pace(sw):
    sw.add_job(job_id=11, world=2)
    sw.maps.write_job_pace(11, JobPace(wire.pace_encode(7), dscp=1))
    sw.run(sw.data(sw._jobs[11], 0, 0, vec(1), pace=wire.pace_encode(99)))
    sw.maps.clear_job(11, 2)              # the job ends; the id goes to another job
    job = sw.add_job(job_id=11, world=2)
    assert sw.maps.read_job_progress([11])[11] == (0, 0)
    res = sw.result(sw.round(job, 0, [vec(1), vec(2)]))
    assert (res.header["pace"], res.frame.tos) == (0, 0)
