"""switchml-xdp: in-network aggregation for data-parallel training on a Linux
box; an XDP program is the switch, workers stream gradients to it.

    from switchml_xdp import Worker
    with Worker("10.0.0.1", "j1", rank, world) as w:
        w.allreduce(grad)          # numpy float32/int32, in place
        w.allreduce(steps, op="max")   # "sum", "min", "max"
"""
__version__ = "0.1.0"


def __getattr__(name):
    # Lazy: `import switchml_xdp` must not need pyroute2/bcc (e.g. for quant or wire).
    if name == "Worker":
        from .client.api import Worker
        return Worker
    if name in ("ControlError", "JobAborted"):
        from .client import control
        return getattr(control, name)
    if name == "CallMismatch":
        from .client.calls import CallMismatch
        return CallMismatch
    raise AttributeError(name)


__all__ = ["Worker", "ControlError", "JobAborted", "CallMismatch"]
