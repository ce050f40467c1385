"""The `swml` torch.distributed backend and the DDP hook without a switch:
registered under its name, one-line errors for what is missing or refused.
Through the switch: tests/lab/test_torch.py."""
from __future__ import annotations

import pytest


def test_backend_registered_as_swml():
    import torch.distributed as dist

    import switchml_xdp.torch  # noqa: F401 - imported only to learn whether it is there

    assert "swml" in dist.Backend.backend_list
    assert dist.Backend.SWML == "swml"


def test_backend_without_switch_address_says_how_to_give_it(monkeypatch):
    from switchml_xdp.torch import SwmlOptions

    monkeypatch.delenv("SWML_SWITCH", raising=False)
    with pytest.raises(ValueError, match="SWML_SWITCH"):
        SwmlOptions().resolved()
    monkeypatch.setenv("SWML_SWITCH", "10.9.9.9")
    assert SwmlOptions().resolved().switch == "10.9.9.9"


def test_hook_refuses_a_state_that_is_not_a_worker():
    from switchml_xdp.torch import allreduce_hook

    with pytest.raises(TypeError, match="HookState or a Worker"):
        allreduce_hook(object(), None)


def test_hook_refuses_precision16_where_the_datapath_lacks_it():
    from switchml_xdp.torch import HookState

    class _Afxdp:
        precisions, backend_name = ("32",), "afxdp"

    with pytest.raises(ValueError, match="not streamed by this Worker's afxdp datapath"):
        HookState(_Afxdp(), precision="16")
    with pytest.raises(ValueError, match="precision must be one of"):
        HookState(_Afxdp(), precision="8")
