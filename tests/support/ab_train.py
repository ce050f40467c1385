"""A user's training script as `python -m switchml_xdp.torch.ab` runs it: DDP of
a small MLP on made-up data, nothing of switchml_xdp in it but the backend's
name (and SWML_SWITCH in the environment)."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import switchml_xdp.torch  # noqa: F401 - registers the swml backend

dist.init_process_group("swml")
torch.manual_seed(1234)
x, y = torch.randn(512, 32), torch.randint(0, 4, (512,))
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _epoch in range(1000):
    for i in range(0, 512, 64):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[i:i + 64]), y[i:i + 64])
        loss.backward()
        opt.step()
dist.destroy_process_group()
