#!/usr/bin/python3
"""torch_vs_gloo.py - torch.distributed's "weft" backend against Gloo, per
collective, in one job: every rank holds a Gloo and a weft group and times
the same call on each, alternating, so both see the same machine load.

    /usr/bin/python3 bench/torch_vs_gloo.py [-n 4] [-s 8,1M,64M] [--warmup 5]

Starts its own ranks (through torch_weft.torchrun) unless RANK is set.
float32 CPU tensors, sum.  SIZE is the whole buffer, as in nccl-tests: the
tensor of allreduce and broadcast, the gathered output of all_gather, the
input of reduce_scatter (each rank's slot is SIZE/n, at least 1 element).
weft joins ranks of one host by shared memory, Gloo by TCP loopback:
WEFT_TRANSPORT=tcp puts weft on TCP too, for a like-for-like row.
Method (nccl-tests'): --warmup calls, a barrier, ITERS calls back to back,
the slowest rank's mean per call.  Gloo runs the tensor form of a
collective where this torch's Gloo has it, else the list form; torch 1.13's
Gloo has no reduce_scatter at all, so its row times an all_reduce of the
input and a copy of the rank's slot (form "allreduce").  Prints a
markdown table; gloo/weft > 1 means weft is faster.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
COLLS = ("allreduce", "reduce_scatter", "all_gather", "broadcast")


def parse_size(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(s[:-1]) * mult[s[-1].lower()] if s[-1].lower() in mult else int(s)


def human(b):
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= m and b % m == 0:
            return f"{b // m} {unit}"
    return f"{b} B"


def iters_for(nbytes):
    """Enough calls to outlast the clock's noise, few enough for 64 MiB."""
    if nbytes <= 64 << 10:
        return 200
    if nbytes <= 4 << 20:
        return 20
    return 5


def call(dist, torch, group, n, coll, count, form):
    """A zero-argument call of coll on group, count elements per rank,
    in form "tensor" or "list"; buffers allocated once, here."""
    full = lambda: torch.ones(count * n)  # noqa: E731
    part = torch.ones(count)
    if coll == "allreduce":
        return lambda: dist.all_reduce(part, group=group)
    if coll == "broadcast":
        return lambda: dist.broadcast(part, 0, group=group)
    if coll == "all_gather":
        out = full()
        if form == "tensor":
            return lambda: dist.all_gather_into_tensor(out, part, group=group)
        blocks = list(out.split(count))
        return lambda: dist.all_gather(blocks, part, group=group)
    inp = full()
    if form == "tensor":
        return lambda: dist.reduce_scatter_tensor(part, inp, group=group)
    if form == "list":
        blocks = list(inp.split(count))
        return lambda: dist.reduce_scatter(part, blocks, group=group)
    rank = dist.get_rank(group)

    def emulated():  # what a Gloo user without reduce_scatter writes
        dist.all_reduce(inp, group=group)
        part.copy_(inp[rank * count:(rank + 1) * count])
    return emulated


def probe(dist, torch, group, n):
    """The form of each collective the group's backend runs (None: neither)."""
    found = {}
    for coll in COLLS:
        found[coll] = None
        for form in ("tensor", "list") + (("allreduce",) if coll == "reduce_scatter" else ()):
            try:
                call(dist, torch, group, n, coll, 1, form)()
                found[coll] = form
                break
            except RuntimeError:
                pass
    return found


def child(o):
    import torch
    import torch.distributed as dist
    import torch_weft  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    groups = {"weft": dist.new_group(backend="weft"), "gloo": dist.group.WORLD}
    forms = {name: probe(dist, torch, g, n) for name, g in groups.items()}
    rows = []
    for nbytes in o.sizes:
        count_total = max(nbytes // 4, 1)
        for coll in COLLS:
            per_rank = count_total if coll in ("allreduce", "broadcast") else max(count_total // n, 1)
            iters = o.iters or iters_for(nbytes)
            t = {}
            for name, g in groups.items():
                if forms[name][coll] is None:
                    t[name] = None
                    continue
                fn = call(dist, torch, g, n, coll, per_rank, forms[name][coll])
                for _ in range(o.warmup):
                    fn()
                dist.barrier(group=g)
                start = time.perf_counter()
                for _ in range(iters):
                    fn()
                mean = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
                dist.all_reduce(mean, op=dist.ReduceOp.MAX)  # the slowest rank's
                t[name] = mean.item()
            rows.append((coll, nbytes, iters, t["weft"], t["gloo"]))
    if rank == 0:
        print(f"torch {torch.__version__}, {n} ranks, float32 sum, warm-up {o.warmup}; "
              f"load before: {o.load}")
        print("forms (tensor: all_gather_into_tensor, reduce_scatter_tensor; list: the list "
              "calls; allreduce: all_reduce and a copy):")
        for name in groups:
            print(f"  {name}: " + ", ".join(f"{k} {v}" for k, v in forms[name].items()))
        print()
        print("| collective | size | iters | weft (us) | gloo (us) | gloo/weft |")
        print("|---|---:|---:|---:|---:|---:|")
        for coll, nbytes, iters, w, g in rows:
            us = lambda x: "n/a" if x is None else f"{x * 1e6:.1f}"  # noqa: E731
            ratio = "n/a" if w is None or g is None else f"{g / w:.2f}"
            print(f"| {coll} | {human(nbytes)} | {iters} | {us(w)} | {us(g)} | {ratio} |")
        print()
        print(f"load after: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} CPUs)",
              flush=True)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # past torch 1.13's Gloo teardown, which can hang at exit


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=4, help="ranks (default 4)")
    ap.add_argument("-s", "--sizes", default="8,1M,64M", help="buffer sizes (default 8,1M,64M)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=0, help="timed calls (default: by size)")
    ap.add_argument("--load", default="", help=argparse.SUPPRESS)
    o = ap.parse_args()
    o.sizes = [parse_size(s) for s in o.sizes.split(",")]
    if "RANK" in os.environ:
        child(o)
        return 0
    pypath = os.path.join(HERE, "..", "python")
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=pypath + (":" + os.environ["PYTHONPATH"] if "PYTHONPATH" in os.environ else ""))
    load = f"{os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} CPUs)"
    cmd = [sys.executable, "-m", "torch_weft.torchrun", "--standalone", "--nproc_per_node", str(o.n),
           os.path.abspath(__file__), "-s", ",".join(map(str, o.sizes)), "--warmup", str(o.warmup),
           "--iters", str(o.iters), "--load", load]
    os.execve(sys.executable, cmd, env)


if __name__ == "__main__":
    sys.exit(main())
