"""PyTorch twins of memtrade's models, built from a step dump's meta.json.

Used by the reference tests (tests/python/), the peers (torch_step.py, saved_bytes.py) and the
CPU peer benchmark. The GPT is nanoGPT's architecture (pre-LN, causal attention, GELU tanh, tied
head, no dropout) with nanoGPT's names, so a memtrade dump loads with `load_state_dict` as is.
The Llama is HF transformers' LlamaForCausalLM written from the architecture (RMSNorm, rotary
embeddings with rotate_half and llama3 rope scaling, grouped-query attention with repeat_kv,
SwiGLU, no biases, tied or untied head) with HF's parameter names; transformers is not used.

Every twin is cut at memtrade's block boundaries (models/families/block_model.h): `stem_fn(x)`, the list
`block_fns()` (memtrade's block i is block_fns()[i]) and `head_fn(x, targets)` (the mean loss);
`*_fn` because the CNN has layers named `stem` and `head`. `forward` is their composition;
`plan_forward` is the same composition under memtrade's checkpoint plan.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

# Told every checkpoint's inputs (what a non-reentrant checkpoint keeps through its closure, and
# no saved-tensor hook sees): set by plan_forward for the duration of a forward.
_on_checkpoint = None
# torch.utils.checkpoint's preserve_rng_state (its default, True: each checkpoint stashes the CPU
# RNG state, torch.get_rng_state(), 5056 B in 1.13). The twins draw no random numbers (no
# dropout), so the recompute is the same either way; a caller that counts device memory on the
# CPU turns it off, because on CUDA that state is host memory, which max_memory_allocated()
# never sees (bench/peers/whole_step.py).
preserve_rng_state = True


def checkpoint(label, fn, *args):
    """torch.utils.checkpoint (non-reentrant) of fn(*args), reported to the observer."""
    if _on_checkpoint is not None:
        _on_checkpoint(label, *args)
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False,
                                             preserve_rng_state=preserve_rng_state)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        mask = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)
        self.register_buffer("bias", mask, persistent=False)

    selective = False  # Megatron's selective recompute: the attention core is checkpointed

    def core(self, q, k, v):
        """The attention core, (B, NH, T, hd) each -> (B, NH, T, hd): what selective drops."""
        T = q.size(2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))  # (B, NH, T, T)
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        return att @ v

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        hd = C // self.n_head
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)  # (B, NH, T, hd)
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        if self.selective:
            y = checkpoint("attention core input", self.core, q, k, v)
        else:
            y = self.core(q, k, v)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, vocab_size, block_size, norm_eps=1e-5,
                 tie_word_embeddings=True, **_):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd, eps=norm_eps),
        ))
        for block in self.transformer.h:
            block.ln_1.eps = block.ln_2.eps = norm_eps
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_word_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    def stem_fn(self, idx):
        pos = torch.arange(idx.size(1), dtype=torch.long, device=idx.device)
        return self.transformer.wte(idx) + self.transformer.wpe(pos)  # (B, T, C)

    def block_fns(self):
        return list(self.transformer.h)

    def head_fn(self, x, targets):
        logits = self.lm_head(self.transformer.ln_f(x))  # (B, T, V)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    def forward(self, idx, targets):
        return plan_forward(self, [(0, len(self.transformer.h), False)], idx, targets)


class LlamaRMSNorm(nn.Module):
    """weight · x/√(mean(x²) + eps), computed in float32 (or wider) and rounded back to x's dtype
    before the weight multiplies it, as HF's LlamaRMSNorm."""

    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def llama_inv_freq(head_dim, theta, scaling):
    """The head_dim/2 rotary inverse frequencies in float32, with rope_scaling of type llama3
    (Llama 3.1/3.2): long wavelengths divided by factor, short ones kept, a smooth blend between."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return inv
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return torch.where(medium, blended, scaled)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, n_embd, n_head, n_kv_head, inv_freq):
        super().__init__()
        self.n_head, self.n_kv_head, self.hd = n_head, n_kv_head, n_embd // n_head
        self.q_proj = nn.Linear(n_embd, n_head * self.hd, bias=False)
        self.k_proj = nn.Linear(n_embd, n_kv_head * self.hd, bias=False)
        self.v_proj = nn.Linear(n_embd, n_kv_head * self.hd, bias=False)
        self.o_proj = nn.Linear(n_head * self.hd, n_embd, bias=False)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x):
        B, T, _ = x.size()
        q = self.q_proj(x).view(B, T, self.n_head, self.hd).transpose(1, 2)  # (B, NH, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.hd).transpose(1, 2)  # (B, NKV, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.hd).transpose(1, 2)
        # Angles t·inv_freq in float32, cos and sin in float32, then x's dtype (HF's rotary).
        freqs = torch.arange(T, dtype=torch.float32, device=x.device)[:, None] * \
            self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)  # (T, hd)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.selective:
            y = checkpoint("attention core input", self.core, q, k, v)
        else:
            y = self.core(q, k, v)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.hd)
        return self.o_proj(y)

    selective = False  # Megatron's selective recompute: the attention core is checkpointed

    def core(self, q, k, v):
        """repeat_kv and the attention, (B, NH, T, hd) q and (B, NKV, T, hd) k, v ->
        (B, NH, T, hd): what selective drops."""
        B, _, T, _ = q.size()
        rep = self.n_head // self.n_kv_head  # repeat_kv: query head h reads kv head h // rep
        k = k[:, :, None].expand(B, self.n_kv_head, rep, T, self.hd).reshape(B, self.n_head, T, self.hd)
        v = v[:, :, None].expand(B, self.n_kv_head, rep, T, self.hd).reshape(B, self.n_head, T, self.hd)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)  # (B, NH, T, T)
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1, dtype=torch.promote_types(att.dtype, torch.float32)).to(q.dtype)
        return att @ v


class LlamaMLP(nn.Module):
    def __init__(self, n_embd, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(n_embd, intermediate_size, bias=False)
        self.up_proj = nn.Linear(n_embd, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, n_embd, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, n_embd, n_head, n_kv_head, intermediate_size, norm_eps, inv_freq):
        super().__init__()
        self.self_attn = LlamaAttention(n_embd, n_head, n_kv_head, inv_freq)
        self.mlp = LlamaMLP(n_embd, intermediate_size)
        self.input_layernorm = LlamaRMSNorm(n_embd, norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(n_embd, norm_eps)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """LlamaForCausalLM: `model.embed_tokens`, `model.layers`, `model.norm`, `lm_head`."""

    def __init__(self, n_layer, n_head, n_kv_head, n_embd, intermediate_size, vocab_size,
                 rope_theta, norm_eps, tie_word_embeddings, rope_scaling=None, **_):
        super().__init__()
        inv_freq = llama_inv_freq(n_embd // n_head, rope_theta, rope_scaling)
        self.model = nn.ModuleDict(dict(
            embed_tokens=nn.Embedding(vocab_size, n_embd),
            layers=nn.ModuleList([LlamaDecoderLayer(n_embd, n_head, n_kv_head, intermediate_size,
                                                    norm_eps, inv_freq) for _ in range(n_layer)]),
            norm=LlamaRMSNorm(n_embd, norm_eps),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def stem_fn(self, idx):
        return self.model.embed_tokens(idx)  # (B, T, C): no positions, RoPE is in attention

    def block_fns(self):
        return list(self.model.layers)

    def head_fn(self, x, targets):
        logits = self.lm_head(self.model.norm(x))  # (B, T, V)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    def forward(self, idx, targets):
        return plan_forward(self, [(0, len(self.model.layers), False)], idx, targets)


class MLPNet(nn.Module):
    """Linear -> ReLU -> ... -> Linear; `layers.{i}` counts the Linear layers."""

    def __init__(self, in_features, hidden, classes, **_):
        super().__init__()
        sizes = [in_features] + list(hidden) + [classes]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def stem_fn(self, x):
        return x  # memtrade copies the input here (block 0 saves it); PyTorch saves it as is

    def block_fns(self):
        """memtrade's blocks: every hidden Linear with its ReLU; the last Linear is the head."""
        return [(lambda x, lin=lin: F.relu(lin(x))) for lin in list(self.layers)[:-1]]

    def head_fn(self, x, targets):
        return F.cross_entropy(self.layers[-1](x), targets.reshape(-1))

    def forward(self, x, targets):
        return plan_forward(self, [(0, len(self.layers) - 1, False)], x, targets)


class ConvBn(nn.Module):
    def __init__(self, ci, co, k, stride):
        super().__init__()
        self.conv = nn.Conv2d(ci, co, k, stride=stride, padding=k // 2, bias=False)
        self.bn = nn.BatchNorm2d(co, eps=1e-5, momentum=0.1)

    def forward(self, x):
        return self.bn(self.conv(x))


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: conv-bn-relu-conv-bn + shortcut, then relu."""

    def __init__(self, ci, co, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(ci, co, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(co)
        self.conv2 = nn.Conv2d(co, co, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(co)
        self.downsample = None
        if stride != 1 or ci != co:
            self.downsample = nn.Sequential(nn.Conv2d(ci, co, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(co))

    selective = False  # memtrade's CNN selective: bn1 -> relu -> conv2 is recomputed

    def inner(self, c1):
        return self.conv2(F.relu(self.bn1(c1)))

    def forward(self, x):
        c1 = self.conv1(x)
        if self.selective:
            c2 = checkpoint("bn1-relu-conv2 input", self.inner, c1)
        else:
            c2 = self.inner(c1)
        y = self.bn2(c2)
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class CNN(nn.Module):
    def __init__(self, in_channels, stem_channels, widths, strides, classes, **_):
        super().__init__()
        self.stem = ConvBn(in_channels, stem_channels, 3, 1)
        blocks, ci = [], stem_channels
        for co, stride in zip(widths, strides):
            blocks.append(BasicBlock(ci, co, stride))
            ci = co
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(ci, classes)

    def stem_fn(self, x):
        return F.relu(self.stem(x))  # (B, C0, S, S)

    def block_fns(self):
        return list(self.blocks)

    def head_fn(self, x, targets):
        return F.cross_entropy(self.head(x.mean(dim=(2, 3))), targets.reshape(-1))

    def forward(self, x, targets):
        return plan_forward(self, [(0, len(self.blocks), False)], x, targets)


def parts(model):
    """(stem, blocks, head) of a twin: the callables memtrade's block boundaries cut it into."""
    return model.stem_fn, model.block_fns(), model.head_fn


def plan_forward(model, segments, x, targets, on_checkpoint=None, selective=False):
    """The twin's forward (the mean loss) with memtrade's checkpoint plan.

    `segments`: [(begin, end, recompute)] covering the blocks in order (memtrade's
    CheckpointPlan::segments). A recomputed segment runs under torch.utils.checkpoint with
    use_reentrant=False, which keeps only the segment's input and recomputes the rest in
    backward. `selective` (memtrade's plan) checkpoints the attention core of every GPT and Llama
    block (Megatron's selective recompute; Llama's with repeat_kv inside) and bn1 -> relu -> conv2
    of every CNN block.
    `on_checkpoint(label, *inputs)` is told every checkpoint's inputs.
    """
    global _on_checkpoint
    stem, blocks, head = parts(model)
    switches = [m for m in model.modules() if hasattr(type(m), "selective")]
    for m in switches:
        m.selective = selective
    _on_checkpoint = on_checkpoint
    try:
        return _plan_forward(stem, blocks, head, segments, x, targets)
    finally:
        _on_checkpoint = None
        for m in switches:
            m.selective = False


def _plan_forward(stem, blocks, head, segments, x, targets):
    def run(begin, end):
        def segment(h):
            for block in blocks[begin:end]:
                h = block(h)
            return h
        return segment

    h = stem(x)
    for begin, end, recompute in segments:
        if recompute:
            h = checkpoint(f"checkpoint blocks {begin}..{end - 1} input", run(begin, end), h)
        else:
            h = run(begin, end)(h)
    return head(h, targets)


def build(family, hyper):
    if family == "gpt":
        return GPT(**hyper)
    if family == "llama":
        return Llama(**hyper)
    if family == "mlp":
        return MLPNet(**hyper)
    if family == "cnn":
        return CNN(**hyper)
    raise ValueError(f"no PyTorch twin for model family {family!r}")


def make_optimizer(hyper, params, impl=None):
    """torch.optim for memtrade's resolved optimizer ("optimizer_hyper" of `run --list --json`
    or a step dump's meta.json): the kind and every hyper-parameter come from memtrade, none is
    chosen here. `impl`: memtrade's optimizer_impl as torch.optim's flags (foreach: foreach=True,
    _multi_tensor_*; forloop: foreach=False; fused: fused=True; None: torch's default)."""
    h, kind = hyper, hyper["kind"]
    impl = {None: {}, "foreach": {"foreach": True}, "forloop": {"foreach": False},
            "fused": {"fused": True}}[impl]
    if kind == "sgd":
        return torch.optim.SGD(params, lr=h["lr"], weight_decay=h["weight_decay"], **impl)
    if kind == "sgd-momentum":
        return torch.optim.SGD(params, lr=h["lr"], momentum=h["momentum"],
                               dampening=h["dampening"], nesterov=h["nesterov"],
                               weight_decay=h["weight_decay"], **impl)
    if kind in ("adam", "adamw"):
        cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
        return cls(params, lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"],
                   weight_decay=h["weight_decay"], **impl)
    if kind == "adagrad":
        return torch.optim.Adagrad(params, lr=h["lr"], lr_decay=h["lr_decay"], eps=h["eps"],
                                   weight_decay=h["weight_decay"],
                                   initial_accumulator_value=h["initial_accumulator_value"],
                                   **impl)
    if kind == "rmsprop":
        return torch.optim.RMSprop(params, lr=h["lr"], alpha=h["alpha"], eps=h["eps"],
                                   weight_decay=h["weight_decay"], **impl)
    raise ValueError(f"no torch.optim counterpart for optimizer {kind!r}")


def family_of(config):
    """The twin family of a point: memtrade writes it into the hyper-parameters."""
    family = (config.get("hyper") or {}).get("family")
    if family is None:
        raise ValueError(f"config of {config.get('model')!r} has no hyper.family "
                         "(results from a memtrade before 0.2: rerun them)")
    return family
