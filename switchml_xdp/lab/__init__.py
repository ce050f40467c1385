"""The lab: an emulated cluster (switch + N workers on a bridge) in network namespaces.

    from switchml_xdp.lab import Lab
    with Lab(workers=4, rate_mbit=1000) as lab:
        lab.run(lab.workers[0], ["ping", "-c1", lab.switch.ip])
        with lab.enter(lab.workers[1]):   # this thread only
            ...
"""
from switchml_xdp.lab.topology import Host, Lab, LabError, cleanup_leftovers

__all__ = ["Host", "Lab", "LabError", "cleanup_leftovers"]
