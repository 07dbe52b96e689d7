"""memtrade against Hugging Face transformers' own modeling code (issue 25): the architectures
memtrade reads from a config.json, run as `modeling_*.py` of transformers 4.46.3 defines them.

HF's model class is built from the same config.json and initialised by HF (its own
_init_weights), then its biases and norm weights are drawn away from their zero and one starts so
that every term counts in forward. `memtrade step --model-config C --init DIR --dump` starts from
exactly those parameters (HF's state-dict names, strict) and writes the batch, the parameters and
the gradients of one step; HF's forward on the dumped parameters gives the logits, in float64. The loss is cross-entropy of those logits against memtrade's targets (the
next tokens; HF's own `labels` loss shifts inside the model, the same sum in another order).
Bound: fp32's, as tests/python/test_llama_twin.py (a float64 reference): the loss to 1e-5
relatively, each gradient element within 1e-5 of its tensor's largest element plus 1e-5 of
itself.

transformers comes from PyPI through ci/setup.sh (ci/requirements-hf.txt); without it (PyPI
unreachable) these tests skip and say so.
"""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip(
    "transformers", reason="transformers 4.46.3 not installed (ci/setup.sh, ci/requirements-hf.txt)")

from test_torch_reference import assert_step_fp32, load_params, run_dump  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=32, rms_norm_eps=1e-6,
            rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu",
            attention_dropout=0.0)
CASES = {
    "qwen2": dict(TINY, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                  use_sliding_window=False),
    "qwen2-tied": dict(TINY, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                       tie_word_embeddings=True, num_key_value_heads=1),
    "llama-biases": dict(TINY, architectures=["LlamaForCausalLM"], model_type="llama",
                         attention_bias=True, mlp_bias=True),
    "llama": dict(TINY, architectures=["LlamaForCausalLM"], model_type="llama"),
}


def hf_model(config):
    cls = getattr(transformers, config["architectures"][0])
    cfg = transformers.AutoConfig.for_model(config["model_type"], **{
        k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    cfg._attn_implementation = "eager"  # the math path: softmax(QKᵀ/√d)·V, as memtrade's
    return cls(cfg)


def hf_step(out, meta, config):
    model = hf_model(config).double()
    state = {k: v.double() for k, v in load_params(out, meta).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = config.get("tie_word_embeddings", False)
    assert missing == (["lm_head.weight"] if tied else []), missing
    assert not unexpected, unexpected
    inputs = torch.from_numpy(np.load(out / "inputs.npy")).long()
    targets = torch.from_numpy(np.load(out / "targets.npy")).long()
    logits = model(input_ids=inputs).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    return model, float(loss), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def hf_init(config, folder, seed=0):
    """HF's own initial parameters, biases and norm weights moved off 0 and 1, as DIR/<name>.npy
    (float32; a tied head is the embedding's and not written)."""
    torch.manual_seed(seed)
    model = hf_model(config)
    folder.mkdir()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.1)
            elif "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            np.save(folder / f"{name}.npy", p.detach().float().numpy())
    return {n: p.detach().float().numpy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_and_every_gradient_against_hf(memtrade_bin, tmp_path, case):
    config = CASES[case]
    (tmp_path / "config.json").write_text(json.dumps(config))
    init = hf_init(config, tmp_path / "init")
    out, meta = run_dump(memtrade_bin, tmp_path, "--model-config", str(tmp_path / "config.json"),
                         "--seq-len", "16", "--batch-size", "3", "--optimizer", "sgd",
                         "--precision", "fp32", "--init", str(tmp_path / "init"))
    for name in meta["params"]:  # memtrade started from HF's parameters, bit for bit
        assert np.array_equal(np.load(out / "params" / f"{name}.npy"), init[name]), name
    assert meta["hyper"]["architecture"] == config["architectures"][0]
    model, ref_loss, ref_grads = hf_step(out, meta, config)
    # The dump's names and shapes are HF's, biases included.
    assert meta["shapes"] == {n: list(p.shape) for n, p in model.named_parameters()}
    assert_step_fp32(out, meta, ref_loss, ref_grads)


def test_the_hf_comparison_can_fail(memtrade_bin, tmp_path):
    """memtrade's Llama read as a Qwen2 (HF adds q/k/v biases memtrade does not have): refused by
    the strict load, and with the biases dropped from HF, gradients elsewhere still agree while
    the bias-free model is not Qwen2's (the q/k/v biases get a gradient memtrade never makes)."""
    config = dict(CASES["llama"])
    (tmp_path / "config.json").write_text(json.dumps(config))
    out, meta = run_dump(memtrade_bin, tmp_path, "--model-config", str(tmp_path / "config.json"),
                         "--seq-len", "16", "--batch-size", "3", "--optimizer", "sgd",
                         "--precision", "fp32")
    qwen = dict(config, architectures=["Qwen2ForCausalLM"], model_type="qwen2")
    with pytest.raises(AssertionError):
        hf_step(out, meta, qwen)  # missing q/k/v biases
