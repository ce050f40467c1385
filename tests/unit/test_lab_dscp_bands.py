"""The lab's DSCP priority bands (lab/shaping.py check_bands, dscp_key):
1 to 8 distinct DSCP values, only on a lab whose box's port is shaped;
anything else one clear error line."""
from __future__ import annotations

import pytest

from switchml_xdp.lab import Lab, LabError
from switchml_xdp.lab.shaping import check_bands, dscp_key


def test_bands_are_kept_in_order():
    assert check_bands(None) is None
    assert check_bands([46, 34, 26, 0]) == (46, 34, 26, 0)
    assert Lab(workers=2, rate_mbit=40, box_rate_mbit=20, dscp_bands=(46, 0)).dscp_bands == (46, 0)


@pytest.mark.parametrize("bands", [
    (), (46, 46), (64,), (-1,), tuple(range(9)), "46", 46, (1.5,), (True,), ("46",),
])
def test_bad_bands_are_one_line_errors(bands):
    with pytest.raises(LabError, match=r"^dscp bands: 1 to 8 distinct DSCP values 0..63, "
                                       r"highest priority first, not .*$"):
        Lab(workers=2, rate_mbit=40, box_rate_mbit=20, dscp_bands=bands)


@pytest.mark.parametrize("rates", [{}, {"rate_mbit": 40}, {"box_rate_mbit": 20}])
def test_bands_need_both_rates(rates):
    with pytest.raises(LabError, match="need a worker rate and a box rate"):
        Lab(workers=2, dscp_bands=(46, 0), **rates)


def test_dscp_key_matches_the_tos_byte_without_ecn():
    # the TOS byte is the IPv4 header's second: DSCP 46 is 0xb8 there, ECN the low 2 bits
    assert dscp_key(46) == "0x00b80000/0x00fc0000+0"
    assert dscp_key(63) == "0x00fc0000/0x00fc0000+0"
    assert dscp_key(0) == "0x00000000/0x00fc0000+0"


@pytest.mark.parametrize("args, says", [
    (["--dscp-bands", "46,46"], "dscp bands: 1 to 8 distinct DSCP values"),
    (["--dscp-bands", "ef"], "invalid literal"),
    (["--dscp-bands", "46,0"], "needs --rate and --box-rate"),
    (["--dscp-bands", "46,0", "--rate", "40"], "needs --rate and --box-rate"),
    (["--dscp-bands", "46,0", "--racks", "2"], "not with --racks"),
])
def test_swml_lab_up_refuses_bad_bands_before_building(args, says):
    from click.testing import CliRunner

    from switchml_xdp.cli import lab as lab_cli

    r = CliRunner().invoke(lab_cli.main, ["up", *args])
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output, r.output
