"""sweep.py - every collective of the "weft" torch.distributed backend,
checked exactly, under torchrun (any world size, 1 included).

Inputs are small integers, so float sums, products and averages are exact
in every dtype and each result has one right answer, computed here from
the same formula.  Exits 1 on the first wrong element, naming the call.
"""
import sys
import warnings

import torch
import torch.distributed as dist

import torch_weft  # noqa: F401  (registers "weft")

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int8, torch.uint8, torch.int32, torch.int64]
OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT,
       "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}


def wide(rank, count, dtype, op):
    """Rank `rank`'s input as int64: -4..4 (0..8 for uint8); 1..2 for
    products so that 2^ranks stays exact in int8 for up to 6 ranks."""
    i = torch.arange(count, dtype=torch.int64)
    if op == "product":
        return (i + rank) % 2 + 1
    v = (i * 7 + rank * 3) % 9
    return v if dtype == torch.uint8 else v - 4


def value(rank, count, dtype, op):
    return wide(rank, count, dtype, op).to(dtype)


def reduce_ref(vals, n, dtype, op):
    """The exact reduction of the stacked int64 inputs `vals`, in dtype."""
    if op == "sum":
        e = vals.sum(0)
    elif op == "product":
        e = vals.prod(0)
    elif op == "min":
        e = vals.min(0).values
    elif op == "max":
        e = vals.max(0).values
    elif dtype.is_floating_point:  # weft's AVG divides once, at the end
        return (vals.to(torch.float64).sum(0) / n).to(dtype)
    else:  # and truncates integers toward zero
        e = torch.div(vals.sum(0), n, rounding_mode="trunc")
    return e.to(dtype)


def expected(n, count, dtype, op):
    return reduce_ref(torch.stack([wide(r, count, dtype, op) for r in range(n)]), n, dtype, op)


def rs_input(r, n, count, dtype, op):
    """reduce_scatter's input: slot k holds the pattern shifted by k."""
    return torch.cat([value(r + k, count, dtype, op) for k in range(n)])


def expected_rs(n, slot, count, dtype, op):
    vals = torch.stack([wide(r + slot, count, dtype, op) for r in range(n)])
    return reduce_ref(vals, n, dtype, op)


class Checker:
    def __init__(self, rank):
        self.rank, self.checks = rank, 0

    def eq(self, got, want, what):
        self.checks += 1
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            bad = (got != want).nonzero()
            first = bad[0].tolist() if len(bad) else "shape/dtype"
            print(f"rank {self.rank}: WRONG {what}: first bad index {first}; got "
                  f"{got.flatten()[:8].tolist()} want {want.flatten()[:8].tolist()}", flush=True)
            sys.exit(1)


def sweep_reductions(c, r, n, dtype, count):
    for name, op in OPS.items():
        what = f"{name} {dtype} x{count}"
        want = expected(n, count, dtype, name)
        t = value(r, count, dtype, name)
        dist.all_reduce(t, op=op)
        c.eq(t, want, "all_reduce " + what)

        t = value(r, count, dtype, name)
        work = dist.all_reduce(t, op=op, async_op=True)
        fut = work.get_future().wait()
        c.eq(fut[0], want, "all_reduce async future " + what)
        c.eq(t, want, "all_reduce async " + what)

        inp = rs_input(r, n, count, dtype, name)
        want_rs = expected_rs(n, r, count, dtype, name)
        out = torch.empty(count, dtype=dtype)
        dist.reduce_scatter_tensor(out, inp, op=op)
        c.eq(out, want_rs, "reduce_scatter_tensor " + what)
        out = torch.empty(count, dtype=dtype)
        dist.reduce_scatter(out, list(inp.chunk(n)) if count else
                            [torch.empty(0, dtype=dtype) for _ in range(n)], op=op)
        c.eq(out, want_rs, "reduce_scatter list " + what)

        for root in sorted({0, n - 1}):
            t = value(r, count, dtype, name)
            dist.reduce(t, root, op=op)
            if r == root:
                c.eq(t, want, f"reduce root {root} " + what)


def sweep_moves(c, r, n, dtype, count):
    what = f"{dtype} x{count}"
    mine = value(r, count, dtype, "sum")
    every = torch.cat([value(k, count, dtype, "sum") for k in range(n)])

    out = torch.empty(n * count, dtype=dtype)
    dist.all_gather_into_tensor(out, mine)
    c.eq(out, every, "all_gather_into_tensor " + what)
    out = torch.zeros(n * count, dtype=dtype)
    out[r * count:(r + 1) * count] = mine  # NCCL's in-place form: input is out's slot
    dist.all_gather_into_tensor(out, out[r * count:(r + 1) * count])
    c.eq(out, every, "all_gather_into_tensor in place " + what)
    outs = [torch.empty(count, dtype=dtype) for _ in range(n)]
    dist.all_gather(outs, mine)
    c.eq(torch.cat(outs), every, "all_gather list " + what)

    for root in sorted({0, n - 1}):
        t = value(r, count, dtype, "sum") if r == root else torch.zeros(count, dtype=dtype)
        dist.broadcast(t, root)
        c.eq(t, value(root, count, dtype, "sum"), f"broadcast root {root} " + what)

        g = [torch.empty(count, dtype=dtype) for _ in range(n)] if r == root else None
        dist.gather(mine, g, dst=root)
        if r == root:
            c.eq(torch.cat(g), every, f"gather root {root} " + what)

        out = torch.empty(count, dtype=dtype)
        src = [value(k + 10, count, dtype, "sum") for k in range(n)] if r == root else None
        dist.scatter(out, src, src=root)
        c.eq(out, value(r + 10, count, dtype, "sum"), f"scatter root {root} " + what)

    if n > 1:
        # Ring: every rank posts its send and its receive before waiting.
        nxt, prv = (r + 1) % n, (r - 1) % n
        got = torch.empty(count, dtype=dtype)
        reqs = [dist.isend(mine, nxt), dist.irecv(got, prv)]
        for q in reqs:
            q.wait()
        c.eq(got, value(prv, count, dtype, "sum"), "isend/irecv ring " + what)
        # Blocking pairs: even ranks send first, odd ranks receive first.
        peer = r ^ 1
        if peer < n:
            got = torch.empty(count, dtype=dtype)
            if r % 2 == 0:
                dist.send(mine, peer)
                dist.recv(got, peer)
            else:
                dist.recv(got, peer)
                dist.send(mine, peer)
            c.eq(got, value(peer, count, dtype, "sum"), "send/recv pair " + what)


def sweep_alltoall(c, r, n):
    """all_to_all_single with even and uneven splits, the list all_to_all,
    all_reduce_coalesced.  Element values say (from, to, index)."""
    def part(src, dst, rows, width, dtype):
        return (torch.arange(rows * width).reshape(rows, width) + 1000 * src + 100 * dst).to(dtype)

    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        for rows in (0, 1, 3):
            inp = torch.cat([part(r, k, rows, 2, dtype) for k in range(n)])
            out = torch.empty(n * rows, 2, dtype=dtype)
            dist.all_to_all_single(out, inp)
            c.eq(out, torch.cat([part(k, r, rows, 2, dtype) for k in range(n)]),
                 f"all_to_all_single even {dtype} x{rows}")
        # Rank r sends (r + k) % 3 rows to rank k, so it gets (k + r) % 3 from k.
        split = [(r + k) % 3 for k in range(n)]
        inp = torch.cat([part(r, k, split[k], 3, dtype) for k in range(n)])
        out = torch.empty(sum(split), 3, dtype=dtype)
        dist.all_to_all_single(out, inp, output_split_sizes=split, input_split_sizes=split)
        c.eq(out, torch.cat([part(k, r, split[k], 3, dtype) for k in range(n)]),
             f"all_to_all_single uneven {dtype}")
        outs = [torch.empty(split[k], 1, dtype=dtype) for k in range(n)]
        dist.all_to_all(outs, [part(r, k, split[k], 1, dtype) for k in range(n)])
        c.eq(torch.cat(outs), torch.cat([part(k, r, split[k], 1, dtype) for k in range(n)]),
             f"all_to_all list {dtype}")

    ts = [torch.full((3,), float(r)), torch.arange(4.0).reshape(2, 2) * (r + 1)]
    with warnings.catch_warnings():  # torch 1.13 says it will be deprecated
        warnings.simplefilter("ignore")
        dist.all_reduce_coalesced(ts)
    c.eq(ts[0], torch.full((3,), float(sum(range(n)))), "all_reduce_coalesced first")
    c.eq(ts[1], torch.arange(4.0).reshape(2, 2) * sum(range(1, n + 1)), "all_reduce_coalesced second")


def subgroups(c, r, n):
    """Two weft groups side by side: the odd ranks and the even ranks (a
    group of one when n is 1 or 2); group ranks, not global ones, count."""
    groups = [dist.new_group(list(range(par, n, 2)), backend="weft") for par in (0, 1) if par < n]
    mine = groups[r % 2]
    members = list(range(r % 2, n, 2))
    t = torch.full((7,), float(r))
    dist.all_reduce(t, group=mine)
    c.eq(t, torch.full((7,), float(sum(members))), "all_reduce on the odd/even subgroup")
    t = torch.full((3,), float(r))
    dist.broadcast(t, members[-1], group=mine)  # src is a global rank
    c.eq(t, torch.full((3,), float(members[-1])), "broadcast on the odd/even subgroup")
    out = torch.empty(len(members))
    dist.all_gather_into_tensor(out, torch.tensor([float(r)]), group=mine)
    c.eq(out, torch.tensor(members, dtype=torch.float32), "all_gather on the odd/even subgroup")


def odd_tensors(c, r, n):
    """Layouts and dtypes off the main path: views, bytes-only dtypes."""
    base = torch.arange(48, dtype=torch.float32).reshape(6, 8) + r
    view = base.t()[:, ::2]  # not contiguous: weft works on a copy
    dist.all_reduce(view)
    want = (torch.arange(48, dtype=torch.float32).reshape(6, 8).t()[:, ::2] * n
            + sum(range(n)))
    c.eq(view, want, "all_reduce on a non-contiguous view")
    c.eq(base.t()[:, 1::2], (torch.arange(48, dtype=torch.float32).reshape(6, 8) + r).t()[:, 1::2],
         "all_reduce left the view's neighbours alone")

    flags = torch.tensor([r == 0, True, r == n - 1, False])
    mx, mn = flags.clone(), flags.clone()
    dist.all_reduce(mx, op=dist.ReduceOp.MAX)
    dist.all_reduce(mn, op=dist.ReduceOp.MIN)
    c.eq(mx, torch.tensor([True, True, True, False]), "bool MAX (or)")
    c.eq(mn, torch.tensor([n == 1, True, n == 1, False]), "bool MIN (and)")

    for dtype in (torch.int16, torch.complex64, torch.bool):
        t = (torch.arange(5) * (r + 1)).to(dtype)
        dist.broadcast(t, n - 1)
        c.eq(t, (torch.arange(5) * n).to(dtype), f"broadcast {dtype} as bytes")
        out = torch.empty(5 * n, dtype=dtype)
        dist.all_gather_into_tensor(out, (torch.arange(5) * (r + 1)).to(dtype))
        c.eq(out, torch.cat([(torch.arange(5) * (k + 1)).to(dtype) for k in range(n)]),
             f"all_gather_into_tensor {dtype} as bytes")

    dist.barrier()
    works = [dist.all_reduce(torch.full((1000,), float(r)), async_op=True) for _ in range(8)]
    for w in works:
        w.wait()
        c.eq(w.result()[0], torch.full((1000,), float(sum(range(n)))), "8 async all_reduces in flight")
        if not w.is_completed():
            print(f"rank {r}: a waited Work is not completed", flush=True)
            sys.exit(1)


def main():
    dist.init_process_group("weft")
    r, n = dist.get_rank(), dist.get_world_size()
    if dist.get_backend() != "weft":
        sys.exit(f"backend is {dist.get_backend()}, not weft")
    c = Checker(r)
    counts = [0, 1, max(n - 1, 1), n + 1, 1031]
    for dtype in DTYPES:
        for count in counts:
            sweep_reductions(c, r, n, dtype, count)
            sweep_moves(c, r, n, dtype, count)
    big = 100_003  # a large odd count, past weft's small-message paths
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        sweep_reductions(c, r, n, dtype, big)
        sweep_moves(c, r, n, dtype, big)
    sweep_alltoall(c, r, n)
    subgroups(c, r, n)
    odd_tensors(c, r, n)
    dist.barrier()
    dist.destroy_process_group()
    if r == 0:
        print(f"sweep: {n} ranks, {c.checks} checks on rank 0, all exact", flush=True)


if __name__ == "__main__":
    main()
