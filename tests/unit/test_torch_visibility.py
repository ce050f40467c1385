"""What a `swml` group says and counts, without a switch: the stats API's
refusal of other groups, SWML_DEBUG's per-call lines, the once-per-group
line on where collectives go, and its methods kept out of torch.compile.
Through the switch: tests/lab/test_torch_compile_fsdp.py."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is an optional extra: pip install -e '.[torch]'")


def test_stats_refuses_a_group_that_is_not_swml():
    import torch.distributed as dist

    import switchml_xdp.torch as swt

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="not a swml group .its backend is gloo"):
            swt.stats()
    finally:
        dist.destroy_process_group()
    with pytest.raises(ValueError, match="no default process group"):
        swt.stats()


def test_call_log_counts_and_says_each_call_under_swml_debug(monkeypatch, capsys):
    from switchml_xdp.torch.group_stats import CallLog

    monkeypatch.setenv("SWML_DEBUG", "1")
    log = CallLog(3)
    log.through_switch("sum", torch.zeros(10))
    assert log.through_gloo("allgather") is True
    assert log.through_gloo("allgather") is False
    assert log.switch_bytes == 40 and log.gloo_calls == {"allgather": 2}
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "switchml_xdp[rank 3]: sum torch.float32 x10 (40 B) -> switch"
    assert err[1] == "switchml_xdp[rank 3]: allgather -> gloo (Gloo's by design)"
    monkeypatch.setenv("SWML_DEBUG", "0")
    CallLog(0).through_switch("sum", torch.zeros(1))
    assert capsys.readouterr().err == ""


def test_fallbacks_count_each_reason():
    from switchml_xdp.torch.fallbacks import Fallbacks

    f = Fallbacks()
    with pytest.warns(RuntimeWarning):
        f.note("int64", "int64 falls back")
    f.note("int64", "int64 falls back")
    assert f.count == 2 and f.by_kind == {"int64": 2}


def test_the_line_on_where_collectives_go_names_them_as_torch_does():
    from switchml_xdp.torch.routing import where_calls_go

    line = where_calls_go("_allgather_base")
    assert "all_gather_into_tensor goes through Gloo" in line
    assert "reduce_scatter" in line and "all_reduce, broadcast and barrier go through the switch" in line


def test_the_groups_collectives_are_kept_out_of_dynamo():
    from switchml_xdp.torch import ProcessGroupSwml

    for name in ("allreduce", "broadcast", "barrier", "allgather", "_reduce_scatter_base", "send"):
        fn = getattr(ProcessGroupSwml, name)
        assert getattr(fn, "_torchdynamo_disable", False), name
