"""memtrade's Llama against its PyTorch twin (bench/peers/torch_models.py: LlamaForCausalLM
written from the architecture, HF's parameter names, no transformers), in fp32.

`memtrade step --dump` writes the batch, the parameters and the gradients of one step; the twin
loads the parameters by name (so the names and shapes are HF's), recomputes the loss and every
gradient in float64, and both must agree to 1e-5: the loss relatively, each gradient element to
1e-5 of its tensor's largest element plus 1e-5 of itself. llama-tiny has grouped-query heads
(n_kv_head 2 < n_head 4) and an untied head; the tied variant, the mini size (tied, Llama 3.2's
rope scaling), flash attention and checkpointing run through the same comparison.

The bound is fp32's (a float64 reference, nothing CPU-dependent on its side); measured, the worst
element's share of it on memtrade's AVX-512 / AVX2 / SSE2 (OpenBLAS) paths: 0.073 / 0.073 / 0.097,
the loss 0.003 on all three.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_torch_reference import (  # noqa: E402
    assert_close, assert_step_fp32, load_params, run_dump, torch_step)


@pytest.mark.parametrize("model,flags,tied", [
    ("llama-tiny", (), False),
    ("llama-tiny:tie_word_embeddings=true", (), True),
    ("llama-tiny", ("--attention", "flash"), False),
    ("llama-tiny", ("--checkpoint", "selective"), False),
    ("llama-tiny:n_kv_head=1", ("--checkpoint", "1", "--accumulation", "2"), False),
    ("llama-mini", (), True),
])
def test_loss_and_every_gradient_to_1e_5(memtrade_bin, tmp_path, model, flags, tied):
    out, meta = run_dump(memtrade_bin, tmp_path, "--model", model, "--batch-size", "4",
                         "--optimizer", "sgd", "--precision", "fp32", *flags)
    h = meta["hyper"]
    assert h["family"] == "llama"
    assert h["n_kv_head"] < h["n_head"], "grouped-query attention"
    assert h["tie_word_embeddings"] is tied
    twin, ref_loss, ref_grads = torch_step(out, meta)
    # The dump's names are the twin's (HF's) state-dict keys with their shapes; a tied head has
    # no lm_head.weight of its own.
    expected = {n: list(p.shape) for n, p in twin.named_parameters()}
    assert meta["shapes"] == expected
    assert ("lm_head.weight" in meta["params"]) == (not tied)
    assert_step_fp32(out, meta, ref_loss, ref_grads)


def test_the_comparison_can_fail(memtrade_bin, tmp_path):
    """A twin with one thing different (no rotary embeddings) is caught by the same bounds."""
    out, meta = run_dump(memtrade_bin, tmp_path, "--model", "llama-tiny", "--batch-size", "4",
                         "--optimizer", "sgd", "--precision", "fp32")
    import torch_models
    saved = torch_models.rotate_half
    torch_models.rotate_half = lambda x: torch.zeros_like(x)  # RoPE without the rotation part
    try:
        _, _, ref_grads = torch_step(out, meta)
    finally:
        torch_models.rotate_half = saved
    name = "model.layers.0.self_attn.q_proj.weight"
    with pytest.raises(AssertionError):
        ref = ref_grads[name].numpy()
        assert_close(name, np.load(out / "grads" / f"{name}.npy"), ref,
                     tol=1e-5 * float(np.abs(ref).max()), eps=1e-5)
    assert load_params(out, meta)
