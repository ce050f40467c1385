"""The lab's error: what every lab module raises for the user to read."""
from __future__ import annotations


class LabError(RuntimeError):
    """A lab could not be built or found; the message is one line for the user."""
