#include "models/decoder.h"

#include <stdexcept>

#include <fmt/format.h>

#include "models/data.h"
#include "models/layers/loss.h"

namespace memtrade {
namespace {

// Multiply-adds per token that selective checkpointing spends again in a block's MLP.
double selective_mlp_macs(const std::vector<ParamSpec>& p, const GptMlp& m) {
  return static_cast<double>(shape_numel(p[m.c_fc.weight].shape));  // the GELU input: c_fc
}
double selective_mlp_macs(const std::vector<ParamSpec>&, const LlamaMlp&) {
  return 0.0;  // down_proj's input: SwiGLU of the saved gate and up, element-wise
}

}  // namespace

template <typename Norm, typename Mlp>
void DecoderModel<Norm, Mlp>::set_sequence(const std::string& name, int seq_len, int block_size,
                                           int vocab_size) {
  if (seq_len == 0) seq_len = block_size;
  if (seq_len < 1 || seq_len > block_size)
    throw std::invalid_argument(fmt::format("{}: seq_len {} must be in [1, {}] (its block size)",
                                            name, seq_len, block_size));
  seq_len_ = seq_len;
  block_size_ = block_size;
  vocab_size_ = vocab_size;
}

template <typename Norm, typename Mlp>
void DecoderModel<Norm, Mlp>::make_batch(std::uint64_t seed, std::int64_t first, std::int64_t batch,
                                         std::vector<float>& input,
                                         std::vector<std::int32_t>& targets) const {
  make_token_batch(seed, first, batch, static_cast<int>(seq_len_), vocab_size_, input, targets);
}

// ---- forward ------------------------------------------------------------------------------------

template <typename Norm, typename Mlp>
Tensor DecoderModel<Norm, Mlp>::stem_forward(LayerCtx& c, const Tensor& input) {
  return embedding_forward(c, input, embedding_);  // (B·T, C)
}

template <typename Norm, typename Mlp>
Tensor DecoderModel<Norm, Mlp>::block_forward(LayerCtx& c, int block, const Tensor& x) {
  const Block& b = blocks_[block];
  const std::int64_t N = x.dim(0), C = x.dim(1), T = seq_len_;
  Tensor h1 = c.act_tensor({N, C});  // (B·T, C)
  norm_forward(c, h1, x, b.norm_1);
  Tensor a = attention_forward(c, std::move(h1), N / T, T, b.attn);
  Tensor x1 = c.act_tensor({N, C});  // residual after attention: norm_2's input
  c.ops().add(x1, x, a);
  a.reset();
  Tensor h2 = c.act_tensor({N, C});
  norm_forward(c, h2, x1, b.norm_2);
  Tensor m = mlp_forward(c, std::move(h2), b.mlp);
  Tensor out = c.dev.empty({N, C}, c.act, Category::activations);  // the next block's input
  c.ops().add(out, x1, m);
  c.keep("x1", std::move(x1));
  return out;
}

template <typename Norm, typename Mlp>
Tensor DecoderModel<Norm, Mlp>::head_forward(LayerCtx& c, Tensor x, const Tensor& targets) {
  const std::int64_t N = x.dim(0), C = x.dim(1);
  Tensor lnf = c.act_tensor({N, C});  // (B·T, C)
  norm_forward(c, lnf, x, norm_f_);
  c.keep("x", std::move(x));
  Tensor logits = c.act_tensor({N, vocab_size_});  // (B·T, V)
  linear_forward(c, logits, lnf, head_);
  c.keep("lnf", std::move(lnf));
  return crossentropy_loss_forward(c, std::move(logits), targets);
}

// ---- backward -----------------------------------------------------------------------------------

template <typename Norm, typename Mlp>
Tensor DecoderModel<Norm, Mlp>::head_backward(LayerCtx& c, float dloss) {
  Tensor dlogits = crossentropy_loss_backward(c, dloss);  // (B·T, V)
  const Tensor& lnf = c.get("lnf");
  Tensor dlnf = c.temp(lnf.shape());
  // A tied head writes wte's gradient first; the embedding adds to it later.
  linear_backward(c, &dlnf, dlogits, lnf, head_);
  dlogits.reset();
  const Tensor& x = c.get("x");
  Tensor dres = c.temp(x.shape());  // (B·T, C): d(last block output)
  norm_backward(c, dres, dlnf, x, norm_f_);
  return dres;
}

template <typename Norm, typename Mlp>
void DecoderModel<Norm, Mlp>::block_backward(LayerCtx& c, int block, Tensor& dres) {
  const Block& b = blocks_[block];
  // out = x1 + mlp(norm_2(x1)): dres = d out -> d x1.
  Tensor dh2 = mlp_backward(c, dres, b.mlp);
  norm_backward_add(c, dres, dh2, c.get("x1"), b.norm_2);
  dh2.reset();
  // x1 = x + attn(norm_1(x)): dres = d x1 -> d x.
  Tensor dh1 = attention_backward(c, dres, b.attn);
  norm_backward_add(c, dres, dh1, c.get("x"), b.norm_1);
}

template <typename Norm, typename Mlp>
void DecoderModel<Norm, Mlp>::stem_backward(LayerCtx& c, Tensor& dres) {
  embedding_backward(c, dres, embedding_);
}

// ---- FLOPs --------------------------------------------------------------------------------------

template <typename Norm, typename Mlp>
double DecoderModel<Norm, Mlp>::scores_flops(std::int64_t batch, int block) const {
  // B·NH·T²·hd multiply-adds; NH·hd is c_proj's input width.
  const double T = static_cast<double>(seq_len_);
  const double width = static_cast<double>(params()[blocks_[block].attn.c_proj.weight].shape[1]);
  return 2.0 * static_cast<double>(batch) * T * T * width;
}

template <typename Norm, typename Mlp>
double DecoderModel<Norm, Mlp>::block_flops(std::int64_t batch, int block) const {
  double macs = 0;  // per token: every weight matrix of the block once (biases and norms aside)
  for (const ParamSpec& p : params())
    if (p.block == block && p.shape.size() == 2) macs += static_cast<double>(shape_numel(p.shape));
  const double N = static_cast<double>(batch) * static_cast<double>(seq_len_);
  return 2.0 * N * macs + 2.0 * scores_flops(batch, block);  // + QKᵀ and att·V
}

template <typename Norm, typename Mlp>
double DecoderModel<Norm, Mlp>::head_flops(std::int64_t batch) const {
  const double N = static_cast<double>(batch) * static_cast<double>(seq_len_);
  return 2.0 * N * static_cast<double>(shape_numel(params()[head_.weight].shape));
}

template <typename Norm, typename Mlp>
double DecoderModel<Norm, Mlp>::selective_recompute_flops(std::int64_t batch, int block,
                                                          const RunOptions& options) const {
  const double N = static_cast<double>(batch) * static_cast<double>(seq_len_);
  return (options.attention == AttentionKind::math ? scores_flops(batch, block) : 0.0) +
         2.0 * N * selective_mlp_macs(params(), blocks_[block].mlp);
}

template <typename Norm, typename Mlp>
double DecoderModel<Norm, Mlp>::attention_recompute_flops(std::int64_t batch, int block,
                                                          const RunOptions& options) const {
  return options.attention == AttentionKind::flash ? scores_flops(batch, block) : 0.0;
}

template class DecoderModel<LayerNorm, GptMlp>;
template class DecoderModel<RmsNorm, LlamaMlp>;

}  // namespace memtrade
