"""docs/pytorch.md, "What a rank did": a rank that asked for datapath auto and
got udp says so. Two lab hosts, one rank each, `init_process_group("swml")`
with backend auto; on host 1 AF_XDP is withheld (the check that auto asks is
made to say no, as on a host without the engine or without root): rank 1
warns once, naming why, and prints its own datapath line; rank 0's line
names host 1's udp beside its own datapath. Run as a script per rank
(`python tests/lab/test_torch_datapath_warning.py RANK MASTER SWITCH`).
"""
from __future__ import annotations

import contextlib
import io
import json
import sys
import warnings

import pytest

from lab_jobs import rank_results

torch = pytest.importorskip(
    "torch", reason="PyTorch is an optional extra: pip install -e '.[torch]' (torch==2.13.0)")

MASTER_PORT = 29565
WITHHELD = "AF_XDP withheld on this host by the test"


def _rank_main(rank: int, master: str, switch: str) -> dict:
    import torch.distributed as dist

    import switchml_xdp.client.api as api
    import switchml_xdp.torch as swt

    if rank == 1:
        api._afxdp_unavailable_reason = lambda: WITHHELD
    torch.set_num_threads(1)
    said = io.StringIO()
    with contextlib.redirect_stderr(said), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.init_process_group("swml", init_method=f"tcp://{master}:{MASTER_PORT}", rank=rank,
                                world_size=2, pg_options=swt.SwmlOptions(switch=switch))
        x = torch.arange(100, dtype=torch.int32) * (rank + 1)
        dist.all_reduce(x)
        stats = swt.stats()
        dist.destroy_process_group()
    return {"rank": rank, "sum_ok": bool(torch.equal(x, torch.arange(100, dtype=torch.int32) * 3)),
            "datapath": stats["datapath"], "note": stats["datapath_note"],
            "lines": [ln for ln in said.getvalue().splitlines() if "swml group" in ln],
            "warnings": [str(w.message) for w in caught if "streams on udp" in str(w.message)]}


def test_a_rank_that_got_udp_for_auto_says_so(lab8, switch):
    from switchml_xdp.client.afxdp_backend import unavailable_reason
    if (why := unavailable_reason()):
        pytest.skip(f"afxdp backend unavailable here, so auto gives udp everywhere: {why}")
    hosts = lab8.workers[6:8]
    r0, r1 = rank_results(lab8, [(hosts[rank], [sys.executable, __file__, str(rank), hosts[0].ip,
                                                 lab8.switch.ip]) for rank in range(2)], 120)
    assert r0["sum_ok"] and r1["sum_ok"]
    assert (r0["datapath"], r1["datapath"]) == ("afxdp", "udp")
    assert r0["note"] is None and r1["note"] == WITHHELD
    assert len(r1["warnings"]) == 1 and WITHHELD in r1["warnings"][0], r1["warnings"]
    assert not r0["warnings"]
    assert len(r0["lines"]) == 1 and "afxdp datapath" in r0["lines"][0], r0["lines"]
    assert "host 1: udp" in r0["lines"][0], r0["lines"]
    assert len(r1["lines"]) == 1 and "udp datapath" in r1["lines"][0], r1["lines"]


if __name__ == "__main__":
    print("RESULT " + json.dumps(_rank_main(int(sys.argv[1]), sys.argv[2], sys.argv[3])), flush=True)
