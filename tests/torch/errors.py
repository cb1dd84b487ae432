"""errors.py - the "weft" backend's failures reach Python as RuntimeErrors
that name the rank, and none of them hangs.  Starts its own ranks:

    /usr/bin/python3 tests/torch/errors.py [-n 3]

Three phases, each on a fresh weft group (a failed communicator stays
failed), with a Gloo group to line them up:
  bad calls     a dtype weft cannot reduce, an op it lacks, a sparse
                tensor, sizes that do not fit: refused at the call, and the
                group still works after them;
  mismatch      with WEFT_CHECK=1, rank 0 reduces float32 while the others
                reduce int32: every rank gets an error instead of garbage;
  dead peer     the last rank exits abruptly; the others' next all_reduce
                raises within DEAD_PEER_S (weft's own deadline is set far
                past it, so a pass is a detected failure, not a timeout),
                and so does the call after it.
Exit status 0 when every rank saw what it should, 1 otherwise.
"""
import argparse
import os
import socket
import subprocess
import sys
import time

DEAD_PEER_S = 15.0
VICTIM_EXIT = 7


def expect_error(rank, what, fn, *needles):
    """Runs fn; it must raise RuntimeError starting "weft rank R:" and
    containing each needle.  Returns the message, or exits 1."""
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        if f"weft rank {rank}:" not in msg or not all(n in msg for n in needles):
            print(f"rank {rank}: {what}: wrong message: {msg[:400]!r}", flush=True)
            sys.exit(1)
        return msg
    print(f"rank {rank}: {what}: no exception", flush=True)
    sys.exit(1)


def child(n, phase):
    import torch
    import torch.distributed as dist
    import torch_weft  # noqa: F401

    dist.init_process_group("gloo")
    r = dist.get_rank()
    if phase == "check":
        bad_calls(r, n, torch, dist)
        dist.barrier()
        g = dist.new_group(backend="weft")
        dtype = torch.float32 if r == 0 else torch.int32
        expect_error(r, "mismatched dtypes", lambda: dist.all_reduce(torch.ones(10, dtype=dtype), group=g),
                     "mismatch")
        return
    g = dist.new_group(backend="weft")
    dist.all_reduce(torch.ones(4), group=g)
    dist.barrier()
    if r == n - 1:
        os._exit(VICTIM_EXIT)
    start = time.monotonic()
    # Issued before the peer is seen gone, so the failure comes back through
    # the Work (weft_wait on the completion thread), then through the future.
    work = dist.all_reduce(torch.ones(1 << 18), group=g, async_op=True)
    msg = expect_error(r, "dead peer", work.wait)
    took = time.monotonic() - start
    expect_error(r, "the failed Work's future", lambda: work.get_future().wait())
    expect_error(r, "call after the failure", lambda: dist.all_reduce(torch.ones(4), group=g))
    if took > DEAD_PEER_S:
        print(f"rank {r}: the dead peer was noticed after {took:.1f} s", flush=True)
        sys.exit(1)
    print(f"rank {r}: dead peer noticed in {took:.2f} s: {msg}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # the Gloo group's teardown would wait for the dead rank


def bad_calls(r, n, torch, dist):
    g = dist.new_group(backend="weft")
    expect_error(r, "int16 sum", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16), group=g),
                 "cannot be reduced")
    expect_error(r, "bitwise and", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32),
                                                           op=dist.ReduceOp.BAND, group=g),
                 "not supported")
    expect_error(r, "sparse tensor", lambda: dist.all_reduce(torch.ones(4).to_sparse(), group=g),
                 "dense")
    expect_error(r, "short output", lambda: dist.all_gather_into_tensor(
        torch.empty(4 * n - 1), torch.ones(4), group=g), "elements")
    t = torch.full((4,), float(r))
    dist.all_reduce(t, group=g)
    if not torch.equal(t, torch.full((4,), float(sum(range(n))))):
        print(f"rank {r}: all_reduce after refused calls gave {t.tolist()}", flush=True)
        sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(n, phase):
    """Runs one phase on n fresh ranks; True when each exited as it should."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(n), WEFT_TIMEOUT_MS=str(int(DEAD_PEER_S * 4000)))
    if phase == "check":
        env["WEFT_CHECK"] = "1"
    procs = [subprocess.Popen([sys.executable, __file__, "--child", phase, "-n", str(n)],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(n)]
    deadline, ok = time.monotonic() + 2 * DEAD_PEER_S + 30, True
    for r, p in enumerate(procs):
        try:
            rc = p.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"errors: {phase}: rank {r} hangs; killing it", flush=True)
            p.kill()
            p.wait()
            rc = None
        want = VICTIM_EXIT if phase == "dead" and r == n - 1 else 0
        if rc != want:
            print(f"errors: {phase}: rank {r} exited {rc}, not {want}", flush=True)
            ok = False
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--child", choices=("check", "dead"), help=argparse.SUPPRESS)
    o = ap.parse_args()
    if o.child:
        child(o.n, o.child)
        return 0
    # Two launches: WEFT_CHECK=1 (needed to see the mismatch) would find
    # the dead peer in its own exchange, before the operation proper.
    ok = launch(o.n, "check") and launch(o.n, "dead")
    if ok:
        print(f"errors: {o.n} ranks: bad calls, mismatch and a dead peer all raised", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
