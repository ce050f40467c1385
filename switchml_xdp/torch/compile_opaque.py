"""Keep torch.compile out of the `swml` process group's own Python code.

Under torch.compile, C++ parts of torch (DDP's reducer rebuilding its
buckets, say) call the group's collectives back while Dynamo is tracing, and
Dynamo would then trace the group's Python methods too: it treats a process
group as an opaque object, fails on its attributes, and the compile fails.
The group's collectives are eager code (threads, the switch's datapath), so
they run as they are, outside any graph; the graph holds torch's own
functional collectives, which call them at run time.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def compile_opaque(cls: type) -> type:
    """Wrap each method of `cls` that overrides one of dist.ProcessGroup's
    (the ones C++ calls back) in torch.compiler.disable."""
    overridable = set(dir(dist.ProcessGroup))
    for klass in cls.__mro__:
        if klass is dist.ProcessGroup:
            break
        for name, fn in vars(klass).items():
            if name in overridable and not name.startswith("__") and callable(fn):
                if getattr(cls, name) is fn:   # the one the class resolves to, wrapped once
                    setattr(cls, name, torch.compiler.disable(fn, recursive=True))
    return cls
