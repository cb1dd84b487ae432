#!/usr/bin/python3
"""gloo_perf.py - PyTorch's Gloo backend timed like weft's perf tools.

The third twin of perf/*_perf and bench/mpi_coll_perf.c: same flags (a
subset), same timing method (warm-up calls, a synchronizing all_reduce, -n
calls back to back, the slowest rank's mean), same columns.  float32 CPU
tensors, sum only.  Starts its own ranks (-N), wired through a file:// store:

    /usr/bin/python3 bench/gloo_perf.py -N 2 -C allreduce -b 8 -e 64M -f 2

-s SIZE[:ITERS[:WARMUP]],... replaces -b/-e/-f with a list of sizes, each
with its own counts, so one start (importing torch costs ~2 s a rank) can
cover a whole sweep.  Exit status: 0 all right, 1 wrong results, 2 bad
arguments or a rank failed, 3 this torch's Gloo lacks the collective.
"""
import argparse
import datetime
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

PERIOD = 251  # the copy pattern repeats with this period in the element index
COLLS = {  # name: (bus factor, splits the buffer over ranks)
    "allreduce": (lambda n: 2.0 * (n - 1) / n, False),
    "allgather": (lambda n: (n - 1) / n, True),
    "reduce_scatter": (lambda n: (n - 1) / n, True),
    "broadcast": (lambda n: 1.0, False),
}
ALIASES = {"reducescatter": "reduce_scatter", "all_reduce": "allreduce",
           "all_gather": "allgather", "bcast": "broadcast"}
EXIT_UNSUPPORTED = 3


def parse_size(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    if s and s[-1].lower() in mult:
        return int(s[:-1]) * mult[s[-1].lower()]
    return int(s)


def size_list(o):
    """[(bytes, iters, warmup)] in the order the rows are printed."""
    if o.sizes:
        rows = []
        for item in o.sizes.split(","):
            f = item.split(":")
            rows.append((parse_size(f[0]), int(f[1]) if len(f) > 1 else o.iters,
                         int(f[2]) if len(f) > 2 else o.warmup))
        return rows
    rows, b = [], o.minbytes
    while b <= o.maxbytes:
        rows.append((b, o.iters, o.warmup))
        if o.stepfactor > 1:
            b = b * o.stepfactor if b else 1
        elif o.stepbytes:
            b += o.stepbytes
        else:
            break
    return rows


def parse_args(argv):
    p = argparse.ArgumentParser(description="PyTorch Gloo collectives, timed like weft's perf tools")
    p.add_argument("-N", "--np", type=int, default=1, help="ranks to start (default 1)")
    p.add_argument("-C", dest="coll", required=True,
                   help="allreduce | allgather | reduce_scatter | broadcast")
    p.add_argument("-b", dest="minbytes", type=parse_size, default=32 << 20)
    p.add_argument("-e", dest="maxbytes", type=parse_size, default=32 << 20)
    p.add_argument("-i", dest="stepbytes", type=parse_size, default=1 << 20)
    p.add_argument("-f", dest="stepfactor", type=int, default=1)
    p.add_argument("-n", dest="iters", type=int, default=20)
    p.add_argument("-w", dest="warmup", type=int, default=5)
    p.add_argument("-c", dest="check", type=int, default=1)
    p.add_argument("-s", dest="sizes", default=None,
                   help="SIZE[:ITERS[:WARMUP]],... instead of -b/-e/-f")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds any one collective may take (default 300)")
    p.add_argument("--child", nargs=2, metavar=("RANK", "STORE"), help=argparse.SUPPRESS)
    o = p.parse_args(argv)
    o.coll = ALIASES.get(o.coll, o.coll)
    if o.coll not in COLLS:
        p.error("-C wants one of " + ", ".join(COLLS))
    if o.np < 1 or o.iters < 1 or o.warmup < 0:
        p.error("-N and -n want >= 1, -w >= 0")
    try:
        o.rows = size_list(o)
    except ValueError:
        p.error("-s wants SIZE[:ITERS[:WARMUP]],... with sizes like 8, 64K, 32M")
    if not o.rows or any(b < 0 or i < 1 or w < 0 for b, i, w in o.rows):
        p.error("no sizes to run (or -s with a bad count)")
    return o


# ---------------------------------------------------------------- the parent

def launch(o, argv):
    """Starts o.np copies of this script as ranks; rank 0's stdout is ours."""
    store_dir = tempfile.mkdtemp(prefix="gloo_perf.")
    store = os.path.join(store_dir, "store")
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one host: loopback, not the VM's NIC
    env.setdefault("OMP_NUM_THREADS", "1")      # Gloo runs its own threads; no torch ops to speed up
    procs = []

    def stop(*_):
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        for r in range(o.np):
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--child", str(r), store] + argv,
                env=env, stdout=None if r == 0 else subprocess.DEVNULL))
        # Wait for all; when one rank fails the others would block until the
        # store times out, so stop them at once.
        status = 0
        live = list(procs)
        while live:
            for pr in list(live):
                rc = pr.poll()
                if rc is None:
                    continue
                live.remove(pr)
                if rc < 0 and status == 0:
                    print("gloo_perf: rank %d died of %s" % (procs.index(pr), signal.Signals(-rc).name),
                          file=sys.stderr, flush=True)
                if rc != 0 and status == 0:
                    status = rc if rc > 0 else 2
                    for other in live:
                        other.kill()
            time.sleep(0.05)
        return status
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
        for name in os.listdir(store_dir):
            os.unlink(os.path.join(store_dir, name))
        os.rmdir(store_dir)


# ---------------------------------------------------------------- one rank

def child(o):
    import torch
    import torch.distributed as dist

    rank, store = int(o.child[0]), o.child[1]
    n = o.np
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=o.timeout))
    factor, split = COLLS[o.coll]
    f32 = torch.float32

    # One way to run each collective, the newest API this torch's Gloo takes.
    def allgather_tensor(out, inp):
        dist.all_gather_into_tensor(out, inp)

    def blocks(t):
        """n equal views of t (chunk() returns fewer when t is empty)."""
        c = t.numel() // n
        return [t[i * c:(i + 1) * c] for i in range(n)]

    def allgather_list(out, inp):
        dist.all_gather(blocks(out), inp)

    def rs_tensor(out, inp):
        dist.reduce_scatter_tensor(out, inp)

    def rs_list(out, inp):
        dist.reduce_scatter(out, blocks(inp))

    def probe(cands):
        """The first candidate that works on a one-element-per-rank call."""
        why = []
        for name, fn in cands:
            if not hasattr(dist, name):
                why.append("torch.distributed." + name + " missing")
                continue
            try:
                fn(torch.zeros(n, dtype=f32), torch.zeros(n, dtype=f32)[:1]
                   if o.coll == "allgather" else torch.zeros(n, dtype=f32))
                return name, fn
            except RuntimeError as e:
                why.append(str(e).splitlines()[0])
        return None, "; ".join(why)

    api = {"allreduce": "all_reduce", "broadcast": "broadcast"}.get(o.coll)
    if o.coll == "allgather":
        api, call = probe([("all_gather_into_tensor", allgather_tensor),
                           ("all_gather", allgather_list)])
    elif o.coll == "reduce_scatter":
        api, call = probe([("reduce_scatter_tensor", lambda out, inp: rs_tensor(out[:1], inp)),
                           ("reduce_scatter", lambda out, inp: rs_list(out[:1], inp))])
        call = {"reduce_scatter_tensor": rs_tensor, "reduce_scatter": rs_list}.get(api, call)
    if api is None:
        if rank == 0:
            print("# gloo_perf %s: unsupported by this torch's Gloo (torch %s): %s"
                  % (o.coll, torch.__version__, call), flush=True)
        dist.destroy_process_group()
        return EXIT_UNSUPPORTED
    if o.coll == "allgather" and api == "all_gather_into_tensor":
        call = allgather_tensor

    maxbytes = max(max(b for b, _, _ in o.rows), 4)
    # Allocated once at the largest size and touched, as the C tools do.
    sbuf = torch.zeros(maxbytes // 4 + n, dtype=f32)
    rbuf = torch.zeros(maxbytes // 4 + n, dtype=f32)
    sync = torch.zeros(1, dtype=torch.float64)

    def run(c, total, in_place):
        """One call with c elements per rank (total in the whole buffer)."""
        if c == 0 and split:
            return  # Gloo's allgather dies of SIGFPE on empty blocks (torch 1.13)
        if o.coll == "allreduce":
            dist.all_reduce(rbuf[:c])  # in place is the only form
        elif o.coll == "broadcast":
            dist.broadcast(rbuf[:c], 0)  # one buffer, like MPI_Bcast
        elif o.coll == "allgather":
            inp = rbuf[rank * c:(rank + 1) * c] if in_place else sbuf[:c]
            call(rbuf[:total], inp)
        else:
            # In place as in torch's docs for NCCL: the result in the input's own block.
            out = rbuf[rank * c:(rank + 1) * c] if in_place else rbuf[:c]
            call(out, rbuf[:total] if in_place else sbuf[:total])

    idx = torch.arange(maxbytes // 4 + n, dtype=torch.int64)

    def value_sum(r, m):
        return ((idx[:m] + r) % 7 - 3).to(f32)

    def value_raw(r, m):
        return ((idx[:m] + r) % PERIOD - 125).to(f32)

    def check(c, total, in_place):
        """The pattern of mpi_coll_perf.c; wrong elements of this rank."""
        out_count = total if o.coll == "allgather" else c
        rbuf[:total].fill_(float("nan"))
        if o.coll in ("allreduce",):
            rbuf[:c].copy_(value_sum(rank, c))
        elif o.coll == "reduce_scatter":
            (rbuf if in_place else sbuf)[:total].copy_(value_sum(rank, total))
        elif o.coll == "allgather":
            (rbuf[rank * c:] if in_place else sbuf)[:c].copy_(value_raw(rank, c))
        elif rank == 0:
            rbuf[:c].copy_(value_raw(0, c))
        run(c, total, in_place)
        if o.coll == "allreduce":
            want = sum(value_sum(r, c) for r in range(n))
            got = rbuf[:c]
        elif o.coll == "reduce_scatter":
            want = sum(value_sum(r, total) for r in range(n))[rank * c:(rank + 1) * c]
            got = rbuf[rank * c:(rank + 1) * c] if in_place else rbuf[:c]
        elif o.coll == "allgather":
            want = torch.cat([value_raw(r, c) for r in range(n)]) if c else rbuf[:0]
            got = rbuf[:out_count]
        else:
            want, got = value_raw(0, c), rbuf[:c]
        return int((got != want).sum().item())

    def measure(c, total, in_place, iters, warmup):
        sbuf.zero_()  # zeros: a sum repeated in place stays finite
        rbuf.zero_()
        for _ in range(warmup):
            run(c, total, in_place)
        dist.all_reduce(sync)  # every rank starts the clock together
        t0 = time.perf_counter()
        for _ in range(iters):
            run(c, total, in_place)
        t = torch.tensor([(time.perf_counter() - t0) * 1e6 / iters], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        wrong = -1
        if o.check:
            w = torch.tensor([check(c, total, in_place)], dtype=torch.int64)
            dist.all_reduce(w)
            wrong = int(w.item())
        return t.item(), wrong

    pids = [None] * n
    dist.all_gather_object(pids, (os.getpid(), socket.gethostname()))
    if rank == 0:
        print("# gloo_perf %s (torch %s, gloo, %s)" % (o.coll, torch.__version__, api))
        print("# nRanks %d minBytes %d maxBytes %d warmup iters: %s iters: %s validation: %d"
              % (n, min(r[0] for r in o.rows), max(r[0] for r in o.rows),
                 "/".join(sorted({str(r[2]) for r in o.rows})),
                 "/".join(sorted({str(r[1]) for r in o.rows})), o.check))
        if o.coll in ("allreduce", "broadcast"):
            print("# %s has one buffer: both columns time the same in-place call" % api)
        print("#\n# Using ranks")
        for r, (pid, host) in enumerate(pids):
            print("#  Rank %2d Pid %6d on %10s" % (r, pid, host))
        print("#\n#%51s%22s%11s%21s" % ("", "out-of-place", "", "in-place"))
        hdr = "#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s"
        print(hdr % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw",
                     "#wrong", "time", "algbw", "busbw", "#wrong"))
        print(hdr % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "",
                     "(us)", "(GB/s)", "(GB/s)", ""), flush=True)
    bw_sum, bw_count, wrong_total = 0.0, 0, 0
    for nbytes, iters, warmup in o.rows:
        total = nbytes // 4
        if split:
            total = total // n * n
        c = total // n if split else total
        res = [measure(c, total, 0, iters, warmup)]
        # One-buffer collectives: the in-place column is the same call.
        res.append(res[0] if o.coll in ("allreduce", "broadcast") else
                   measure(c, total, 1, iters, warmup))
        wrong_total += sum(w for _, w in res if w > 0)
        if rank == 0:
            line = "%12d  %12d  %8s  %6s  %6d" % (
                total * 4, total, "float", "none" if o.coll in ("allgather", "broadcast") else "sum",
                0 if o.coll == "broadcast" else -1)
            for us, wrong in res:
                algbw = total * 4 / 1e3 / us if us > 0 else 0.0
                t = "%7.0f" % us if us >= 10000 else "%7.1f" % us if us >= 100 else "%7.2f" % us
                line += "  %7s  %6.2f  %6.2f  %6s" % (t, algbw, algbw * factor(n),
                                                      "N/A" if wrong < 0 else wrong)
                bw_sum += algbw * factor(n)
                bw_count += 1
            print(line, flush=True)
    if rank == 0:
        print("# Out of bounds values : %d %s" % (wrong_total, "FAILED" if wrong_total else "OK"))
        print("# Avg bus bandwidth    : %g \n#" % (bw_sum / bw_count if bw_count else 0.0),
              flush=True)
    dist.destroy_process_group()
    return 1 if wrong_total else 0


def main(argv):
    o = parse_args(argv)
    if o.child:
        return child(o)
    return launch(o, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
