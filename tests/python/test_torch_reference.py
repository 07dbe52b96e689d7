"""memtrade's step dump checked against PyTorch eager on the same parameters and batch.

For each model and knob setting, `memtrade step --dump` writes the batch, the parameters
before and after one optimizer step and the gradients; PyTorch recomputes the loss and the
gradients of the mean loss from the same parameters and batch, and takes the same optimizer
step with torch.optim. Tolerance per element: tol + |ref|·eps(dtype).
"""
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "peers"))
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
            # is as far from fp64: test_autocast_matches_pytorch_cpu_autocast), and its backward
            # subtracts means of those: measured relative errors of 3-27% per tensor at batch 4,
            # all in the right direction. Check the direction.
            cos = float(np.dot(got.ravel(), ref.ravel()) /
                        (np.linalg.norm(got) * np.linalg.norm(ref) + 1e-30))
            assert cos >= 0.95, f"{name}: cosine {cos:.4f} with the fp64 reference"
        else:
            assert_close(name, got, ref, tol=0.05 * scale, eps=0.1)


def rel_l2(got, ref):
    return float(np.linalg.norm(got - ref) / (np.linalg.norm(ref) + 1e-30))


# memtrade's bf16 autocast with the torch-cpu policy against PyTorch's own CPU autocast (torch
# 1.13, bf16) on the same fp32 parameters and batch: the same ops run in bf16, the same tensors
# are rounded. Where they still differ is where an fp32-level difference (GEMM summation order,
# oneDNN's bf16 kernels against OpenBLAS on rounded operands, the 1/√hd scale applied inside
# memtrade's QKᵀ GEMM and after PyTorch's bf16 one) flips one bf16 rounding: an error of about
# eps on that element, independent from element to element, so a tensor's relative L2 error
# stays a small multiple of eps = 2^-8. Bound: 4·eps per gradient tensor (measured at batch 4:
# gpt 1.8·eps, mlp 1.6·eps), 8·eps for the CNN, whose batch-norm backward subtracts means of bf16
# values and amplifies those flips (measured 3.4·eps; fp64 is 70·eps away from either). The loss
# is a mean over rows of fp32 log-softmaxes of bf16 logits whose flips average out: eps/16
# relative (measured < 2^-16).
@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny", "llama-tiny:tie_word_embeddings=true",
                                   "mlp-tiny", "cnn-tiny"])
@pytest.mark.parametrize("flags", [(), ("--checkpoint", "1"), ("--accumulation", "2")])
def test_autocast_matches_pytorch_cpu_autocast(memtrade_bin, tmp_path, model, flags):
    torch.set_num_threads(1)
    out, meta = run_dump(memtrade_bin, tmp_path, "--model", model, "--batch-size", "4",
                         "--optimizer", "sgd", "--precision", "bf16", "--autocast-policy",
                         "torch-cpu", *flags)
    twin = torch_models.build(meta["hyper"]["family"], meta["hyper"])
    missing, unexpected = twin.load_state_dict(load_params(out, meta), strict=False)
    assert not unexpected, unexpected
    twin.train()
    inputs = torch.from_numpy(np.load(out / "inputs.npy"))
    inputs = inputs.long() if inputs.dtype == torch.int32 else inputs.float()
    targets = torch.from_numpy(np.load(out / "targets.npy")).long()
    k = meta["config"]["accumulation"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = sum(twin(x, y) for x, y in zip(inputs.chunk(k), targets.chunk(k))) / k
    loss.backward()
    eps = EPS["bf16"]
    got_loss = float(np.load(out / "loss.npy"))
    assert abs(got_loss - float(loss)) <= eps / 16 * abs(float(loss)), (got_loss, float(loss))
    bound = (8 if model.startswith("cnn") else 4) * eps
    grads = dict(twin.named_parameters())
    for name in meta["params"]:
        got = np.load(out / "grads" / f"{name}.npy").astype(np.float64)
        ref = grads[name].grad.double().numpy()
        err = rel_l2(got, ref)
        assert err <= bound, f"{name}: relative L2 error {err / eps:.2f}·eps > {bound / eps}·eps"


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
