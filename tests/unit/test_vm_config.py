"""The qemu VM lab's configuration without booting: the accelerator asked for,
the checkout shared into the guest, the guest scripts pass shellcheck. The VMs
themselves: tests/vm/test_vm.py."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from switchml_xdp.lab import vm_boot


def test_an_accelerator_asked_for_is_taken_without_a_probe():
    assert vm_boot.choose_accel(None, None, "tcg") == ("tcg", "asked for")


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_a_checkout_under_the_guest_s_tmpfs_is_shared_again():
    """CI clones into /tmp, which the guest covers with a tmpfs: the checkout
    and its venv must be shared on top of it, once, outermost first."""
    from switchml_xdp.lab.vm import hidden_host_paths

    P = Path
    assert hidden_host_paths([P("/work/main"), P("/usr")]) == []
    assert hidden_host_paths([P("/tmp/ci/main"), P("/tmp/ci/main/.venv")]) == [P("/tmp/ci/main")]
    assert hidden_host_paths([P("/tmp/ci/main/.venv"), P("/tmp/ci/main")]) == [P("/tmp/ci/main")]
    assert hidden_host_paths([P("/tmp/a"), P("/run/b"), P("/var/tmp/c")]) == \
        [P("/tmp/a"), P("/run/b"), P("/var/tmp/c")]


def test_the_guest_scripts_pass_shellcheck():
    scripts = [vm_boot.INIT_SCRIPT, vm_boot.INIT_SCRIPT.with_name("vm_guest.sh")]
    result = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
