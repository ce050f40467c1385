"""Partition of the switch's slots between concurrent jobs (first fit)."""
from __future__ import annotations


class SlotPoolExhausted(RuntimeError):
    pass


class SlotPool:
    """Contiguous extents of [0, total) handed to jobs and taken back.

    A job asks for `want` slots and gets the largest amount up to `want` that a
    single free extent holds, but never fewer than `least`: a window that small
    would stall the job, so it is better refused with a clear reason."""

    def __init__(self, total: int):
        self.total = total
        self._used: dict[int, int] = {}  # base -> count

    def free_extents(self) -> list[tuple[int, int]]:
        out, pos = [], 0
        for base in sorted(self._used):
            if base > pos:
                out.append((pos, base - pos))
            pos = base + self._used[base]
        if pos < self.total:
            out.append((pos, self.total - pos))
        return out

    @property
    def free(self) -> int:
        return self.total - sum(self._used.values())

    def allocate(self, want: int, least: int = 1, multiple: int = 1) -> tuple[int, int]:
        """An extent of `want` slots, or the largest free one if none is that
        large and it has at least `least`; its count a multiple of `multiple`
        (want and least are)."""
        extents = self.free_extents()
        fitting = [e for e in extents if e[1] >= want]
        if fitting:
            base, _ = min(fitting, key=lambda e: e[1])  # best fit keeps big extents whole
            count = want
        else:
            base, count = max(extents, key=lambda e: e[1], default=(0, 0))
            count -= count % multiple
            if count < least:
                raise SlotPoolExhausted(
                    f"slot pool exhausted: {self.free} of {self.total} slots free, "
                    f"largest free extent {count}, a job needs at least {least}")
        self._used[base] = count
        return base, count

    def claim(self, base: int, count: int) -> None:
        """Mark an extent used (re-adopting jobs a previous daemon created)."""
        for b, c in self._used.items():
            if base < b + c and b < base + count:
                raise ValueError(f"slots {base}+{count} overlap {b}+{c}")
        self._used[base] = count

    def release(self, base: int) -> None:
        self._used.pop(base, None)
