// GPT-2 exactly as nanoGPT: token + learned position embedding, n_layer pre-LN blocks
// (x += attn(ln_1(x)); x += mlp(ln_2(x))), ln_f, and a head tied to wte (logits = x · wteᵀ, no
// bias); causal self-attention, GELU (tanh), layer-norm eps 1e-5, no dropout. Parameter names,
// order and layouts are nanoGPT's; init too: normal(0, 0.02), the two c_proj weights
// normal(0, 0.02/√(2·n_layer)), biases 0, layer-norm weights 1.
//
// Training sequences are seq_len = T ≤ block_size long (block_size is the number of learned
// positions, wpe's rows): input (B, T) I32 tokens, targets (B, T) the next tokens,
// rows_per_sample = T. One block = one transformer layer.
#pragma once

#include <memory>
#include <string>

#include "models/block_model.h"
#include "models/layers/attention.h"
#include "models/layers/embedding.h"
#include "models/layers/gpt_mlp.h"
#include "models/layers/layernorm.h"

namespace memtrade {

struct GptConfig {
  std::string name;
  int n_layer = 2;
  int n_head = 2;
  int n_embd = 64;
  int vocab_size = 256;
  int block_size = 32;
  int seq_len = 0;  // T; 0 = block_size
};

class GptModel final : public BlockModel {
 public:
  explicit GptModel(GptConfig cfg);
  std::string name() const override { return cfg_.name; }
  std::string family() const override { return "gpt"; }
  nlohmann::json hyper() const override;
  int num_blocks() const override { return cfg_.n_layer; }
  std::int64_t max_seq_len() const override { return cfg_.block_size; }
  Shape input_shape(std::int64_t batch) const override { return {batch, cfg_.seq_len}; }
  DType input_dtype(DType) const override { return DType::I32; }
  Shape target_shape(std::int64_t batch) const override { return {batch, cfg_.seq_len}; }
  std::int64_t rows_per_sample() const override { return cfg_.seq_len; }
  void make_batch(std::uint64_t seed, std::int64_t first, std::int64_t batch,
                  std::vector<float>& input, std::vector<std::int32_t>& targets) const override;

 protected:
  Tensor stem_forward(LayerCtx& c, const Tensor& input) override;
  Tensor block_forward(LayerCtx& c, int block, const Tensor& x) override;
  Tensor head_forward(LayerCtx& c, Tensor x, const Tensor& targets) override;
  Tensor head_backward(LayerCtx& c, float dloss) override;
  void block_backward(LayerCtx& c, int block, Tensor& dres) override;
  void stem_backward(LayerCtx& c, Tensor& dres) override;
  double stem_flops(std::int64_t) const override { return 0.0; }
  double block_flops(std::int64_t batch, int block) const override;
  double head_flops(std::int64_t batch) const override;
  double scores_flops(std::int64_t batch) const;
  double selective_recompute_flops(std::int64_t batch, int block,
                                   const RunOptions& options) const override;
  double attention_recompute_flops(std::int64_t batch, int block,
                                   const RunOptions& options) const override;

 private:
  struct Block {
    LayerNorm ln_1;
    CausalSelfAttention attn;
    LayerNorm ln_2;
    GptMlp mlp;
  };
  GptConfig cfg_;
  Embedding embedding_;
  std::vector<Block> blocks_;
  LayerNorm ln_f_;
};

}  // namespace memtrade
