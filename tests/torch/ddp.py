"""ddp.py - DistributedDataParallel on the "weft" backend against Gloo,
under torchrun: two copies of one small model train side by side on the
same data, one synchronized by a Gloo group, one by a weft group.

    ddp.py --bitwise     losses and weights must match bit for bit
    ddp.py --rtol 1e-6   ... within that relative difference

Bitwise is right for 2 ranks only.  Each DDP gradient is the allreduce sum
of the ranks' gradients (already divided by the world size).  Gloo's
allreduce (gloo::allreduce in gloo/allreduce.cc, the ring ProcessGroupGloo
runs for CPU tensors) passes chunk c from rank c-1 down to rank c-2, ...,
each adding its own value to what it received, and ends at rank c; for 4
ranks chunk c is ((x[c+2] + x[c+3]) + x[c+1]) + x[c] (indices mod 4), a
grouping that changes with c.  weft with WEFT_DETERMINISTIC=1 adds
((x0 + x1) + x2) + x3 everywhere.  Float addition is commutative but not
associative, so with 3 or more ranks the two can differ in the last bit;
with 2 ranks each element is one addition, x0 + x1 == x1 + x0 exactly,
whatever the order.  Exits 1 on a mismatch.
"""
import argparse
import copy
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_weft  # noqa: F401  (registers "weft")

STEPS = 6


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 1))


def train(ddp, rank):
    opt = torch.optim.SGD(ddp.parameters(), lr=0.02, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(16, 32, generator=gen)
        y = x[:, :4].sum(1, keepdim=True).sin()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def differ(a, b, rtol):
    """The largest difference relative to b's magnitude; 0 means equal bits."""
    if torch.equal(a, b):
        return 0.0
    if rtol is None:
        return float("inf")
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser()
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--bitwise", action="store_true")
    g.add_argument("--rtol", type=float)
    o = ap.parse_args()

    dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    weft_pg = dist.new_group(backend="weft")
    base = model()
    # A small bucket cap makes several buckets, so several weft allreduces
    # are in flight during one backward pass.
    gloo_ddp = DDP(copy.deepcopy(base), bucket_cap_mb=0.01)
    weft_ddp = DDP(copy.deepcopy(base), bucket_cap_mb=0.01, process_group=weft_pg)
    gloo_loss, weft_loss = train(gloo_ddp, r), train(weft_ddp, r)

    worst, bad = differ(weft_loss, gloo_loss, o.rtol), []
    if worst > (o.rtol or 0):
        bad.append(f"losses {weft_loss.tolist()} (weft) vs {gloo_loss.tolist()} (gloo)")
    for (name, pw), pg in zip(weft_ddp.module.named_parameters(), gloo_ddp.module.parameters()):
        d = differ(pw.detach(), pg.detach(), o.rtol)
        worst = max(worst, d)
        if d > (o.rtol or 0):
            bad.append(f"parameter {name} differs by {d:.3g} relative")
        # DDP keeps replicas identical: every rank must hold rank 0's bits.
        ref = pw.detach().clone()
        dist.broadcast(ref, 0)
        if not torch.equal(ref, pw.detach()):
            bad.append(f"parameter {name} differs from rank 0's (weft)")
    if weft_loss[0].item() == weft_loss[-1].item():
        bad.append("the loss did not move: nothing was trained")
    for b in bad:
        print(f"rank {r}: {b}", flush=True)
    dist.barrier()
    if r == 0 and not bad:
        how = "bitwise" if o.bitwise else f"within {o.rtol:g} relative (largest {worst:.3g})"
        print(f"ddp: {n} ranks, {STEPS} steps: weft and gloo agree {how}; "
              f"loss {gloo_loss[0].item():.6f} -> {gloo_loss[-1].item():.6f}", flush=True)
    dist.destroy_process_group(weft_pg)
    # Not Python's exit: torch 1.13's ~ProcessGroupGloo, run by the garbage
    # collector while it holds the GIL, joins a Gloo thread that waits for
    # the GIL to free a tensor, and the process hangs (seen with 4 ranks).
    sys.stdout.flush()
    os._exit(1 if bad else 0)


if __name__ == "__main__":
    main()
