"""Where the checkout is, for tests that read its files (tests/support/repo.py: two levels down)."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
