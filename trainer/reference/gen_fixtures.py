#!/usr/bin/env python3
"""gen_fixtures.py - an independent PyTorch reference for trainer/model.c.

Builds the GPT-2-shaped model of trainer/model.h from a flat parameter
vector, computes the mean cross-entropy loss and its gradient with autograd
in float64, and writes one binary fixture per case for tests/test_trainer_ref.c.
Nothing here imports or reads model.c: the only shared contract is the
parameter layout documented in model.h.

File format (all little-endian, no padding), one file per case:
    offset  type          what
    0       char[8]       magic "WEFTREF1"
    8       int32[7]      V, maxT, L, C, NH, B, T
    36      uint64        P: number of parameters (must equal the layout's total)
    44      float32[P]    params, flat, in model.h's layout
    ..      uint8[B*T]    tokens, row-major (B, T)
    ..      uint8[B*T]    targets, row-major (B, T)
    ..      float64       loss: mean cross-entropy over the B*T positions
    ..      float32[P]    grads: d(loss)/d(params), computed in float64, rounded

The reference uses the float32-rounded params (widened to float64), so the
only difference a C model in float32 should show is its own arithmetic.

Usage: python3 gen_fixtures.py [OUTDIR]   (default: ../../tests/fixtures/trainer)
Deterministic: the same bytes on every run (numpy's PCG64 with fixed seeds).
"""
import math
import os
import struct
import sys

import numpy as np
import torch

MAGIC = b"WEFTREF1"
V = 256

# name, maxT, L, C, NH, B, T, seed
CASES = [
    ("tiny", 8, 2, 16, 2, 2, 8, 1234),
    ("short_t", 16, 1, 32, 4, 3, 11, 5678),
]

LAYER_TENSORS = [  # name, shape as a function of C; order is model.h's
    ("ln1w", lambda C: (C,)),
    ("ln1b", lambda C: (C,)),
    ("qkvw", lambda C: (3 * C, C)),
    ("qkvb", lambda C: (3 * C,)),
    ("attprojw", lambda C: (C, C)),
    ("attprojb", lambda C: (C,)),
    ("ln2w", lambda C: (C,)),
    ("ln2b", lambda C: (C,)),
    ("fcw", lambda C: (4 * C, C)),
    ("fcb", lambda C: (4 * C,)),
    ("fcprojw", lambda C: (C, 4 * C)),
    ("fcprojb", lambda C: (C,)),
]


def layout(maxT, L, C):
    """[(name, shape)] in flat order: EMB, LAYER 0..L-1, LNF."""
    t = [("wte", (V, C)), ("wpe", (maxT, C))]
    for l in range(L):
        t += [(f"l{l}.{n}", f(C)) for n, f in LAYER_TENSORS]
    t += [("lnfw", (C,)), ("lnfb", (C,))]
    return t


def draw_params(tensors, rng):
    """N(0, 0.1) for weights and biases; LayerNorm weight 1 + N(0, 0.1), so
    every term (including LayerNorm's scale and shift) moves the loss."""
    parts = []
    for name, shape in tensors:
        x = rng.normal(0.0, 0.1, size=shape)
        if name.endswith(("ln1w", "ln2w", "lnfw")):
            x = x + 1.0
        parts.append(x.reshape(-1))
    return np.concatenate(parts).astype(np.float32)


def layernorm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased, as GPT-2
    return (x - mean) / torch.sqrt(var + 1e-5) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(p, tokens, targets, maxT, L, C, NH):
    """p: dict name -> float64 tensor; tokens/targets: (B, T) int64."""
    B, T = tokens.shape
    hs = C // NH
    x = p["wte"][tokens] + p["wpe"][:T]  # (B, T, C)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        q_ = lambda n: p[f"l{l}.{n}"]
        h = layernorm(x, q_("ln1w"), q_("ln1b"))
        qkv = h @ q_("qkvw").T + q_("qkvb")  # (B, T, 3C)
        q, k, v = qkv.split(C, dim=-1)
        q = q.view(B, T, NH, hs).transpose(1, 2)  # (B, NH, T, hs)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)  # (B, NH, T, T)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ q_("attprojw").T + q_("attprojb")
        h = layernorm(x, q_("ln2w"), q_("ln2b"))
        h = gelu_tanh(h @ q_("fcw").T + q_("fcb"))  # (B, T, 4C)
        x = x + h @ q_("fcprojw").T + q_("fcprojb")
    x = layernorm(x, p["lnfw"], p["lnfb"])
    logits = x @ p["wte"].T  # (B, T, V), tied head
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


def make_case(maxT, L, C, NH, B, T, seed):
    assert C % NH == 0 and T <= maxT
    rng = np.random.default_rng(seed)
    tensors = layout(maxT, L, C)
    params32 = draw_params(tensors, rng)
    tokens = rng.integers(0, 256, size=(B, T), dtype=np.uint8)
    targets = rng.integers(0, 256, size=(B, T), dtype=np.uint8)

    flat = torch.tensor(params32.astype(np.float64), requires_grad=True)
    views, off = {}, 0
    for name, shape in tensors:
        n = int(np.prod(shape))
        views[name] = flat[off:off + n].view(shape)
        off += n
    assert off == flat.numel()
    loss = forward(views, torch.from_numpy(tokens.astype(np.int64)),
                   torch.from_numpy(targets.astype(np.int64)), maxT, L, C, NH)
    loss.backward()
    grads32 = flat.grad.numpy().astype(np.float32)
    return params32, tokens, targets, float(loss.item()), grads32


def write_fixture(path, cfg, params32, tokens, targets, loss, grads32):
    maxT, L, C, NH, B, T = cfg
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<7i", V, maxT, L, C, NH, B, T))
        f.write(struct.pack("<Q", params32.size))
        f.write(params32.astype("<f4").tobytes())
        f.write(tokens.tobytes())
        f.write(targets.tobytes())
        f.write(struct.pack("<d", loss))
        f.write(grads32.astype("<f4").tobytes())


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "tests", "fixtures", "trainer")
    os.makedirs(outdir, exist_ok=True)
    torch.set_num_threads(1)  # same summation order on every machine
    for name, maxT, L, C, NH, B, T, seed in CASES:
        params32, tokens, targets, loss, grads32 = make_case(maxT, L, C, NH, B, T, seed)
        path = os.path.join(outdir, name + ".bin")
        write_fixture(path, (maxT, L, C, NH, B, T), params32, tokens, targets, loss, grads32)
        print(f"{path}: V={V} maxT={maxT} L={L} C={C} NH={NH} B={B} T={T} "
              f"P={params32.size} loss={loss:.10f} max|g|={np.abs(grads32).max():.3e}")


if __name__ == "__main__":
    main()
