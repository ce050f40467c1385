"""The project's command lines as the tests run them: this interpreter, the module."""
from __future__ import annotations

import sys

SWITCH_CLI = [sys.executable, "-m", "switchml_xdp.cli.switch"]
WORKER_CLI = [sys.executable, "-m", "switchml_xdp.cli.worker"]
LAB_CLI = [sys.executable, "-m", "switchml_xdp.cli.lab"]
