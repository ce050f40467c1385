"""A lab's box rates (lab/shaping.py box_rates): one for every box, or one
each; anything else one clear error."""
from __future__ import annotations

import pytest

from switchml_xdp.lab.errors import LabError
from switchml_xdp.lab.shaping import box_rates


def test_one_rate_for_all_or_one_each():
    assert box_rates(None, 3) == [None, None, None]
    assert box_rates(100, 2) == [100, 100]
    assert box_rates([100, 100, 200], 3) == [100, 100, 200]


@pytest.mark.parametrize("rates, boxes, words", [
    ([100, 200], 3, "one each \\(3\\), not 2"), ([100, 0], 2, "box rate must be in"),
    (-5, 1, "box rate must be in"),
])
def test_bad_box_rates(rates, boxes, words):
    with pytest.raises(LabError, match=words):
        box_rates(rates, boxes)
