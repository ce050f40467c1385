"""What each rank of tests/lab/test_torch.py checks of the DDP hook and of training:
buckets against DDP's Gloo allreduce within the bound, float16/bfloat16 and the
torch wrappers, a few SGD steps against plain Gloo DDP; run inside the ranks' processes."""
from __future__ import annotations

import numpy as np
import torch

from torch_backend_checks import LR, STEPS, WORLD, bound_sum, cast_bound, gather, gloo_slack, ratio


class Bucket:
    """What allreduce_hook and torch's compression wrappers use of a GradBucket."""

    def __init__(self, t: torch.Tensor):
        self._t = t

    def buffer(self) -> torch.Tensor:
        return self._t

    def set_buffer(self, t: torch.Tensor) -> None:
        self._t = t


def check_hook_dtypes(worker, rank: int, k: int) -> dict:
    """The hook on float16/bfloat16 buckets, at precision "16", and wrapped in
    torch's fp16/bf16 compression wrappers: each average vs the exact one."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh

    from switchml_xdp import quant, quant16
    from switchml_xdp.torch import HookState, allreduce_hook

    gen = torch.Generator().manual_seed(300 + rank)
    x = torch.randn(1500, generator=gen) * torch.exp2(torch.randint(-6, 3, (1500,), generator=gen).float())
    s32, s16 = HookState(worker), HookState(worker, precision="16")
    out = {}
    for name, state, dt, hook in [("bfloat16", s32, torch.bfloat16, allreduce_hook),
                                  ("float16", s32, torch.float16, allreduce_hook),
                                  ("p16 float32", s16, torch.float32, allreduce_hook),
                                  ("p16 bfloat16", s16, torch.bfloat16, allreduce_hook),
                                  ("fp16 wrapper", s32, torch.float32,
                                   dh.fp16_compress_wrapper(allreduce_hook)),
                                  ("bf16 wrapper", s32, torch.float32,
                                   dh.bf16_compress_wrapper(allreduce_hook))]:
        inp = x.to(dt)
        # what the switch reduced: the bucket as the hook (after any wrapper) got it, in float32
        sent = {"fp16 wrapper": inp.half(), "bf16 wrapper": inp.bfloat16()}.get(name, inp).float()
        got = hook(state, Bucket(inp.clone())).wait()
        xs = gather(sent)
        y32 = got.float().numpy() * WORLD
        if state is s16:
            exp_global, _ = quant.global_exponents(xs, k)
            bound = quant16.error_bound16(y32, exp_global, WORLD, k)
            exact = np.sum([c.astype(np.float64) for c in xs], axis=0)
        else:
            bound, exact = bound_sum(xs, y32, k)
        # the hook's one rounding of the float32 average to the bucket's dtype
        # (the wrappers hand back their float16/bfloat16 bucket)
        bound = bound / WORLD + cast_bound(got) * (1 + 2.0 ** -6)
        out[name] = {"dtype": str(got.dtype),
                     "vs_exact": ratio(np.abs(got.float().numpy().astype(np.float64) - exact / WORLD),
                                        bound)}
    out["buckets"] = s32.buckets + s16.buckets
    out["fallback_buckets"] = s32.fallback_buckets + s16.fallback_buckets
    return out


def make_model(seed: int = 0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)


def check_hook(worker, rank: int, k: int) -> dict:
    """Bucket by bucket: the swml hook's averages vs DDP's built-in Gloo hook's."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from switchml_xdp.torch import HookState, allreduce_hook

    records: dict[str, dict] = {"swml": {}, "gloo": {}}

    def recording(kind, inner, state):
        def hook(_, bucket):  # unannotated: DDP checks annotations, these would be strings
            idx, before = bucket.index(), bucket.buffer().clone()

            def keep(fut):
                records[kind][idx] = (before, fut.value().clone())
                return fut.value()
            return inner(state, bucket).then(keep)
        return hook

    state = HookState(worker)
    models = {}
    for kind in ("swml", "gloo"):
        ddp = DDP(make_model(), bucket_cap_mb=0.001)   # two buckets: 650 and 4160 elements
        hook = (recording("swml", allreduce_hook, state) if kind == "swml"
                else recording("gloo", default_hooks.allreduce_hook, None))
        ddp.register_comm_hook(None, hook)
        models[kind] = ddp
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(2):          # step 0 builds the buckets, step 1 uses the rebuilt ones
        x, y = batch(rank, step)
        for ddp in models.values():
            ddp.zero_grad()
            loss_fn(ddp(x), y).backward()
    out = {"buckets": [], "grads_match_buckets": True}
    for idx in sorted(records["swml"]):
        before, got = records["swml"][idx]
        gloo_before, gloo_got = records["gloo"][idx]
        xs = gather(before)
        bound, exact = bound_sum(xs, got.numpy() * WORLD, k)
        bound, exact = bound / WORLD, exact / WORLD            # averages; /4 is exact
        slack = gloo_slack(xs) / WORLD
        out["buckets"].append({
            "index": idx, "numel": got.numel(),
            "same_input": bool(torch.equal(before, gloo_before)),
            "vs_exact": ratio(np.abs(got.numpy() - exact), bound),
            "vs_gloo": ratio(np.abs(got.numpy().astype(np.float64) - gloo_got.numpy()), bound + slack)})
    # and DDP put those averages into .grad
    flat = torch.cat([p.grad.reshape(-1) for p in models["swml"].module.parameters()])
    bucket_vals = torch.cat([records["swml"][i][1] for i in sorted(records["swml"])])
    out["grads_match_buckets"] = bool(torch.equal(torch.sort(flat).values, torch.sort(bucket_vals).values))
    out["hook_buckets"] = state.buckets

    # float64 buckets cannot go through the switch: the hook hands them to Gloo
    # (as the built-in hook would), warning once.
    import warnings

    grads = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for kind in ("swml", "gloo"):
            ddp = DDP(make_model().double(), bucket_cap_mb=0.001)
            if kind == "swml":
                ddp.register_comm_hook(state, allreduce_hook)
            for step in range(2):
                x, y = batch(rank, step)
                ddp.zero_grad()
                loss_fn(ddp(x.double()), y).backward()
            grads[kind] = torch.cat([p.grad.reshape(-1) for p in ddp.module.parameters()])
    out["float64_fallback_buckets"] = state.fallback_buckets
    out["float64_equal_to_gloo"] = bool(torch.equal(grads["swml"], grads["gloo"]))
    out["float64_warnings"] = sum("cannot go through the switch" in str(w.message) for w in caught)
    return out


def train_steps(rank: int, mode: str, worker=None, swml=None,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """mode: gloo, hook (the swml hook), hook16 (at precision "16"), backend
    (DDP over the swml group)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from switchml_xdp.torch import register_hook

    model = make_model().to(dtype)
    ddp = DDP(model, bucket_cap_mb=0.001, process_group=swml if mode == "backend" else None)
    if mode.startswith("hook"):
        register_hook(ddp, worker, precision="16" if mode == "hook16" else "32")
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(STEPS):
        x, y = batch(rank, step)
        opt.zero_grad()
        loss_fn(ddp(x.to(dtype)), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])
