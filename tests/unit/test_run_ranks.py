"""run_ranks' `beside`: what disturbs the lab runs while the ranks do, is
waited for after them however they ended, and its failure is not lost. A lab
on paper (no namespaces: entering a host does nothing); the lab tests that
lean on it: tests/lab/test_box_lost.py, tests/lab/test_failures.py."""
from __future__ import annotations

import contextlib
import threading
import time
from types import SimpleNamespace

import pytest

from switchml_xdp.lab.cluster import run_ranks

LAB = SimpleNamespace(enter=lambda host: contextlib.nullcontext())
HOSTS = ["w0", "w1"]


def test_beside_runs_while_the_ranks_run():
    both = threading.Barrier(3, timeout=5)      # two ranks and beside, at once
    done = []

    def rank(r, host):
        both.wait()
        return r, host

    def beside():
        both.wait()
        time.sleep(0.05)
        done.append(True)

    assert run_ranks(LAB, HOSTS, rank, timeout=10, beside=beside) == [(0, "w0"), (1, "w1")]
    assert done == [True]                        # waited for, not left running


def test_a_failing_beside_fails_the_run():
    def beside():
        raise RuntimeError("the box would not stop")

    with pytest.raises(RuntimeError, match="would not stop"):
        run_ranks(LAB, HOSTS, lambda r, h: r, timeout=10, beside=beside)


def test_a_failing_rank_is_what_the_run_raises_and_beside_still_ends():
    ended = threading.Event()

    def rank(r, host):
        if r == 1:
            raise ValueError("rank 1 failed")
        return r

    def beside():
        time.sleep(0.1)
        ended.set()
        raise RuntimeError("beside failed too")

    with pytest.raises(ValueError, match="rank 1 failed"):
        run_ranks(LAB, HOSTS, rank, timeout=10, beside=beside)
    assert ended.is_set()
