#include "models/gpt.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "models/data.h"
#include "models/layers/loss.h"

namespace memtrade {

GptModel::GptModel(GptConfig cfg) : cfg_(std::move(cfg)) {
  if (cfg_.seq_len == 0) cfg_.seq_len = cfg_.block_size;
  if (cfg_.seq_len < 1 || cfg_.seq_len > cfg_.block_size)
    throw std::invalid_argument(fmt::format("{}: seq_len {} must be in [1, {}] (its block size)",
                                            cfg_.name, cfg_.seq_len, cfg_.block_size));
  if (cfg_.n_embd % cfg_.n_head != 0)
    throw std::invalid_argument(fmt::format("{}: n_embd {} not divisible by n_head {}", cfg_.name,
                                            cfg_.n_embd, cfg_.n_head));
  const std::int64_t C = cfg_.n_embd, V = cfg_.vocab_size;
  constexpr float kStd = 0.02f;
  const float proj_std = kStd / std::sqrt(2.0f * static_cast<float>(cfg_.n_layer));
  constexpr float kOnes = -1.0f;
  embedding_.wte = add_param("transformer.wte.weight", {V, C}, kStd, -1);
  embedding_.wpe = add_param("transformer.wpe.weight", {cfg_.block_size, C}, kStd, -1);
  for (int i = 0; i < cfg_.n_layer; ++i) {
    const std::string p = fmt::format("transformer.h.{}.", i);
    Block b;
    b.ln_1 = {add_param(p + "ln_1.weight", {C}, kOnes, i), add_param(p + "ln_1.bias", {C}, 0, i),
              "ln_1"};
    b.attn.c_attn = {add_param(p + "attn.c_attn.weight", {3 * C, C}, kStd, i),
                     add_param(p + "attn.c_attn.bias", {3 * C}, 0, i)};
    b.attn.c_proj = {add_param(p + "attn.c_proj.weight", {C, C}, proj_std, i),
                     add_param(p + "attn.c_proj.bias", {C}, 0, i)};
    b.attn.n_head = cfg_.n_head;
    b.attn.n_kv_head = cfg_.n_head;  // multi-head attention
    b.ln_2 = {add_param(p + "ln_2.weight", {C}, kOnes, i), add_param(p + "ln_2.bias", {C}, 0, i),
              "ln_2"};
    b.mlp.c_fc = {add_param(p + "mlp.c_fc.weight", {4 * C, C}, kStd, i),
                  add_param(p + "mlp.c_fc.bias", {4 * C}, 0, i)};
    b.mlp.c_proj = {add_param(p + "mlp.c_proj.weight", {C, 4 * C}, proj_std, i),
                    add_param(p + "mlp.c_proj.bias", {C}, 0, i)};
    blocks_.push_back(std::move(b));
  }
  ln_f_ = {add_param("transformer.ln_f.weight", {C}, kOnes, -1),
           add_param("transformer.ln_f.bias", {C}, 0, -1), "ln_f"};
}

nlohmann::json GptModel::hyper() const {
  return {
      {"family", family()},      {"n_layer", cfg_.n_layer},       {"n_head", cfg_.n_head},
      {"n_embd", cfg_.n_embd},   {"vocab_size", cfg_.vocab_size}, {"block_size", cfg_.block_size},
      {"seq_len", cfg_.seq_len}, {"num_params", num_params()}};
}

void GptModel::make_batch(std::uint64_t seed, std::int64_t first, std::int64_t batch,
                          std::vector<float>& input, std::vector<std::int32_t>& targets) const {
  make_token_batch(seed, first, batch, cfg_.seq_len, cfg_.vocab_size, input, targets);
}

// ---- forward ------------------------------------------------------------------------------------

Tensor GptModel::stem_forward(LayerCtx& c, const Tensor& input) {
  return embedding_forward(c, input, embedding_);  // (B·T, C)
}

Tensor GptModel::block_forward(LayerCtx& c, int block, const Tensor& x) {
  const Block& b = blocks_[block];
  const std::int64_t N = x.dim(0), C = x.dim(1), T = cfg_.seq_len;
  Tensor ln1 = c.act_tensor({N, C}, c.out_dtype(Op::layernorm, x));  // (B·T, C)
  layernorm_forward(c, ln1, x, b.ln_1);
  Tensor a = attention_forward(c, std::move(ln1), N / T, T, b.attn);
  // The residual after attention, ln_2's input (autocast: fp32 + 16-bit promotes to fp32).
  Tensor x1 = c.act_tensor({N, C}, c.out_dtype(Op::add, x.dtype(), a.dtype()));
  c.ops().add(x1, x, a);
  a.reset();
  Tensor ln2 = c.act_tensor({N, C}, c.out_dtype(Op::layernorm, x1));
  layernorm_forward(c, ln2, x1, b.ln_2);
  Tensor m = gpt_mlp_forward(c, std::move(ln2), b.mlp);
  Tensor out = c.dev.empty({N, C}, c.out_dtype(Op::add, x1.dtype(), m.dtype()),
                           Category::activations);  // the next block's input
  c.ops().add(out, x1, m);
  c.keep("x1", std::move(x1));
  return out;
}

Tensor GptModel::head_forward(LayerCtx& c, Tensor x, const Tensor& targets) {
  const std::int64_t N = x.dim(0), C = x.dim(1);
  Tensor lnf = c.act_tensor({N, C}, c.out_dtype(Op::layernorm, x));  // (B·T, C)
  layernorm_forward(c, lnf, x, ln_f_);
  c.keep("x", std::move(x));
  lnf = c.cast_input(Op::linear, std::move(lnf));
  Tensor logits = c.act_tensor({N, cfg_.vocab_size}, c.out_dtype(Op::linear, lnf));  // (B·T, V)
  linear_forward(c, logits, lnf, Linear{embedding_.wte, -1});
  c.keep("lnf", std::move(lnf));
  return crossentropy_loss_forward(c, std::move(logits), targets);
}

// ---- backward -----------------------------------------------------------------------------------

// A gradient that comes back from a layer which cast its input (autocast: the 16-bit copy of an
// fp32 layer-norm output) is cast back to that output's dtype before layer norm's backward.

Tensor GptModel::head_backward(LayerCtx& c, float dloss) {
  const Tensor& lnf = c.get("lnf");
  Tensor dlogits = crossentropy_loss_backward(c, dloss, c.out_dtype(Op::linear, lnf));  // (B·T, V)
  Tensor dlnf = c.temp_like(lnf);
  // The tied head writes wte's gradient first; the embedding adds to it later.
  linear_backward(c, &dlnf, dlogits, lnf, Linear{embedding_.wte, -1});
  dlogits.reset();
  const Tensor& x = c.get("x");
  dlnf = c.grad_as(std::move(dlnf), c.out_dtype(Op::layernorm, x));
  Tensor dres = c.temp_like(x);  // (B·T, C): d(last block output)
  layernorm_backward(c, dres, dlnf, x, ln_f_);
  return dres;
}

void GptModel::block_backward(LayerCtx& c, int block, Tensor& dres) {
  const Block& b = blocks_[block];
  // out = x1 + mlp(ln_2(x1)): dres = d out -> d x1.
  const Tensor& x1 = c.get("x1");
  Tensor dln2 = c.grad_as(gpt_mlp_backward(c, dres, b.mlp), c.out_dtype(Op::layernorm, x1));
  layernorm_backward_add(c, dres, dln2, x1, b.ln_2);
  dln2.reset();
  // x1 = x + attn(ln_1(x)): dres = d x1 -> d x.
  const Tensor& x = c.get("x");
  Tensor dln1 = c.grad_as(attention_backward(c, dres, b.attn), c.out_dtype(Op::layernorm, x));
  layernorm_backward_add(c, dres, dln1, x, b.ln_1);
}

void GptModel::stem_backward(LayerCtx& c, Tensor& dres) {
  embedding_backward(c, dres, embedding_);
}

// ---- FLOPs --------------------------------------------------------------------------------------

double GptModel::block_flops(std::int64_t batch, int) const {
  const double N = static_cast<double>(batch) * cfg_.seq_len, C = cfg_.n_embd, T = cfg_.seq_len;
  // c_attn 3C², c_proj C², c_fc 4C², mlp.c_proj 4C² MACs per token; QKᵀ and att·V each
  // B·NH·T²·hd = B·T²·C MACs (the full square, as dense kernels compute it).
  return 2.0 * N * 12.0 * C * C + 2.0 * 2.0 * static_cast<double>(batch) * T * T * C;
}

double GptModel::head_flops(std::int64_t batch) const {
  return 2.0 * static_cast<double>(batch) * cfg_.seq_len * cfg_.n_embd * cfg_.vocab_size;
}

// One QKᵀ of a block: B·T²·C multiply-adds.
double GptModel::scores_flops(std::int64_t batch) const {
  const double T = cfg_.seq_len;
  return 2.0 * static_cast<double>(batch) * T * T * cfg_.n_embd;
}

double GptModel::selective_recompute_flops(std::int64_t batch, int,
                                           const RunOptions& options) const {
  // Megatron's selective recompute: the attention probabilities (QKᵀ; flash keeps none).
  return options.attention == AttentionKind::math ? scores_flops(batch) : 0.0;
}

double GptModel::attention_recompute_flops(std::int64_t batch, int,
                                           const RunOptions& options) const {
  // Flash attention's backward recomputes the scores from q and k (FlashAttention-2).
  return options.attention == AttentionKind::flash ? scores_flops(batch) : 0.0;
}

}  // namespace memtrade
