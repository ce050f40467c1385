"""Bursty loss for the lab's loss injector: a two-state Gilbert-Elliott model
per link and direction (xdp/lab/swml_loss.c; docs/testing.md).

The link is in a good or a bad state. Every data-port frame first moves it,
good -> bad with probability p and bad -> good with probability r, then is
dropped with the good state's probability (the injector's random `loss`) or
the bad state's, h. So a stay in the bad state lasts 1/r frames on average
and the link spends p / (p + r) of its frames there.

The readable form gives a mean loss rate L and a mean burst length B (frames
lost in a row) with h = 1 and nothing lost in the good state; then

    r = 1 / B,    p = L * r / (1 - L)

so that the loss rate p / (p + r) is L and a burst's mean length 1/r is B.

    BurstModel(p=0.01, r=0.25, h=0.5)     # explicit; good-state loss apart
    BurstModel.of(0.05, 4)                # 5 % lost in bursts of mean length 4
    resolve(0.05, 4)                      # (0.0, BurstModel.of(0.05, 4)): what Lab(loss=0.05, burst=4) means
"""
from __future__ import annotations

import dataclasses

from .loss_values import LossError, probability

MAX_MEAN_LEN = 1e6   # frames: longer bursts are an outage, not loss


def mean_length(value: float | str, what: str = "burst length") -> float:
    """A mean burst length in frames: a number >= 1 ("4", 4, 2.5)."""
    try:
        b = float(value)
    except (TypeError, ValueError):
        raise LossError(f"{what} must be a mean number of frames >= 1, not {value!r}") from None
    if not 1.0 <= b <= MAX_MEAN_LEN:   # also rejects nan
        raise LossError(f"{what} must be in 1..{MAX_MEAN_LEN:g} frames, not {value!r}")
    return b


@dataclasses.dataclass(frozen=True)
class BurstModel:
    """p: good -> bad, r: bad -> good (both a frame), h: loss in the bad state."""
    p: float
    r: float
    h: float = 1.0

    def __post_init__(self):
        for name in ("p", "r", "h"):
            object.__setattr__(self, name, probability(getattr(self, name), f"burst {name}"))
        if self.r == 0.0:
            raise LossError("burst r (bad -> good) must be above 0: the bad state would never end")

    @classmethod
    def of(cls, loss: float | str, mean_len: float | str) -> BurstModel:
        """Mean loss rate `loss` (fraction or "5%") in bursts of mean length
        `mean_len` frames: h = 1, r = 1/B, p = L r / (1 - L)."""
        rate = probability(loss, "burst loss")
        b = mean_length(mean_len)
        if rate > b / (b + 1.0):   # p = L r / (1 - L) would exceed 1
            raise LossError(f"{rate * 100:.4g}% loss in bursts of {b:g} frames cannot be: at most "
                            f"{b / (b + 1) * 100:.4g}% (one good frame between bursts)")
        r = 1.0 / b
        return cls(p=rate * r / (1.0 - rate), r=r)

    @property
    def bad_fraction(self) -> float:
        """The share of frames seen in the bad state, in the long run."""
        return self.p / (self.p + self.r) if self.p else 0.0

    def mean_loss(self, good_loss: float = 0.0) -> float:
        """The long-run loss rate, with `good_loss` in the good state."""
        return (1.0 - self.bad_fraction) * good_loss + self.bad_fraction * self.h

    @property
    def mean_stay(self) -> float:
        """Frames a stay in the bad state lasts on average (the mean burst with h = 1)."""
        return 1.0 / self.r

    def describe(self, good_loss: float = 0.0) -> dict:
        """What a result file records: the model and what it means."""
        return {"p": round(self.p, 9), "r": round(self.r, 9), "h": self.h,
                "good_loss": good_loss, "mean_loss": round(self.mean_loss(good_loss), 9),
                "mean_stay": round(self.mean_stay, 6)}

    def label(self, good_loss: float = 0.0) -> str:
        """One line for a heading: "bursts: 5% in bursts of 4 frames (p 0.0132, r 0.25, h 1)"."""
        return (f"{self.mean_loss(good_loss) * 100:.4g}% in bursts of {self.mean_stay:.4g} frames "
                f"(p {self.p:.4g}, r {self.r:.4g}, h {self.h:.4g})")


def model(value) -> BurstModel | float | None:
    """A `burst=` argument checked: None, a BurstModel (or the dict of its
    fields, as a lab's state file holds it), or a mean burst length."""
    if value is None or isinstance(value, BurstModel):
        return value
    if isinstance(value, dict):
        try:
            return BurstModel(**{k: value[k] for k in ("p", "r", "h") if k in value})
        except TypeError:
            raise LossError(f"a burst model needs p and r, not {value!r}") from None
    return mean_length(value)


def resolve(loss: float | str | None, burst) -> tuple[float, BurstModel | None]:
    """(good-state loss, model or None) for the injector, from a `loss=` and a
    `burst=`: no burst -> random loss; a mean burst length B -> `loss` is the
    mean rate, lost in bursts of mean length B (none in the good state); a
    BurstModel -> `loss` is the good state's, the model the bad state's."""
    rate = probability(loss, "loss")
    burst = model(burst)
    if burst is None:
        return rate, None
    if isinstance(burst, BurstModel):
        return rate, burst
    if rate == 0.0:
        return 0.0, None      # no loss to spread into bursts
    return 0.0, BurstModel.of(rate, burst)



# What a sweep of loss rates in bursts tells its readers (swml-lab bench --burst).
TCP_NOTE = "Gloo's TCP loss stays random at the same mean rate (its dropper has no burst model)"


def sweep_meta(losses, mean_len: float | None) -> dict | None:
    """A bench's record of its bursts: the mean length and each nonzero loss
    rate's model; None without bursts."""
    if mean_len is None:
        return None
    return {"mean_len": mean_len, "model": "Gilbert-Elliott, h = 1, no loss between bursts",
            "by_loss": {f"{p:g}": BurstModel.of(p, mean_len).describe() for p in losses if p},
            "tcp": TCP_NOTE}


def sweep_heading(meta: dict) -> str:
    """One Markdown line for a bench's bursts (sweep_meta's record)."""
    return (f"Loss in bursts: every nonzero loss rate is the mean rate of a Gilbert-Elliott model "
            f"whose bursts last {meta['mean_len']:g} frames on average (every frame of a burst "
            f"lost, none between; r = 1/{meta['mean_len']:g}, p = L r / (1 - L)) on swml's UDP; "
            f"{meta.get('tcp', TCP_NOTE)}.")
