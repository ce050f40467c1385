"""Fixtures of the BPF tier: the switch program loaded once a module (k=8,
16 slots; multicast and unicast fan-out), emptied for each test, every packet
accounted for afterwards."""
from __future__ import annotations

import pytest

from xdp_tester import PROG_K, PROG_SLOTS, SwitchTester, assert_accounted, require_bpf


@pytest.fixture(scope="module")
def switch_prog():
    require_bpf()
    with SwitchTester(k=PROG_K, slots=PROG_SLOTS) as sw:
        yield sw


@pytest.fixture(scope="module")
def unicast_prog():
    """The same, built for `swml-switch up --fanout unicast`."""
    require_bpf()
    with SwitchTester(k=PROG_K, slots=PROG_SLOTS, fanout="unicast") as sw:
        yield sw


def _emptied(tester: SwitchTester):
    """The module's switch, emptied; afterwards, every packet must be accounted for."""
    tester.reset()
    yield tester
    assert_accounted(tester.counters())


@pytest.fixture
def sw(switch_prog):
    yield from _emptied(switch_prog)


@pytest.fixture
def usw(unicast_prog):
    yield from _emptied(unicast_prog)
