"""docs/security.md, data plane: the switch holds its data address and port
for its life (switch/data_port.py), on both data planes. While it is up, a
local user who is not root (`nobody`, in the switch's namespace) cannot bind
the address and port, nor the port on every address, with or without
SO_REUSEADDR / SO_REUSEPORT, and so cannot send from them as the switch;
once the switch is down, the same user can.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from switchml_xdp import wire

AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]

BIND_AS_NOBODY = """
import errno, socket, sys
ip, port = sys.argv[1], int(sys.argv[2])
results = []
for addr in (ip, "0.0.0.0"):
    for opt in (None, socket.SO_REUSEADDR, socket.SO_REUSEPORT):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        if opt is not None:
            s.setsockopt(socket.SOL_SOCKET, opt, 1)
        try:
            s.bind((addr, port))
            s.sendto(b"x", (ip, 9))   # sent from the switch's address and port
            results.append("bound")
        except OSError as e:
            results.append(errno.errorcode.get(e.errno, str(e.errno)))
        s.close()
print(" ".join(results))
"""


def _bind_as_nobody(lab, ip: str, port: int) -> set[str]:
    """What binding (ip, port) and (0.0.0.0, port) as nobody gives, every way."""
    r = lab.run(lab.switch, AS_NOBODY + [sys.executable, "-c", BIND_AS_NOBODY, ip, str(port)],
                check=False, capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return set(r.stdout.split())


@pytest.mark.parametrize("dataplane", ["xdp", "userspace"])
@pytest.mark.lab_workers(1)
def test_a_local_user_cannot_bind_the_switch_s_data_port(fresh_lab, dataplane):
    from switchml_xdp.lab.cluster import SwitchProcess

    if subprocess.run(["which", "setpriv"], capture_output=True).returncode:
        pytest.skip("setpriv (util-linux) is not installed")
    lab, port = fresh_lab, wire.DEFAULT_PORT
    with SwitchProcess(lab, ["--dataplane", dataplane]) as sw:
        assert f"data {lab.switch.ip}:{port}" in sw.ready_line
        assert _bind_as_nobody(lab, lab.switch.ip, port) == {"EADDRINUSE"}
    assert sw.proc.returncode == 0, "\n".join(sw.output[-20:])
    # The refusals were the switch's: without it, the same user binds.
    assert _bind_as_nobody(lab, lab.switch.ip, port) == {"bound"}


@pytest.mark.lab_workers(1)
def test_up_says_in_one_line_when_its_data_port_is_taken(fresh_lab):
    from switchml_xdp.lab.cluster import switch_argv

    lab, port = fresh_lab, wire.DEFAULT_PORT
    squatter = lab.popen(lab.switch, [sys.executable, "-c",
                                      "import socket, sys, time\n"
                                      "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                                      f"s.bind(({lab.switch.ip!r}, {port}))\n"
                                      "print('bound', flush=True)\n"
                                      "time.sleep(60)\n"],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "bound"
        r = lab.run(lab.switch, switch_argv(lab.switch.iface), check=False, capture_output=True,
                    text=True, timeout=60)
    finally:
        squatter.kill()
        squatter.wait()
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert (f"UDP port {port} on {lab.switch.ip} is in use by another program: the switch holds "
            f"its data address and port for its life") in r.stderr
