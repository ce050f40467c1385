"""The values the lab's loss injector takes (switchml_xdp/lab/loss.py,
lab/burst.py): probabilities, as the program's u32 thresholds, and the port.
No BPF here: the command line checks its options with these."""
from __future__ import annotations

from ..layout import DEFINES

ALWAYS = DEFINES["swml_loss.h"]["SWML_LOSS_ALWAYS"]   # threshold meaning probability 1


class LossError(ValueError):
    """A bad probability, port, host or direction."""


def probability(value: float | str | None, what: str = "probability") -> float:
    """A probability from a fraction (0.05, "0.05") or a percentage ("5%")."""
    if value is None:
        return 0.0
    try:
        if isinstance(value, str):
            text = value.strip()
            p = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        else:
            p = float(value)
    except ValueError:
        raise LossError(f"{what} must be a fraction 0..1 or a percentage like 5%, "
                        f"not {value!r}") from None
    if not 0.0 <= p <= 1.0:
        raise LossError(f"{what} must be in 0..1 (0%..100%), not {value!r}")
    return p


def threshold(p: float) -> int:
    """The u32 the program compares bpf_get_prandom_u32() against: P * 2^32."""
    return ALWAYS if p >= 1.0 else min(round(p * 2**32), ALWAYS)


def from_threshold(t: int) -> float:
    return 1.0 if t == ALWAYS else round(t / 2**32, 9)


def check_port(port: int) -> int:
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise LossError(f"loss port must be in 0..65535 (0 = all UDP), not {port!r}")
    return port
