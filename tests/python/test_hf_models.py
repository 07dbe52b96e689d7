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
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip(
    "transformers", reason="transformers 4.46.3 not installed (ci/setup.sh, ci/requirements-hf.txt)")

from test_torch_reference import (EPS, assert_step_fp32, bf16_valued, load_params,  # noqa: E402
                                  rel_l2, run_dump)
import cpu_isa  # noqa: E402  (bench/peers, on sys.path through test_torch_reference)

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
    # A window as long as the sequences (16) bands nothing: HF's eager mask is then the causal one.
    "mistral": dict(TINY, architectures=["MistralForCausalLM"], model_type="mistral",
                    sliding_window=16),
    # head_dim other than hidden_size / heads: the projections are NH·head_dim wide.
    "mistral-head-dim": dict(TINY, architectures=["MistralForCausalLM"], model_type="mistral",
                             sliding_window=None, head_dim=32),
    # pad_token_id None: HF's embedding would give the padding row no gradient (Phi3Config's
    # default 32000 is beyond this vocabulary anyway); memtrade does not model padding_idx.
    # Qwen3 (an own twin: 4.46.3 has no Qwen3, see Qwen3Twin); head_dim other than C / NH.
    "qwen3": dict(TINY, architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=32,
                  use_sliding_window=False),
    "qwen3-bias-tied": dict(TINY, architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                            head_dim=16, attention_bias=True, tie_word_embeddings=True),
    "phi3-mha": dict(TINY, architectures=["Phi3ForCausalLM"], model_type="phi3",
                     num_key_value_heads=4, pad_token_id=None),
    "phi3": dict(TINY, architectures=["Phi3ForCausalLM"], model_type="phi3", sliding_window=31,
                 pad_token_id=None, resid_pdrop=0.0, embd_pdrop=0.0),
    # Gemma 2: head_dim other than C / NH and a query_pre_attn_scalar other than head_dim (the
    # scale is not 1/√hd); initializer_range 0.2 makes the scores (~3) and the logits (~2) large
    # enough that soft-caps of 5 and 3 bend them (at HF's 0.02 tanh would be the identity to
    # fp32's precision); the window (on layer 0) as long as the sequences; tied, as Gemma's.
    "gemma2": dict(TINY, architectures=["Gemma2ForCausalLM"], model_type="gemma2", head_dim=32,
                   query_pre_attn_scalar=24, attn_logit_softcapping=5.0,
                   final_logit_softcapping=3.0, sliding_window=16, tie_word_embeddings=True,
                   hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
                   initializer_range=0.2, pad_token_id=None),
}


class Qwen3Twin(torch.nn.Module):
    """Qwen3ForCausalLM as transformers 4.51.0's models/qwen3/modeling_qwen3.py defines it, which
    4.46.3 (the last release on torch 1.13) lacks: an own twin, built from 4.46.3's Llama parts
    (LlamaRMSNorm, LlamaMLP, LlamaRotaryEmbedding, apply_rotary_pos_emb, repeat_kv) that
    modeling_qwen3.py's classes are copies of, plus what Qwen3Attention adds: q_norm and k_norm,
    RMSNorms over head_dim applied to each head of q_proj(x) and k_proj(x) before the rotation.
    HF's parameter names; eager attention (softmax in fp32, as LlamaAttention's)."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.llama import modeling_llama as L
        nn = torch.nn
        c = transformers.LlamaConfig(**{k: v for k, v in config.items() if k not in (
            "architectures", "model_type", "use_sliding_window", "head_dim")})
        c.head_dim = config.get("head_dim", 128)
        self.c, self.L = c, L
        C, V, hd = c.hidden_size, c.vocab_size, c.head_dim
        NH, NKV, bias = c.num_attention_heads, c.num_key_value_heads, c.attention_bias

        def layer():
            m = nn.Module()
            m.self_attn = nn.Module()
            a = m.self_attn
            a.q_proj = nn.Linear(C, NH * hd, bias=bias)
            a.k_proj = nn.Linear(C, NKV * hd, bias=bias)
            a.v_proj = nn.Linear(C, NKV * hd, bias=bias)
            a.o_proj = nn.Linear(NH * hd, C, bias=bias)
            a.q_norm = L.LlamaRMSNorm(hd, eps=c.rms_norm_eps)
            a.k_norm = L.LlamaRMSNorm(hd, eps=c.rms_norm_eps)
            m.mlp = L.LlamaMLP(c)
            m.input_layernorm = L.LlamaRMSNorm(C, eps=c.rms_norm_eps)
            m.post_attention_layernorm = L.LlamaRMSNorm(C, eps=c.rms_norm_eps)
            return m

        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(V, C)
        self.model.layers = nn.ModuleList(layer() for _ in range(c.num_hidden_layers))
        self.model.norm = L.LlamaRMSNorm(C, eps=c.rms_norm_eps)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.rotary_emb = L.LlamaRotaryEmbedding(config=c)
        for m in self.modules():  # _init_weights: normal(0, initializer_range), biases 0
            if isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.data.normal_(0.0, c.initializer_range)
            if isinstance(m, nn.Linear) and m.bias is not None:
                m.bias.data.zero_()
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def attention(self, a, x, cos, sin):
        B, T, _ = x.shape
        hd, L = self.c.head_dim, self.L
        q = a.q_norm(a.q_proj(x).view(B, T, -1, hd)).transpose(1, 2)
        k = a.k_norm(a.k_proj(x).view(B, T, -1, hd)).transpose(1, 2)
        v = a.v_proj(x).view(B, T, -1, hd).transpose(1, 2)
        q, k = L.apply_rotary_pos_emb(q, k, cos, sin)
        groups = q.shape[1] // k.shape[1]
        k, v = L.repeat_kv(k, groups), L.repeat_kv(v, groups)
        w = torch.matmul(q, k.transpose(2, 3)) / hd**0.5
        mask = torch.full((T, T), torch.finfo(w.dtype).min, dtype=w.dtype).triu(1)
        w = torch.softmax(w + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        return a.o_proj(torch.matmul(w, v).transpose(1, 2).reshape(B, T, -1))

    def forward(self, input_ids):
        x = self.model.embed_tokens(input_ids)
        positions = torch.arange(input_ids.shape[1])[None]
        cos, sin = self.rotary_emb(x, positions)
        for m in self.model.layers:
            x = x + self.attention(m.self_attn, m.input_layernorm(x), cos, sin)
            x = x + m.mlp(m.post_attention_layernorm(x))
        return type("Out", (), {"logits": self.lm_head(self.model.norm(x))})


def hf_model(config):
    if config["architectures"][0] == "Qwen3ForCausalLM":
        return Qwen3Twin(config)
    cls = getattr(transformers, config["architectures"][0])
    cfg = transformers.AutoConfig.for_model(config["model_type"], **{
        k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    cfg._attn_implementation = "eager"  # the math path: softmax(QKᵀ/√d)·V, as memtrade's
    return cls(cfg)


def lm_loss(model, inputs, targets):
    """Cross-entropy of the model's logits against the next tokens, as memtrade's twin takes it."""
    logits = model(input_ids=inputs).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1))


def hf_step(out, meta, config):
    model = hf_model(config).double()
    state = {k: v.double() for k, v in load_params(out, meta).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = config.get("tie_word_embeddings", False)
    assert missing == (["lm_head.weight"] if tied else []), missing
    assert not unexpected, unexpected
    inputs = torch.from_numpy(np.load(out / "inputs.npy")).long()
    targets = torch.from_numpy(np.load(out / "targets.npy")).long()
    loss = lm_loss(model, inputs, targets)
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
    worst = max(float(np.abs(np.load(out / "grads" / f"{n}.npy") - ref_grads[n].numpy()).max() /
                      (float(np.abs(ref_grads[n].numpy()).max()) or 1.0)) for n in meta["params"])
    print(f"{case}: worst gradient error {worst:.2e} of its tensor's largest element, "
          f"{len(meta['params'])} tensors")


def hf_autocast_step(out, meta, config):
    """HF's model on the dump's fp32 parameters and batch under PyTorch's CPU autocast (bf16) with
    fp32-accumulating GEMMs (cpu_isa: the same on every CPU), the loss as memtrade's twin takes it
    (cross-entropy of the logits inside the autocast region): (loss, {name: grad})."""
    model = hf_model(config)
    model.load_state_dict(load_params(out, meta), strict=False)
    model.train()
    inputs = torch.from_numpy(np.load(out / "inputs.npy")).long()
    targets = torch.from_numpy(np.load(out / "targets.npy")).long()
    outputs = {}  # bias name -> the linear's output, whose gradient's rows the bias sums

    def keep(name):
        def hook(module, inp, out):
            out.retain_grad()
            outputs[name + ".bias"] = out
        return hook

    hooks = [m.register_forward_hook(keep(n)) for n, m in model.named_modules()
             if isinstance(m, torch.nn.Linear) and m.bias is not None]
    with cpu_isa.torch_lowp(), cpu_isa.fp32_accumulating_gemms():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = lm_loss(model, inputs, targets)
        loss.backward()
    for h in hooks:
        h.remove()
    # A bias gradient is a sum over the B·T rows of its output's gradient, and those cancel
    # (softmax is shift-invariant, so the q/k biases' sums are small against their terms): its
    # rounding error scales with Σ|terms|, not with the sum. cond = ‖Σ|g|‖ / ‖Σg‖ per bias.
    cond = {}
    for name, out in outputs.items():
        g = out.grad.double().reshape(-1, out.shape[-1])
        cond[name] = float(g.abs().sum(0).norm() / (g.sum(0).norm() + 1e-300))
    return float(loss), {n: p.grad.double().numpy() for n, p in model.named_parameters()}, cond


# bf16 autocast (memtrade's torch-cpu policy) against HF's code under PyTorch's CPU autocast with
# fp32-accumulating GEMMs: the portable rule of tests/python/test_torch_reference.py
# (test_autocast_matches_pytorch_cpu_autocast, rule 1): the same gradient tensors hold bf16
# values on both sides, the loss within eps/16 relatively, each gradient tensor within 4·eps
# relative L2 (a bias: 4·eps times the condition of its sum over rows, see hf_autocast_step).
# With q/k biases (Llama's attention_bias, Qwen3's) the point is ill-conditioned: the k bias is
# common to every key, so any row sum of dS that is not zero reaches dq multiplied by it, and the
# rule's independent-flips premise fails (the two bf16 runs land 4-7·eps apart while both are
# 4-12·eps from fp64). Those cases take the fp64 rule below (FP64_RULE). It found a real
# difference first: memtrade's softmax backward read the probabilities rounded to bf16 where HF's
# softmax(..., dtype=torch.float32) backward reads its fp32 output, and memtrade was 17.75·eps
# from fp64 on llama-biases' q_proj.weight against HF's 11.66 (qwen3-bias-tied's q_proj: 7.11
# against 4.40), failing it. Since both backends keep fp32 probabilities for HF's families and
# their softmax backward reads them (kernels/ops.h attention_backward's probs), memtrade's largest
# distance is 10.00·eps against HF's 12.00 (qwen3-bias-tied: 3.47 against 4.80; AMD EPYC Zen 4).


@pytest.mark.parametrize("case", sorted(CASES))
def test_bf16_autocast_against_hf(memtrade_bin, tmp_path, case):
    torch.set_num_threads(1)
    config = CASES[case]
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf_init(config, tmp_path / "init")
    out, meta = run_dump(memtrade_bin, tmp_path, "--model-config", str(tmp_path / "config.json"),
                         "--seq-len", "16", "--batch-size", "3", "--optimizer", "sgd",
                         "--precision", "bf16", "--autocast-policy", "torch-cpu",
                         "--init", str(tmp_path / "init"))
    eps = EPS["bf16"]
    loss, grads, cond = hf_autocast_step(out, meta, config)
    got_loss = float(np.load(out / "loss.npy"))
    got = {n: np.load(out / "grads" / f"{n}.npy").astype(np.float64) for n in meta["params"]}
    ours, theirs = bf16_valued(got), bf16_valued(grads)
    assert ours == theirs, (f"bf16-valued gradients: memtrade only {sorted(ours - theirs)}, "
                            f"HF only {sorted(theirs - ours)}")
    if case in FP64_RULE:
        return assert_as_close_to_fp64_as_hf(out, meta, config, case, got_loss, got, loss, grads)
    assert abs(got_loss - loss) <= eps / 16 * abs(loss), (got_loss, loss)
    # Each tensor within 4·eps relative L2, a bias within 4·eps times its sum's condition.
    worst = max((rel_l2(got[n], grads[n]) / eps / max(1.0, cond.get(n, 1.0)), n)
                for n in meta["params"])
    print(f"{case}: worst gradient {worst[1]} {worst[0]:.2f}·eps (÷ its condition "
          f"{max(1.0, cond.get(worst[1], 1.0)):.1f}), {len(meta['params'])} tensors")
    assert worst[0] <= 4, f"{worst[1]}: relative L2 error {worst[0]:.2f}·eps·cond > 4·eps·cond"


# The cases held to issue 23's portable rule instead (fp64_twin_rule below, against an fp64 twin:
# HF's model in float64 on the same parameters and batch, hf_step): memtrade's distance from fp64
# at most HF's bf16 autocast distance from it times (1 + FP64_MARGIN), plus a floor of
# FP64_FLOOR_EPS·eps (one bf16 rounding of every element, in relative L2), for the loss and each
# gradient tensor. Gemma 2 does not meet
# the 4·eps rule above: its soft-caps, (1 + w) norms and four norms per layer round at other
# places than HF's, so the two bf16 runs differ by more than their own errors' 4·eps while
# neither is closer to fp64 (an earlier run: memtrade 5.4 and 9.2·eps from fp64 where HF was 6.8
# and 8.1·eps, 5.5 and 11.3·eps apart). The q/k-bias cases are ill-conditioned (above). This run's
# figures are printed.
FP64_RULE = {"gemma2", "llama-biases", "qwen3-bias-tied"}
FP64_MARGIN = 0.25
FP64_FLOOR_EPS = 1.0


def assert_as_close_to_fp64_as_hf(out, meta, config, case, got_loss, got, hf_loss, hf_grads):
    eps = EPS["bf16"]
    _, loss64, grads64 = hf_step(out, meta, config)
    ref = {n: g.numpy() for n, g in grads64.items()}
    ours_loss, hf_loss_d = abs(got_loss - loss64) / abs(loss64), abs(hf_loss - loss64) / abs(loss64)
    assert ours_loss <= hf_loss_d * (1 + FP64_MARGIN) + FP64_FLOOR_EPS * eps / 16, (
        f"loss {ours_loss / eps:.3f}·eps from fp64, HF {hf_loss_d / eps:.3f}·eps")
    rows = sorted(((*fp64_twin_rule(got[n], hf_grads[n], ref[n], eps, FP64_MARGIN,
                                    FP64_FLOOR_EPS), n) for n in meta["params"]),
                  key=lambda r: r[0] - r[1] * (1 + FP64_MARGIN))
    ours, theirs, _, name = rows[-1]
    print(f"{case}: loss {ours_loss / eps:.3f}·eps from fp64 (HF {hf_loss_d / eps:.3f}·eps); "
          f"worst gradient {name} {ours:.2f}·eps from fp64 (HF {theirs:.2f}·eps), largest "
          f"{max(r[0] for r in rows):.2f}·eps (HF {max(r[1] for r in rows):.2f}·eps), "
          f"{len(rows)} tensors")
    bad = [r for r in rows if not r[2]]
    assert not bad, [f"{n}: {o:.2f}·eps vs HF {t:.2f}·eps" for o, t, _, n in bad]


def hf_saved_bytes(out, meta, config, loss_of=lm_loss, strict=False):
    """What HF's eager model keeps for backward in fp32 (bench/peers/torch_saved.py's method (a):
    every storage autograd saves, parameters aside, the batch included), on the dump's
    parameters and batch; loss_of(model, inputs, targets) is the forward (strict: every state-dict
    key dumped, no tied head)."""
    import torch_saved
    model = hf_model(config)
    model.load_state_dict(load_params(out, meta), strict=strict)
    model.train()
    inputs = torch.from_numpy(np.load(out / "inputs.npy")).long()
    targets = torch.from_numpy(np.load(out / "targets.npy")).long()
    rec = torch_saved.SavedRecorder(model, [inputs, targets])
    try:
        with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda p: p):
            loss = loss_of(model, inputs, targets)
        loss.backward()
    finally:
        rec.close()
    return rec.bytes_of("activation", "input")


def eager_extra(hyper, batch):
    """Bytes HF's eager decoder keeps that memtrade's fused kernels do not (fp32), per
    sequences of hyper["seq_len"] tokens: the Llama formula of bench/peers/saved_bytes.py
    (llama_eager_extra: per layer each RMSNorm's two (T, C) extras, repeat_kv's expanded K and V,
    SwiGLU's silu(gate); the final norm's), plus
      - the rotary tables cos and sin, (1, T, head_dim) each, which the rotation's multiplies
        save once per forward (memtrade's RoPE op computes its angles);
      - Qwen3: q_norm's and k_norm's two extras per element, as every RMSNorm's
        (2·(NH + NKV)·head_dim per token per layer);
      - Gemma 2 (modeling_gemma2.py): GeGLU's gelu(gate) as SwiGLU's silu(gate); its two more
        norms per layer with two (T, C) extras each, every Gemma2RMSNorm's (1 + w) (C), computed
        on each call and saved by the multiply, the embedding's normalizer (a 0-dim tensor), the
        rotary tables of every layer (Gemma2Attention owns its rotary_emb), and the 0-dim
        float64 tensors of the scale and the caps that the multiplies and divisions save.
        The soft-caps' tanh outputs are saved on both sides (memtrade's attn.tanh and
        softcap.out)."""
    import saved_bytes
    T, hd, L = hyper["seq_len"], hyper["head_dim"], hyper["n_layer"]
    plan = {"selective": False, "segments": [[0, L, False]]}
    extra = saved_bytes.llama_eager_extra(hyper, batch, plan, "none")
    extra += 4 * 2 * T * hd
    if hyper.get("qk_norm"):
        extra += 4 * batch * T * L * 2 * (hyper["n_head"] + hyper["n_kv_head"]) * hd
    if hyper.get("gemma_norms"):
        C = hyper["n_embd"]
        extra += 4 * batch * T * L * 2 * 2 * C  # the two more norms per layer, as every norm's
        extra += 4 * (4 * L + 1) * C  # each norm's (1 + w) (C), made per call, saved by the mul
    if hyper.get("architecture") == "Gemma2ForCausalLM":
        extra += 4 * 2 * T * hd * (L - 1)  # each Gemma2Attention's own rotary tables
    return extra + hf_eager_rest(hyper)


def saved_at_end_of_forward(memtrade_bin, tmp_path, case, *memtrade_flags):
    """(memtrade's activations at the end of forward (its trace), what HF's eager model keeps
    (saved-tensor hooks), memtrade's step meta) for CASES[case], fp32, batch 3 × 16 tokens."""
    import memtrade_side
    torch.set_num_threads(1)
    config = CASES[case]
    (tmp_path / "config.json").write_text(json.dumps(config))
    flags = ["--backend", "cpu", "--model-config", str(tmp_path / "config.json"), "--seq-len",
             "16", "--batch-size", "3", "--precision", "fp32", "--optimizer", "sgd"]
    out, meta = run_dump(memtrade_bin, tmp_path, *flags[2:])
    trace = memtrade_side.read_trace(memtrade_side.make_trace(
        memtrade_bin, tmp_path / "run", flags + list(memtrade_flags)))
    ours = memtrade_side.live_at_end_of_forward(trace)["requested"]
    return ours, hf_saved_bytes(out, meta, config), meta



@pytest.mark.parametrize("case", sorted(CASES))
def test_saved_bytes_against_hf_eager(memtrade_bin, tmp_path, case):
    """memtrade's activations at the end of forward (its trace) against what HF's eager model
    keeps (saved-tensor hooks), fp32: the gap is the fused kernels' (eager_extra), to 1%."""
    ours, theirs, meta = saved_at_end_of_forward(memtrade_bin, tmp_path, case)
    extra = eager_extra(meta["hyper"], 3)
    print(f"{case}: HF eager keeps {theirs:,} B, memtrade {ours:,} B, gap {ours - theirs:+,} B, "
          f"formula {-extra:+,} B")
    assert extra > 0.2 * theirs  # the difference is real and large
    assert abs(ours - theirs + extra) <= 0.01 * theirs, (ours, theirs, extra)


def hf_eager_rest(hyper):
    """What HF's eager decoder keeps that --llama-layers hf-eager does not, the batch's ends
    aside: Gemma 2's embedding normalizer (a 0-dim fp32 tensor the embedding's multiply saves)
    and the Python floats of `* scaling`, `/ cap` and `* cap`, 0-dim float64 tensors the
    multiplies and divisions save, per attention layer and at the logits (eager_extra's too)."""
    extra = 4 if hyper.get("embed_scale") else 0
    if hyper.get("architecture") == "Gemma2ForCausalLM":
        L = hyper["n_layer"]
        extra += 8 * (L * (1 + 2 * (hyper["attn_softcap"] > 0)) + 2 * (hyper["final_softcap"] > 0))
    return extra


@pytest.mark.parametrize("case", sorted(CASES))
def test_saved_bytes_with_hf_eager_layers(memtrade_bin, tmp_path, case):
    """With --llama-layers hf-eager memtrade keeps what HF's eager model keeps (saved-tensor hooks,
    fp32), the batch's ends and Gemma 2's scalars aside."""
    ours, theirs, meta = saved_at_end_of_forward(memtrade_bin, tmp_path, case,
                                                 "--llama-layers", "hf-eager")
    rest = hf_eager_rest(meta["hyper"])
    # And the batch's ends: HF keeps int64 token ids and targets (8 B a token each) where memtrade
    # keeps int32 ones and a per-token fp32 loss (4 B each): 4 B a token more; plus the loss's
    # 0-dim tensors (cross_entropy's total_weight and the mean's, 20 B measured): up to 64 B.
    tokens = 3 * 16
    print(f"{case}: HF eager keeps {theirs:,} B, memtrade hf-eager {ours:,} B, gap "
          f"{ours - theirs:+,} B, Gemma 2's scalars {-rest:+,} B, the rest {ours - theirs + rest:+,} B")
    assert 4 * tokens <= theirs - ours - rest <= 4 * tokens + 64, (ours, theirs, rest)


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


@pytest.mark.parametrize("case", ["mistral", "gemma2"])
def test_a_window_shorter_than_the_sequence_is_refused(memtrade_bin, tmp_path, case):
    """HF's Mistral bands its mask to the last sliding_window keys (Gemma 2 on its even layers);
    memtrade has no banded mask yet, so a window that would cut (shorter than --seq-len) is one
    line and exit 2, naming it."""
    import subprocess
    config = dict(CASES[case], sliding_window=8)
    (tmp_path / "config.json").write_text(json.dumps(config))
    run = subprocess.run([memtrade_bin, "step", "--backend", "cpu", "--model-config",
                          str(tmp_path / "config.json"), "--seq-len", "16", "--batch-size", "1"],
                         capture_output=True, text=True)
    assert run.returncode == 2, run
    assert "sliding_window 8 is shorter than seq_len 16" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr


# ---- Mixture of experts: MixtralForCausalLM and Qwen2MoeForCausalLM (issue 25) ----------------
# transformers 4.46.3's models/mixtral/modeling_mixtral.py and models/qwen2_moe/
# modeling_qwen2_moe.py: top-k softmax routing, dropless SwiGLU experts, Qwen2-MoE's shared expert
# behind its sigmoid gate and its dense layers (decoder_sparse_step, mlp_only_layers). With
# output_router_logits the loss is HF's: cross-entropy + router_aux_loss_coef ·
# load_balancing_loss_func over every MoE layer's router logits (MixtralForCausalLM.forward).
MOE_TINY = dict(TINY, router_aux_loss_coef=0.05)
MOE_CASES = {
    "mixtral": dict(MOE_TINY, architectures=["MixtralForCausalLM"], model_type="mixtral",
                    num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
                    router_jitter_noise=0.0, output_router_logits=True),
    # (Not top-1: Mixtral renormalises the one weight to 1, and the router gets no gradient.)
    "mixtral-no-aux": dict(MOE_TINY, architectures=["MixtralForCausalLM"], model_type="mixtral",
                           num_local_experts=3, num_experts_per_tok=2, sliding_window=None,
                           output_router_logits=False),
    "qwen2-moe": dict(MOE_TINY, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe",
                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48, norm_topk_prob=False,
                      use_sliding_window=False, output_router_logits=True),
    # Sixteen experts, top-1, 32 tokens: some experts idle (HF: zero gradients, an empty GEMM).
    "qwen2-moe-idle-experts": dict(MOE_TINY, architectures=["Qwen2MoeForCausalLM"],
                                   model_type="qwen2_moe", num_experts=16, num_experts_per_tok=1,
                                   moe_intermediate_size=16, shared_expert_intermediate_size=32,
                                   norm_topk_prob=False, use_sliding_window=False,
                                   output_router_logits=True),
    # Four layers: decoder_sparse_step 2 makes layers 1 and 3 sparse, mlp_only_layers [3] leaves
    # layer 1 the only MoE one; the dense ones are Qwen2MoeMLP(intermediate_size).
    "qwen2-moe-sparse-step": dict(MOE_TINY, architectures=["Qwen2MoeForCausalLM"],
                                  model_type="qwen2_moe", num_hidden_layers=4, num_experts=4,
                                  num_experts_per_tok=3, moe_intermediate_size=32,
                                  shared_expert_intermediate_size=40, norm_topk_prob=True,
                                  decoder_sparse_step=2, mlp_only_layers=[3],
                                  use_sliding_window=False, output_router_logits=True),
}


ROUTERS = ("mlp.gate.weight", "block_sparse_moe.gate.weight")


def moe_init(config, folder, seed):
    """hf_init, and the routers' weights scaled up (× 20) so that the softmax is far from uniform
    and the top-k choice has margins (moe_routing_margin)."""
    init = hf_init(config, folder, seed)
    for name, w in init.items():
        if name.endswith(ROUTERS):
            w *= 20.0
            np.save(folder / f"{name}.npy", w)
    return init


def moe_forward(model, config, inputs, targets):
    """HF's loss as MixtralForCausalLM.forward / Qwen2MoeForCausalLM.forward make it from labels:
    cross-entropy (here of memtrade's next-token targets) + router_aux_loss_coef · aux_loss when
    output_router_logits (the config's; HF computes the load-balancing loss only then)."""
    outputs = model(input_ids=inputs,
                    output_router_logits=config.get("output_router_logits", False))
    logits = outputs.logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1))
    if config.get("output_router_logits"):
        loss = loss + config["router_aux_loss_coef"] * outputs.aux_loss
    return loss


def moe_hf_step(out, meta, config, dtype=torch.float64, autocast=False):
    """HF's step on the dump's parameters and batch: (loss, {name: grad})."""
    model = hf_model(config)
    model.load_state_dict(load_params(out, meta), strict=True)
    model = model.to(dtype)
    model.train()
    inputs = torch.from_numpy(np.load(out / "inputs.npy")).long()
    targets = torch.from_numpy(np.load(out / "targets.npy")).long()
    if autocast:
        with cpu_isa.torch_lowp(), cpu_isa.fp32_accumulating_gemms():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = moe_forward(model, config, inputs, targets)
            loss.backward()
    else:
        loss = moe_forward(model, config, inputs, targets)
        loss.backward()
    return float(loss), {n: p.grad.double().numpy() for n, p in model.named_parameters()}


def moe_routing_margin(router, k):
    """The smallest gap, over tokens and MoE layers, between the k-th and the (k+1)-th largest
    router logit (softmax is monotone: the top-k choice flips only where rounding closes it),
    relative to the largest |logit| (what a logit's rounding error scales with)."""
    gaps = []
    for logits in router:
        z = logits.double().sort(dim=-1, descending=True).values
        if z.shape[-1] > k:
            gaps.append(float((z[:, k - 1] - z[:, k]).min() / z.abs().max()))
    return min(gaps) if gaps else 1.0


def moe_dump(memtrade_bin, tmp_path, config, precision, margin):
    """memtrade's step from HF's initial parameters, the first init seed whose routing of the
    batch keeps every token's k-th and (k+1)-th logits `margin` apart relative to the largest
    (HF in fp64): a top-k choice that rounding cannot flip, on either side, on any CPU."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    shape = ["--model-config", str(tmp_path / "config.json"), "--seq-len", "16", "--batch-size",
             "2", "--optimizer", "sgd"]
    (tmp_path / "probe").mkdir()
    probe, _ = run_dump(memtrade_bin, tmp_path / "probe", *shape)  # the batch (data only)
    inputs = torch.from_numpy(np.load(probe / "inputs.npy")).long()
    for seed in range(200):
        folder = tmp_path / f"init{seed}"
        init = moe_init(config, folder, seed)
        model = hf_model(config)
        model.load_state_dict({n: torch.from_numpy(v) for n, v in init.items()}, strict=True)
        with torch.no_grad():
            router = model.double()(input_ids=inputs, output_router_logits=True).router_logits
        if moe_routing_margin(router, config["num_experts_per_tok"]) > margin:
            break
    else:
        pytest.fail(f"no init seed in 200 routes with a margin of {margin}")
    flags = ["--precision", precision] + (
        ["--autocast-policy", "torch-cpu"] if precision == "bf16" else [])
    out, meta = run_dump(memtrade_bin, tmp_path, *shape, "--init", str(folder), *flags)
    return init, out, meta


@pytest.mark.parametrize("case", sorted(MOE_CASES))
def test_moe_loss_and_every_gradient_against_hf(memtrade_bin, tmp_path, case):
    config = MOE_CASES[case]
    init, out, meta = moe_dump(memtrade_bin, tmp_path, config, "fp32", 1e-4)
    for name in meta["params"]:  # memtrade started from HF's parameters, bit for bit
        assert np.array_equal(np.load(out / "params" / f"{name}.npy"), init[name]), name
    assert meta["hyper"]["architecture"] == config["architectures"][0]
    ref_loss, ref_grads = moe_hf_step(out, meta, config)
    assert meta["shapes"] == {n: list(g.shape) for n, g in ref_grads.items()}
    assert_step_fp32(out, meta, ref_loss, {n: torch.from_numpy(g) for n, g in ref_grads.items()})
    worst = max(float(np.abs(np.load(out / "grads" / f"{n}.npy") - ref_grads[n]).max() /
                      (float(np.abs(ref_grads[n]).max()) or 1.0)) for n in meta["params"])
    idle = sum(1 for n in meta["params"] if ".experts." in n
               and n.endswith(("down_proj.weight", "w2.weight")) and not ref_grads[n].any())
    assert (idle > 0) == ("idle" in case), idle  # the idle case has idle experts (zero grads)
    print(f"{case}: loss {ref_loss:.6f}, worst gradient error {worst:.2e} of its tensor's largest "
          f"element, {len(meta['params'])} tensors, {idle} idle experts")


def fp64_twin_rule(got, hf, ref, eps, margin=0.5, floor=1.0):
    """Issue 23's portable rule for a gradient where the 4·eps rule does not hold: memtrade's
    relative L2 distance from an fp64 run of HF's code on the same weights and batch is at most
    HF's own bf16 distance × (1 + margin) + floor·eps. Returns (ours, HF's) in eps."""
    ours, theirs = rel_l2(got, ref) / eps, rel_l2(hf, ref) / eps
    return ours, theirs, ours <= theirs * (1 + margin) + floor


# bf16 autocast (torch-cpu policy): HF's code under PyTorch's CPU autocast with fp32-accumulating
# GEMMs, and the same code in fp64 on the same weights and batch. The router's gradient goes
# through softmax, top-k renormalisation and the load-balancing loss, whose terms cancel; its
# bf16 error is not 4·eps of itself on either side, so every tensor takes fp64_twin_rule
# (margin 0.5, floor eps): memtrade no farther from fp64 than HF's bf16 run, and the loss within
# eps/16 of HF's.
@pytest.mark.parametrize("case", sorted(MOE_CASES))
def test_moe_bf16_autocast_against_hf(memtrade_bin, tmp_path, case):
    torch.set_num_threads(1)
    config = MOE_CASES[case]
    eps = EPS["bf16"]
    _, out, meta = moe_dump(memtrade_bin, tmp_path, config, "bf16", 4 * eps)
    loss, grads = moe_hf_step(out, meta, config, torch.float32, autocast=True)
    _, ref = moe_hf_step(out, meta, config)
    got_loss = float(np.load(out / "loss.npy"))
    assert abs(got_loss - loss) <= eps / 16 * abs(loss), (got_loss, loss)
    # An expert's gradient sums over its n_e tokens only (one, in a small batch): its rounding is
    # one draw, not an average, on both sides; the experts of a layer are taken together, per
    # projection (the grouped GEMM over all N·k routed tokens).
    groups = {}
    for n in meta["params"]:
        groups.setdefault(re.sub(r"\.experts\.\d+\.", ".experts.*.", n), []).append(n)
    rows = []
    for g, names in groups.items():
        got = np.concatenate([np.load(out / "grads" / f"{n}.npy").astype(np.float64).ravel()
                              for n in names])
        hf = np.concatenate([grads[n].ravel() for n in names])
        fp64 = np.concatenate([ref[n].ravel() for n in names])
        rows.append((*fp64_twin_rule(got, hf, fp64, eps), g))
    bad = [r for r in rows if not r[2]]
    worst = max(rows, key=lambda r: r[0] - r[1])
    print(f"{case}: {len(meta['params'])} tensors in {len(rows)} groups; largest excess over HF: "
          f"{worst[3]} memtrade "
          f"{worst[0]:.2f}·eps, HF {worst[1]:.2f}·eps from fp64; worst memtrade "
          f"{max(r[0] for r in rows):.2f}·eps")
    assert not bad, [(n, f"{a:.2f}·eps", f"HF {b:.2f}·eps") for a, b, _, n in bad]


@pytest.mark.parametrize("change,flags,named", [
    ({"router_jitter_noise": 0.01}, [], "router_jitter_noise"),
    ({}, ["--tp", "2"], "tensor parallelism with mixture-of-experts (num_experts 4)")])
def test_moe_what_is_not_modelled_is_refused(memtrade_bin, tmp_path, change, flags, named):
    """router_jitter_noise > 0 changes training (uniform noise on the router's input), and
    splitting the experts over tensor-parallel ranks is not modelled: one line, exit 2, naming
    the key."""
    import subprocess
    config = dict(MOE_CASES["mixtral"], **change)
    (tmp_path / "config.json").write_text(json.dumps(config))
    run = subprocess.run([memtrade_bin, "estimate", "--backend", "cpu", "--model-config",
                          str(tmp_path / "config.json"), "--seq-len", "16", "--batch-size", "2",
                          *flags], capture_output=True, text=True)
    assert run.returncode == 2, run
    assert named in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr


def moe_eager_extra(hyper, batch):
    """eager_extra for the MoE families (fp32 bytes HF's eager model keeps that memtrade does
    not), its Llama terms without a dense MLP where a layer is sparse, plus per MoE layer (N =
    batch · seq_len tokens, k routed experts each, I the experts' width):
      - each routed row's silu(gate) (I), as a SwiGLU MLP's;
      - the weighted expert output, which index_add_ saves as its source (C per routed row);
      - the routing weight of each routed row (routing_weights[top_x, idx, None], 1);
      - torch.where's top_x and idx, int64, against memtrade's one int32 row index (3 floats'
        worth per routed row), and topk's int64 indices (2 per routed row);
      - with the renormalisation (Mixtral; Qwen2-MoE's norm_topk_prob): the clone the in-place
        division keeps of the top-k weights (1 per routed row) and their sum (1 per token);
      - Qwen2-MoE's shared expert: its silu(gate) (shared_expert_intermediate_size per token);
    and with output_router_logits the load-balancing loss: softmax's output over all MoE layers'
    tokens (E per token and layer), topk's int64 indices (2k) and tokens_per_expert (k·E)."""
    import saved_bytes
    m, L, T = hyper["moe"], hyper["n_layer"], hyper["seq_len"]
    sparse = [i for i in range(L) if (i + 1) % m["decoder_sparse_step"] == 0
              and i not in m["mlp_only_layers"]]
    plan = {"selective": False, "segments": [[0, L, False]]}
    dense_mlp = 4 * batch * T * hyper["intermediate_size"]  # silu(gate) of one dense layer
    extra = saved_bytes.llama_eager_extra(hyper, batch, plan, "none") - len(sparse) * dense_mlp
    extra += 4 * 2 * T * hyper["head_dim"]  # the rotary tables, as eager_extra's
    N, k, E, C = batch * T, m["top_k"], m["num_experts"], hyper["n_embd"]
    per_row = m["moe_intermediate_size"] + C + 1 + 3 + 2 + (1 if m["norm_topk_prob"] else 0)
    per_layer = N * k * per_row + (N if m["norm_topk_prob"] else 0)
    per_layer += N * m["shared_expert_intermediate_size"]
    extra += 4 * len(sparse) * per_layer
    if m["router_aux_loss_coef"] > 0:
        extra += 4 * (len(sparse) * N * (E + 2 * k) + k * E)
    return extra


@pytest.mark.parametrize("case", sorted(MOE_CASES))
def test_moe_saved_bytes_against_hf_eager(memtrade_bin, tmp_path, case):
    """memtrade's activations at the end of forward against what HF's eager MoE model keeps
    (saved-tensor hooks, its loss with the load-balancing term), fp32: the gap is
    moe_eager_extra's, to 1% (the rest: a few scalars and the loss's)."""
    import memtrade_side
    torch.set_num_threads(1)
    config = MOE_CASES[case]
    (tmp_path / "config.json").write_text(json.dumps(config))
    flags = ["--backend", "cpu", "--model-config", str(tmp_path / "config.json"), "--seq-len",
             "16", "--batch-size", "2", "--precision", "fp32", "--optimizer", "sgd"]
    out, meta = run_dump(memtrade_bin, tmp_path, *flags[2:])
    trace = memtrade_side.read_trace(
        memtrade_side.make_trace(memtrade_bin, tmp_path / "run", flags))
    ours = memtrade_side.live_at_end_of_forward(trace)["requested"]
    theirs = hf_saved_bytes(out, meta, config, strict=True,
                            loss_of=lambda model, x, y: moe_forward(model, config, x, y))
    extra = moe_eager_extra(meta["hyper"], 2)
    print(f"{case}: HF eager keeps {theirs:,} B, memtrade {ours:,} B, gap {ours - theirs:+,} B, "
          f"formula {-extra:+,} B, residual {ours - theirs + extra:+,} B")
    assert extra > 0.2 * theirs  # the difference is real and large
    assert abs(ours - theirs + extra) <= 0.01 * theirs, (ours, theirs, extra)
