"""What a `swml` group's members agree on while it is made (torch/group_setup.py),
over an in-process store with a thread a member: the group's port (the
configured one when free, else one the kernel picks, held until the Worker
takes it), and a failure of any member raising the same error on every member,
within the group's timeout."""
from __future__ import annotations

import socket
import threading
import time

import pytest

dist = pytest.importorskip("torch.distributed",
                           reason="PyTorch is an optional extra: pip install -e '.[torch]'")

from switchml_xdp.client import port as port_mod  # noqa: E402 - after the importorskip
from switchml_xdp.torch.group_setup import (  # noqa: E402 - after the importorskip
    PORT_ROUNDS,
    GroupSetupError,
    SetupPhases,
    agree_port,
)
from switchml_xdp.torch.hosts import HostLayout  # noqa: E402 - after the importorskip


def _members(n: int, body) -> list:
    """body(rank) on n threads at once: each one's result or exception."""
    out: list = [None] * n

    def run(r: int) -> None:
        try:
            out[r] = body(r)
        except BaseException as e:  # noqa: BLE001 - compared by the test
            out[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def _busy_port() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", 0))
    return s


def test_the_configured_port_when_free_and_held_until_the_worker_takes_it():
    probe = _busy_port()
    preferred = probe.getsockname()[1]
    probe.close()
    got = agree_port(dist.HashStore(), HostLayout(((0,),), 0), preferred, 5.0)
    try:
        assert got == preferred
        with pytest.raises(OSError):            # held: nobody else binds it meanwhile
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM).bind(("0.0.0.0", got))
        sock = port_mod.reserve_port(got, None, "127.0.0.1")   # what the Worker does: takes it
        sock.close()
    finally:
        port_mod.release_held(got)


def test_a_taken_port_gives_way_to_one_the_kernel_picks():
    taken = _busy_port()
    try:
        got = agree_port(dist.HashStore(), HostLayout(((0,),), 0), taken.getsockname()[1], 5.0)
        assert got != taken.getsockname()[1] and got > 0
        port_mod.release_held(got)
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).bind(("0.0.0.0", got))  # released
    finally:
        taken.close()


def test_a_block_the_kernel_picks_for_lanes_starts_at_a_multiple_of_them():
    """Lane q's ports are then q mod lanes, the rule the lab's steering (and
    a NIC's ntuple rules) put a lane's RESULTs on its receive queue by."""
    taken = _busy_port()
    try:
        for lanes in (2, 4, 8):
            got = agree_port(dist.HashStore(), HostLayout(((0,),), 0), taken.getsockname()[1],
                             5.0, width=2 * lanes, align=lanes)
            try:
                assert got % lanes == 0 and not any(_bindable(p) for p in range(got, got + 2 * lanes))
            finally:
                port_mod.release_held(got, 2 * lanes)
    finally:
        taken.close()


def _free_block(width: int) -> int:
    """The first of `width` consecutive ports free now."""
    from switchml_xdp.torch.group_setup import _kernel_block

    socks = _kernel_block(width)
    first = socks[0].getsockname()[1]
    for s in socks:
        s.close()
    return first


def _bindable(port: int) -> bool:
    from switchml_xdp.torch.group_setup import _try_bind

    sock = _try_bind(port)
    if sock is not None:
        sock.close()
    return sock is not None


def test_a_block_of_ports_for_boxes_and_lanes_is_held_whole_and_released_whole():
    """A Worker with boxes x lanes ports (client/api.py: box i's lane q on
    port + i * lanes + q): the group holds every one of them."""
    preferred = _free_block(4)
    got = agree_port(dist.HashStore(), HostLayout(((0,),), 0), preferred, 5.0, width=4)
    try:
        assert got == preferred
        assert not any(_bindable(p) for p in range(got, got + 4))     # all held
    finally:
        port_mod.release_held(got, 4)
    assert all(_bindable(p) for p in range(got, got + 4))


def test_a_block_with_one_port_taken_gives_way_to_a_whole_free_one():
    """A second group's block never overlaps the first's, even where only a
    lane port of the configured block is taken."""
    preferred = _free_block(2)
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("0.0.0.0", preferred + 1))      # lane 1 of the configured block
    try:
        got = agree_port(dist.HashStore(), HostLayout(((0,),), 0), preferred, 5.0, width=2)
        try:
            assert preferred + 1 not in (got, got + 1)
            assert not _bindable(got) and not _bindable(got + 1)
        finally:
            port_mod.release_held(got, 2)
        assert _bindable(preferred)         # the configured block's free port was let go
    finally:
        taken.close()


def test_a_block_never_runs_past_the_last_port():
    from switchml_xdp.torch.group_setup import MAX_PORT, _try_block

    assert _try_block(MAX_PORT, 2) is None


def test_lanes_come_from_the_options_else_swml_lanes(monkeypatch):
    from switchml_xdp.torch.options import SwmlOptions

    monkeypatch.setenv("SWML_SWITCH", "10.0.0.1")
    monkeypatch.delenv("SWML_LANES", raising=False)
    assert SwmlOptions().resolved().lanes == 1
    monkeypatch.setenv("SWML_LANES", "4")
    assert SwmlOptions().resolved().lanes == 4
    assert SwmlOptions(lanes=2).resolved().lanes == 2
    monkeypatch.setenv("SWML_LANES", "two")
    with pytest.raises(ValueError, match="SWML_LANES must be an integer"):
        SwmlOptions().resolved()


def test_no_port_free_on_every_host_fails_alike_on_every_leader():
    """Two 'hosts' on one machine can never both bind one port: every round fails."""
    store = dist.HashStore()
    layouts = [HostLayout(((0,), (1,)), r) for r in range(2)]
    out = _members(2, lambda r: agree_port(store, layouts[r], 1, 5.0))
    assert all(isinstance(e, GroupSetupError) for e in out), out
    assert str(out[0]) == str(out[1]) and "no UDP port free on every host" in str(out[0])
    assert str(out[0]).count(",") == PORT_ROUNDS - 1


def test_one_members_failure_raises_the_same_error_on_every_member():
    store = dist.HashStore()

    def member(r: int):
        phases = SetupPhases(store, r, 3, 5.0, "the swml process group 7 (3 ranks)")
        with phases.phase("ready"):
            pass
        with phases.phase("joined"):
            if r == 1:
                raise ConnectionError("join refused: no slots")
        return "started"

    out = _members(3, member)
    assert all(isinstance(e, GroupSetupError) for e in out), out
    assert {str(e) for e in out} == {"the swml process group 7 (3 ranks) could not start: "
                                     "rank 1: ConnectionError: join refused: no slots"}


def test_every_member_starts_when_none_fails():
    store = dist.HashStore()

    def member(r: int):
        with SetupPhases(store, r, 3, 5.0, "g").phase("ready"):
            pass
        return "started"

    assert _members(3, member) == ["started"] * 3


def test_a_member_that_never_comes_is_waited_for_at_most_the_timeout():
    store = dist.HashStore()
    t0 = time.monotonic()
    with pytest.raises(GroupSetupError, match="no word from"):
        with SetupPhases(store, 0, 2, 0.5, "g").phase("ready"):
            pass
    assert time.monotonic() - t0 < 5


def test_a_configured_job_name_is_the_default_groups_and_each_subgroup_gets_its_own(monkeypatch):
    from switchml_xdp.torch.options import SwmlOptions

    monkeypatch.setenv("SWML_JOB", "train")
    assert SwmlOptions().for_subgroup("3").job == "train-3"
    assert SwmlOptions(job="mine").for_subgroup("4").job == "mine-4"
    monkeypatch.delenv("SWML_JOB")
    assert SwmlOptions().for_subgroup("3").job is None     # rank 0 makes one up, per group
