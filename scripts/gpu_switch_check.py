"""The staging pipeline through a switch, on a machine without bcc (the GPU
machine): tests/lab/test_staging_lab.py's ranks (two hosts, two ranks a host,
the `swml` backend, DDP over it and with the hook, against Gloo) in a lab of
two workers, served by the switch daemon with its user-space data plane
(`--dataplane userspace`: the XDP program's per-packet step in C on a kernel
socket; switchml_xdp/switch/userspace.py). Same control plane, wire and
worker as with XDP; what it does not cover is the XDP program itself.

    python3 scripts/gpu_switch_check.py cuda      # or cpu

Root (namespaces). Prints one line per rank and exits non-zero if a check
fails. The lab's pass program is skipped: it exists so that frames the XDP
switch sends with XDP_TX reach a veth; the user-space switch sends through
the stack, and compiling it needs bcc.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "support"), str(ROOT / "tests" / "lab")]
# The ranks run as scripts, and the package may not be installed (the GPU machine).
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)


def main(device: str) -> int:
    import test_staging_lab as staging

    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.cluster import SwitchProcess

    Lab._attach_pass_program = lambda self: None   # see the module's docstring
    with Lab(workers=staging.HOSTS) as lab, \
            SwitchProcess(lab, ["--dataplane", "userspace", "--lease", "2"]) as sw:
        results = staging._lab_ranks(lab, device)
        for r in results:
            print(json.dumps({k: r[k] for k in ("rank", "device", "leader", "cases", "backend_steps",
                                                "fallbacks", "switch_calls", "staged_chunks")
                              if k in r}))
        staging._check_lab(results)
    print(f"ok: {len(results)} ranks on {device} through the user-space switch "
          f"({sw.output[0] if sw.output else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "cuda"))
