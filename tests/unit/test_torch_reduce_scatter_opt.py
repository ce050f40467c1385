"""Whether a group's reduce_scatter takes the switch: off unless asked, by
the group's attribute or SWML_REDUCE_SCATTER_MIN_BYTES; a bad value is one
clear error."""
from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="PyTorch is an optional extra")

from switchml_xdp.torch.reduce_scatter import ENV_MIN_BYTES, SwitchReduceScatter


class Group(SwitchReduceScatter):
    pass


def test_off_unless_asked(monkeypatch):
    monkeypatch.delenv(ENV_MIN_BYTES, raising=False)
    assert Group().reduce_scatter_min_bytes is None


def test_the_environment_sets_the_default_and_the_attribute_overrides_it(monkeypatch):
    monkeypatch.setenv(ENV_MIN_BYTES, "1048576")
    g = Group()
    assert g.reduce_scatter_min_bytes == 1 << 20
    g.reduce_scatter_min_bytes = None
    assert g.reduce_scatter_min_bytes is None
    g.reduce_scatter_min_bytes = 0
    assert g.reduce_scatter_min_bytes == 0 and Group().reduce_scatter_min_bytes == 1 << 20


@pytest.mark.parametrize("bad", ["-1", "1MiB", "x"])
def test_a_bad_value_is_one_clear_error(monkeypatch, bad):
    monkeypatch.setenv(ENV_MIN_BYTES, bad)
    with pytest.raises(ValueError, match=f"{ENV_MIN_BYTES} must be a byte count .*{bad}"):
        _ = Group().reduce_scatter_min_bytes
