#!/usr/bin/env python3
"""What CPU autocast (torch.autocast("cpu", torch.bfloat16)) does to each op memtrade has.

For every memtrade op kind (kernels/ops.h), the PyTorch op(s) the twins use for it run under
CPU autocast on fp32 and on bf16 activations, as they arrive in the twins (the GPT residual
stream is fp32, a Linear's output bf16, ...); prints the output dtype and every tensor autograd
saves for backward (dtype, shape, and whether it is an input as given, a new tensor, or a
parameter/its cast), from saved_tensors_hooks. This is the empirical check of the torch-cpu rows
of models/config/autocast_policy.h for the torch installed here (Debian's 1.13). Usage:

    autocast_probe.py [--json OUT]
"""
import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
import torch_models  # noqa: E402

N, C, T, NH = 4, 16, 8, 2  # small shapes: dtypes and what is saved do not depend on size


def _leaf(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).requires_grad_(True)


def _act(*shape, dtype):
    """An activation (a non-leaf that requires grad) of `dtype`."""
    return (_leaf(*shape) * 1.0).to(dtype)


def cases():
    """(memtrade op, description, input dtype, fn) with fn() = (inputs dict, compute): the
    inputs are made outside autocast, compute() runs the op on them inside."""
    out = []
    for dt in (torch.float32, torch.bfloat16):
        d = str(dt).replace("torch.", "")

        def matmul(dt=dt):
            a, b = _act(N * NH, T, C // NH, dtype=dt), _act(N * NH, C // NH, T, dtype=dt)
            return {"a": a, "b": b}, lambda: a @ b
        out.append(("matmul", "a @ b (bmm)", d, matmul))

        def linear(dt=dt):
            x, w, b = _act(N, C, dtype=dt), _leaf(3 * C, C), _leaf(3 * C)
            return {"x": x, "weight": w, "bias": b}, lambda: F.linear(x, w, b)
        out.append(("linear", "F.linear (addmm)", d, linear))

        def conv2d(dt=dt):
            x, w = _act(N, 3, 8, 8, dtype=dt), _leaf(8, 3, 3, 3)
            return {"x": x, "weight": w}, lambda: F.conv2d(x, w, padding=1)
        out.append(("conv2d", "F.conv2d", d, conv2d))

        def layernorm(dt=dt):
            x, w, b = _act(N, C, dtype=dt), _leaf(C), _leaf(C)
            return {"x": x, "weight": w, "bias": b}, lambda: F.layer_norm(x, (C,), w, b)
        out.append(("layernorm", "F.layer_norm", d, layernorm))

        def softmax(dt=dt):
            x = _act(N, NH, T, T, dtype=dt)
            return {"x": x}, lambda: F.softmax(x, dim=-1)
        out.append(("softmax", "F.softmax", d, softmax))

        def attention(dt=dt):
            qkv = _act(N, T, 3 * C, dtype=dt)
            mask = torch.tril(torch.ones(T, T)).view(1, 1, T, T)

            def compute():
                q, k, v = qkv.split(C, dim=2)
                q, k, v = (z.view(N, T, NH, C // NH).transpose(1, 2) for z in (q, k, v))
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // NH))
                att = F.softmax(att.masked_fill(mask == 0, float("-inf")), dim=-1)
                return (att @ v).transpose(1, 2).contiguous().view(N, T, C)
            return {"qkv": qkv}, compute
        out.append(("attention", "math attention (nanoGPT)", d, attention))

        def crossentropy(dt=dt):
            x, t = _act(N, 10, dtype=dt), torch.randint(0, 10, (N,))
            return {"logits": x, "targets": t}, lambda: F.cross_entropy(x, t)
        out.append(("crossentropy", "F.cross_entropy", d, crossentropy))

        def gelu(dt=dt):
            x = _act(N, 4 * C, dtype=dt)
            return {"x": x}, lambda: F.gelu(x, approximate="tanh")
        out.append(("gelu", "F.gelu(tanh)", d, gelu))

        def relu(dt=dt):
            x = _act(N, C, dtype=dt)
            return {"x": x}, lambda: F.relu(x)
        out.append(("relu", "F.relu", d, relu))

        def add(dt=dt):
            a, b = _act(N, C, dtype=torch.float32), _act(N, C, dtype=dt)
            return {"a(fp32)": a, "b": b}, lambda: a + b
        out.append(("add", "fp32 residual + x", d, add))

        def batchnorm(dt=dt):
            x, w, b = _act(N, 8, 4, 4, dtype=dt), _leaf(8), _leaf(8)
            rm, rv = torch.zeros(8), torch.ones(8)
            return ({"x": x, "weight": w, "bias": b},
                    lambda: F.batch_norm(x, rm, rv, w, b, training=True))
        out.append(("batchnorm", "F.batch_norm (train)", d, batchnorm))

        def avgpool(dt=dt):
            x = _act(N, 8, 4, 4, dtype=dt)
            return {"x": x}, lambda: x.mean(dim=(2, 3))
        out.append(("avgpool", "x.mean(dim=(2, 3))", d, avgpool))

        def maxpool(dt=dt):
            x = _act(N, 8, 4, 4, dtype=dt)
            return {"x": x}, lambda: F.max_pool2d(x, 2)
        out.append(("maxpool", "F.max_pool2d", d, maxpool))

        def sum_(dt=dt):
            x = _act(N, dtype=dt)
            return {"x": x}, lambda: x.sum()
        out.append(("sum", "x.sum()", d, sum_))

        # The Llama twin's own modules (bench/peers/torch_models.py), as HF writes them.
        def rmsnorm(dt=dt):
            norm = torch_models.LlamaRMSNorm(C, 1e-5)
            x = _act(N, C, dtype=dt)
            return {"x": x, "weight": norm.weight}, lambda: norm(x)
        out.append(("rmsnorm", "LlamaRMSNorm", d, rmsnorm))

        def rope(dt=dt):
            q = _act(N, NH, T, C // NH, dtype=dt)
            emb = torch.randn(T, C // NH)
            cos, sin = emb.cos().to(dt), emb.sin().to(dt)  # HF: cast to x's dtype outside autocast
            return ({"q": q, "cos": cos, "sin": sin},
                    lambda: q * cos + torch_models.rotate_half(q) * sin)
        out.append(("rope", "q·cos + rotate_half(q)·sin", d, rope))

        def swiglu(dt=dt):
            g, u = _act(N, 4 * C, dtype=dt), _act(N, 4 * C, dtype=dt)
            return {"gate": g, "up": u}, lambda: F.silu(g) * u
        out.append(("swiglu", "F.silu(gate) * up", d, swiglu))

    def embedding():
        w, idx = _leaf(32, C), torch.randint(0, 32, (N, T))
        return {"weight": w, "idx": idx}, lambda: F.embedding(idx, w)
    out.append(("embedding", "F.embedding", "int64", embedding))
    return out


def probe(fn):
    """(output dtype or "error: ...", saved rows) of one case."""
    inputs, compute = fn()
    saved = []
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t,
                                                          lambda t: t):
                y = compute()
    except RuntimeError as e:
        return f"error: {str(e).splitlines()[0]}", []
    ptrs = {t.storage().data_ptr(): name for name, t in inputs.items()}
    rows, seen = [], set()
    for t in saved:
        p = t.storage().data_ptr()
        if p in seen:
            continue
        seen.add(p)
        what = ptrs.get(p)
        if what is None:
            fn_ = t.grad_fn
            while fn_ is not None and type(fn_).__name__ != "ToCopyBackward0" and \
                    len(fn_.next_functions) == 1:
                fn_ = fn_.next_functions[0][0]
            src = None
            if fn_ is not None and type(fn_).__name__ == "ToCopyBackward0":
                nxt = fn_.next_functions[0][0]
                if type(nxt).__name__ == "AccumulateGrad":
                    src = next((n for n, v in inputs.items() if v is nxt.variable), None)
            what = f"cast of {src}" if src else "new"
        rows.append({"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
                     "what": what})
    return str(y.dtype).replace("torch.", ""), rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    print(f"torch {torch.__version__}, torch.autocast('cpu', dtype=torch.bfloat16)")
    results = []
    for op, desc, dt, fn in cases():
        y, rows = probe(fn)
        results.append({"op": op, "torch": desc, "input": dt, "output": y, "saved": rows})
        saved = ", ".join(f"{r['what']} {r['dtype']}{tuple(r['shape'])}" for r in rows) or "-"
        print(f"{op:<12} {desc:<26} in {dt:<8} -> out {y:<8} saved: {saved}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
