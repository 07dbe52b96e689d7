"""memtrade's step dump checked against PyTorch eager on the same parameters and batch.

For each model and knob setting, `memtrade step --dump` writes the batch, the parameters
before and after one optimizer step and the gradients; PyTorch recomputes the loss and the
gradients of the mean loss from the same parameters and batch, and takes the same optimizer
step with torch.optim. Tolerance per element: tol + |ref|·eps(dtype).
"""
import contextlib
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "peers"))
import cpu_isa  # noqa: E402
import torch_models  # noqa: E402

EPS = {"fp32": 2.0**-23, "tf32": 2.0**-10, "bf16": 2.0**-8, "fp16": 2.0**-11,
       "bf16-o2": 2.0**-8, "fp16-o2": 2.0**-11, "bf16-pure": 2.0**-8, "fp16-pure": 2.0**-11}


def run_dump(memtrade_bin, tmp_path, *flags):
    out = tmp_path / "dump"
    cmd = [memtrade_bin, "step", "--backend", "cpu", *flags, "--dump", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    meta = json.loads((out / "meta.json").read_text())
    return out, meta


def load_params(out, meta, sub="params"):
    return {name: torch.from_numpy(np.load(out / sub / f"{name}.npy")) for name in meta["params"]}


def torch_step(out, meta):
    model = torch_models.build(meta["hyper"]["family"], meta["hyper"]).double()
    state = {k: v.double() for k, v in load_params(out, meta).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # The tied lm_head is not dumped twice; buffers (batch-norm running stats) are not
    # parameters, and batch-norm in training mode normalises with batch statistics anyway.
    assert all(k == "lm_head.weight" or k.endswith(("running_mean", "running_var",
                                                    "num_batches_tracked")) for k in missing), missing
    assert not unexpected, unexpected
    inputs = torch.from_numpy(np.load(out / "inputs.npy"))
    targets = torch.from_numpy(np.load(out / "targets.npy")).long()
    if inputs.dtype == torch.int32:
        inputs = inputs.long()
    else:
        inputs = inputs.double()
    # k micro-batches, each its own forward (batch-norm statistics are per micro-batch, as in
    # PyTorch with gradient accumulation); the gradient is of the mean over all of them.
    k = meta["config"]["accumulation"]
    loss = sum(model(x, y) for x, y in zip(inputs.chunk(k), targets.chunk(k))) / k
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return model, float(loss), grads


def assert_step_fp32(out, meta, ref_loss, ref_grads):
    """A step dump against a float64 reference, to fp32's bound: the loss to 1e-5 relatively, each
    gradient element within 1e-5 of its tensor's largest element plus 1e-5 of itself."""
    loss = float(np.load(out / "loss.npy"))
    assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss), (loss, ref_loss)
    for name in meta["params"]:
        ref = ref_grads[name].numpy()
        assert_close(name, np.load(out / "grads" / f"{name}.npy"), ref,
                     tol=1e-5 * float(np.abs(ref).max()), eps=1e-5)


def assert_close(name, got, ref, tol, eps):
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"{name}: shape {got.shape} vs {ref.shape}"
    bound = tol + np.abs(ref) * eps
    err = np.abs(got - ref)
    worst = np.argmax(err - bound)
    assert np.all(err <= bound), (
        f"{name}: |got-ref| {err.flat[worst]:.3g} > bound {bound.flat[worst]:.3g} "
        f"(got {got.flat[worst]:.6g}, ref {ref.flat[worst]:.6g})")


# memtrade against the twin in float64: the reference does not depend on the CPU, and memtrade's
# own GEMM gives the same bits on its AVX2 and AVX-512 paths (on the SSE2 path OpenBLAS sums in
# another order). Rule: fp32 within 1e-5 of each tensor's largest element plus 1e-4 of itself
# (fp32's eps times the reduction lengths here, a few hundred, with a margin); bf16 within 5% of
# the largest element plus 10% of itself, or, for the CNN, a cosine ≥ 0.95 (see below). Measured,
# the worst element's share of its bound, AVX-512 / AVX2 / SSE2: fp32 0.057 / 0.057 / 0.045 (cnn,
# gpt), bf16 0.165 / 0.165 / 0.165 (gpt-tiny O2), the CNN's bf16 1 − cosine 0.034 of 0.05 on all.
@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny", "mlp-tiny", "cnn-tiny"])
@pytest.mark.parametrize("flags", [
    ("--precision", "fp32"),
    ("--precision", "fp32", "--accumulation", "2"),
    ("--precision", "fp32", "--checkpoint", "1"),
    ("--precision", "bf16"),
    ("--precision", "bf16-o2"),
])
def test_grads_and_loss_match_pytorch(memtrade_bin, tmp_path, model, flags):
    out, meta = run_dump(memtrade_bin, tmp_path, "--model", model, "--batch-size", "4",
                         "--optimizer", "sgd", *flags)
    precision = meta["config"]["precision"]
    _, ref_loss, ref_grads = torch_step(out, meta)
    loss = float(np.load(out / "loss.npy"))
    # bf16 rounds activations (O2: all of them; autocast: every matmul/conv input and output)
    # to bf16: errors compound over layers, hence the wider band.
    rel = 8 * EPS[precision] if precision != "fp32" else 1e-5
    assert abs(loss - ref_loss) <= 1e-6 + rel * abs(ref_loss) * 10, (loss, ref_loss)
    for name in meta["params"]:
        got = np.load(out / "grads" / f"{name}.npy")
        ref = ref_grads[name].numpy()
        scale = float(np.abs(ref).max()) or 1.0
        if precision == "fp32":
            assert_close(name, got, ref, tol=1e-5 * scale, eps=1e-4)
        elif model.startswith("cnn"):
            # Batch-norm's inputs and their gradients are bf16 (O2 stores everything in bf16;
            # autocast runs batch-norm in its input's dtype, as PyTorch's own autocast does, which
            # is as far from fp64: test_autocast_matches_pytorch_cpu_autocast, rule 2), and its backward
            # subtracts means of those: measured relative errors of 3-27% per tensor at batch 4,
            # all in the right direction. Check the direction.
            cos = float(np.dot(got.ravel(), ref.ravel()) /
                        (np.linalg.norm(got) * np.linalg.norm(ref) + 1e-30))
            assert cos >= 0.95, f"{name}: cosine {cos:.4f} with the fp64 reference"
        else:
            assert_close(name, got, ref, tol=0.05 * scale, eps=0.1)


def rel_l2(got, ref):
    return float(np.linalg.norm(got - ref) / (np.linalg.norm(ref) + 1e-30))


def bf16_twin_grads(out, meta, gemms):
    """PyTorch's own CPU autocast (bf16) of the twin on the dump's fp32 parameters and batch:
    (loss, {name: grad}). gemms="stock": the GEMMs and convolutions of this CPU's PyTorch (on a CPU
    capped below AVX-512 by the environment, the ones such a CPU runs: cpu_isa.torch_lowp);
    gemms="fp32-accumulating": each computed from its bf16 operands in fp32 and rounded once
    (cpu_isa.fp32_accumulating_gemms), the same on every CPU."""
    twin = torch_models.build(meta["hyper"]["family"], meta["hyper"])
    _, unexpected = twin.load_state_dict(load_params(out, meta), strict=False)
    assert not unexpected, unexpected
    twin.train()
    inputs = torch.from_numpy(np.load(out / "inputs.npy"))
    inputs = inputs.long() if inputs.dtype == torch.int32 else inputs.float()
    targets = torch.from_numpy(np.load(out / "targets.npy")).long()
    k = meta["config"]["accumulation"]
    mode = cpu_isa.fp32_accumulating_gemms() if gemms == "fp32-accumulating" else \
        contextlib.nullcontext()
    loss = 0.0
    with cpu_isa.torch_lowp(), mode:
        # Gradient accumulation as a PyTorch loop does it: each micro-batch its own autocast
        # region and backward, so .grad sums fp32 casts of bf16 weight gradients (one backward of
        # the summed losses would sum them in bf16, on the one cached bf16 copy of each weight).
        for x, y in zip(inputs.chunk(k), targets.chunk(k)):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                part = twin(x, y) / k
            part.backward()
            loss += float(part)
    return loss, {n: p.grad.double().numpy() for n, p in twin.named_parameters()}


def bf16_valued(grads):
    """The names of the gradient tensors every element of which is a bf16 value."""
    def exact(g):
        t = torch.from_numpy(np.asarray(g, np.float32))
        return torch.equal(t.bfloat16().float(), t)
    return {n for n, g in grads.items() if exact(g)}


# memtrade's bf16 autocast (the torch-cpu policy) against PyTorch's CPU autocast (torch 1.13) on
# the same fp32 parameters and batch, by two rules whose bounds hold on every x86 CPU.
#
# Why not stock PyTorch against memtrade directly: PyTorch's bf16 GEMMs depend on the CPU. With
# AVX-512 they are oneDNN's (fp32 accumulation, one rounding); without it, ATen's native bf16
# GEMM, which rounds more. Measured at batch 4, relative L2 error of the worst gradient tensor,
# memtrade against stock PyTorch: AVX-512 (a Xeon with AVX-512 bf16, family 6 model 167 under KVM)
# gpt-tiny 1.78·eps, llama-tiny 2.00·eps, cnn-tiny 3.41·eps; AVX2 (that Xeon capped by
# cpu_isa.ENV["avx2"]) 14.80·eps, 8.32·eps and 113.6·eps, and on the first tensor checked the
# figures an EPYC Zen 3 gave: wte 4.24·eps, embed_tokens 5.45·eps, stem.conv 77.85·eps. The old bound (4·eps, 8·eps for the CNN)
# held on the first and failed on the second. memtrade's own bits are the same on both (its GEMM's
# k order is fixed; tests/kernels/test_cpu_gemm.cpp).
#
# Rule 1, against PyTorch's autocast with fp32-accumulating GEMMs and convolutions: every cast,
# op list and non-GEMM kernel is stock PyTorch's; only the GEMM arithmetic is pinned to what
# oneDNN, cuBLAS and memtrade do. What remains is fp32-sized (summation order: OpenBLAS's, or
# memtrade's own GEMM with 1/√hd inside QKᵀ) and flips a bf16 rounding now and then: an error of
# about eps on that element, independent from element to element, so a tensor's relative L2 error
# is a small multiple of eps. Bound: 4·eps per gradient tensor, the CNN included (its batch-norm
# backward subtracts means of bf16 values and amplifies those flips, but the flips are now as
# rare as in the others). Measured, worst tensor over the three flag sets, AVX-512 / emulated
# AVX2: gpt-tiny 1.80 / 1.80·eps, llama-tiny 2.02 / 2.02·eps (tied), mlp-tiny 0.00 / 0.00·eps
# (bit-identical), cnn-tiny 1.11 / 1.12·eps. The loss, a mean over rows of fp32 log-softmaxes
# whose flips average out: eps/16 relative (measured ≤ 0.0013·eps on both). And exactly: the same
# gradient tensors hold bf16 values on both sides (16 of gpt-tiny's 28 at accumulation 1).
#
# Rule 2, against stock PyTorch (whatever this CPU runs), both measured from the fp64 twin: for
# each gradient tensor, memtrade is no farther from fp64 than PyTorch is, within 10% and 0.5·eps
# (the two round the same tensors; what differs is each side's own flips, of order eps, mostly
# orthogonal to the shared rounding error). Measured, memtrade ÷ PyTorch distance to fp64, worst
# tensor: AVX-512 1.14 (llama-tiny tied, 1.62 against 1.42·eps: 0.45·eps inside the bound), AVX2
# 0.32 (stock PyTorch's tied embeddings there: 4.1-5.0·eps from fp64, memtrade's 0.9·eps).
# Not for the CNN: its batch norms amplify the shared roundings to 35-80·eps from fp64 on both
# sides, and a different GEMM rounding redraws that amplified error by up to ±60% per tensor
# (AVX2: PyTorch 4.9·eps, memtrade 11.9·eps on a 16-element bias), so which side is nearer fp64
# is chance there; rule 1 covers the CNN.
@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny", "llama-tiny:tie_word_embeddings=true",
                                   "mlp-tiny", "cnn-tiny"])
@pytest.mark.parametrize("flags", [(), ("--checkpoint", "1"), ("--accumulation", "2")])
def test_autocast_matches_pytorch_cpu_autocast(memtrade_bin, tmp_path, model, flags):
    torch.set_num_threads(1)
    out, meta = run_dump(memtrade_bin, tmp_path, "--model", model, "--batch-size", "4",
                         "--optimizer", "sgd", "--precision", "bf16", "--autocast-policy",
                         "torch-cpu", *flags)
    eps = EPS["bf16"]
    got_loss = float(np.load(out / "loss.npy"))
    got = {n: np.load(out / "grads" / f"{n}.npy").astype(np.float64) for n in meta["params"]}

    # Rule 1.
    loss, grads = bf16_twin_grads(out, meta, "fp32-accumulating")
    # Where each side rounds, exactly: a weight that autocast multiplies in bf16 gets the fp32
    # cast of a bf16 gradient (at accumulation 1), so the same tensors hold bf16 values on both.
    # (This is what tells bf16 from fp32 on the small models: an fp32 run is within 2·eps of
    # the reference too.)
    ours, theirs = bf16_valued(got), bf16_valued(grads)
    assert ours == theirs, (f"bf16-valued gradients: memtrade only {sorted(ours - theirs)}, "
                            f"PyTorch only {sorted(theirs - ours)}")
    assert abs(got_loss - loss) <= eps / 16 * abs(loss), (got_loss, loss)
    for name in meta["params"]:
        err = rel_l2(got[name], grads[name])
        assert err <= 4 * eps, (f"{name}: relative L2 error {err / eps:.2f}·eps > 4·eps against "
                                f"PyTorch's autocast with fp32-accumulating GEMMs")
    if model.startswith("cnn"):
        return

    # Rule 2.
    stock_loss, stock = bf16_twin_grads(out, meta, "stock")
    _, loss64, grads64 = torch_step(out, meta)
    assert abs(got_loss - loss64) <= 1.1 * abs(stock_loss - loss64) + eps / 16 * abs(loss64), (
        got_loss, stock_loss, loss64)
    for name in meta["params"]:
        ref = grads64[name].numpy()
        ours, theirs = rel_l2(got[name], ref), rel_l2(stock[name], ref)
        assert ours <= 1.1 * theirs + 0.5 * eps, (
            f"{name}: {ours / eps:.2f}·eps from fp64, stock PyTorch {theirs / eps:.2f}·eps "
            f"({cpu_isa.describe()})")


@pytest.mark.parametrize("optimizer", ["sgd", "sgd-momentum", "adam", "adamw", "adagrad",
                                       "rmsprop"])
def test_optimizer_step_matches_torch_optim(memtrade_bin, tmp_path, optimizer):
    out, meta = run_dump(memtrade_bin, tmp_path, "--model", "mlp-tiny", "--batch-size", "8",
                         "--optimizer", optimizer, "--precision", "fp32")
    h = meta["optimizer_hyper"]
    params = {n: t.double().clone().requires_grad_(True) for n, t in load_params(out, meta).items()}
    for n, p in params.items():
        p.grad = torch.from_numpy(np.load(out / "grads" / f"{n}.npy")).double()
    opt = torch_models.make_optimizer(h, list(params.values()))
    opt.step()
    for n, p in params.items():
        got = np.load(out / "params_after" / f"{n}.npy")
        assert_close(n, got, p.detach().numpy(), tol=1e-6, eps=1e-5)


def test_fp32_accumulating_gemms_round_once():
    """cpu_isa.fp32_accumulating_gemms: a bf16 GEMM, convolution and their backward are the fp32
    results of the bf16 operands rounded once; fp32 work and other ops pass through."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(33, 300, generator=g).bfloat16().requires_grad_(True)
    b = torch.randn(300, 17, generator=g).bfloat16().requires_grad_(True)
    x = torch.randn(2, 3, 9, 9, generator=g).bfloat16()
    w = torch.randn(4, 3, 3, 3, generator=g).bfloat16().requires_grad_(True)
    with cpu_isa.fp32_accumulating_gemms():
        c = a @ b
        y = torch.nn.functional.conv2d(x, w)
        (c.float().sum() + y.float().sum()).backward()
        f = torch.randn(5, 6, generator=g) @ torch.randn(6, 7, generator=g)
    assert c.dtype == y.dtype == torch.bfloat16 and f.dtype == torch.float32
    assert torch.equal(c, (a.detach().float() @ b.detach().float()).bfloat16())
    assert torch.equal(y, torch.nn.functional.conv2d(x.float(), w.detach().float()).bfloat16())
    ones = torch.ones(33, 17)
    assert torch.equal(a.grad, (ones @ b.detach().float().t()).bfloat16())
    assert w.grad.dtype == torch.bfloat16
