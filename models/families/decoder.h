// DecoderModel: the decoder-only language models (GPT-2, Llama) as one BlockModel.
//
// token embedding (+ learned positions) -> n pre-norm blocks -> final norm -> head -> cross-
// entropy, a block being
//   x1 = x + attn(norm_1(x));  out = x1 + mlp(norm_2(x1))
// (nanoGPT's Block and HF's LlamaDecoderLayer alike). A family picks the norm (LayerNorm or
// RmsNorm) and the MLP (GptMlp or LlamaMlp), registers its parameters with their names, shapes
// and init, and fills the parts below; forward, backward and FLOPs are shared.
//
// Tensor parallelism (models/layers/tensor_parallel.h): a model built for tp rank r of N holds
// its slice of every split parameter (column-parallel qkv and fc/gate/up, row-parallel
// projections, the vocabulary rows of the embedding and the head) and whole copies of the rest;
// its layers run their collectives in LayerCtx::tp. The parameter names, order and init are the
// whole model's, each split parameter's values the slice of the whole one's (ParamSpec::tp).
//
// Training sequences are seq_len = T ≤ block_size long (block_size: the positions the model
// takes, learned for GPT, max_position_embeddings for Llama): input (B, T) I32 tokens, targets
// (B, T) the next tokens, rows_per_sample = T. One block = one decoder layer.
//
// Gemma 2 (transformers 4.46.3 modeling_gemma2.py Gemma2DecoderLayer) normalises each branch's
// output as well: x1 = x + post_1(attn(norm_1(x))); out = x1 + post_2(mlp(norm_2(x1))), and caps
// the logits, cap·tanh(logits / cap), before the loss.
//
// Saved per block besides the layers' own (models/layers/*.h): "x" (the block input, by
// BlockModel) and "x1" (the residual after attention, norm_2's input); with post norms their
// inputs, "<key>.inp" (in fp32 under autocast: HF's Gemma2RMSNorm saves x.float()). Head: "x"
// (norm_f's input), "lnf" (the head GEMM's input), the logits and the targets (layers/loss.h);
// with final soft-capping "softcap.out", the capped logits in the head's dtype (autograd keeps
// torch.tanh's output, the same bytes), beside the loss's own copy.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "models/families/block_model.h"
#include "models/layers/attention.h"
#include "models/layers/embedding.h"
#include "models/layers/gpt_mlp.h"
#include "models/layers/layernorm.h"
#include "models/layers/llama_mlp.h"
#include "models/layers/moe.h"
#include "models/layers/rmsnorm.h"
#include "models/layers/tensor_parallel.h"

namespace memtrade {

// Sanity bounds on a decoder's sizes, wherever they come from (the size table, an override, a
// config file). Each is far above every published model (the largest is noted), so that no real
// configuration meets one, while a typo (n_layer=2000000000) is one line and exit 2 instead of
// a model of billions of layers that hangs and then runs out of host memory.
struct DecoderBound {
  std::string_view what;
  std::int64_t max;
};
inline constexpr DecoderBound kMaxLayers{"layers", 4096};             // Llama 3.1 405B: 126
inline constexpr DecoderBound kMaxHeads{"attention heads", 4096};     // 128
inline constexpr DecoderBound kMaxHidden{"hidden size", 1 << 17};     // 16384 (GPT-3: 12288)
inline constexpr DecoderBound kMaxIntermediate{"MLP size", 1 << 20};  // 53248
inline constexpr DecoderBound kMaxVocab{"vocabulary", 1 << 24};       // 256000 (Gemma)
inline constexpr DecoderBound kMaxPositions{"positions", 1 << 24};    // 1048576 (1M-token Llamas)

// What is wrong with `value` of `key` under `bound` ("n_layer 2000000000 is above memtrade's
// bound of 4096 (layers)"), or nullopt.
std::optional<std::string> above_bound(std::string_view key, std::int64_t value,
                                       const DecoderBound& bound);

// A model whose blocks may route tokens to experts (layers/moe.h): the harness reads its routing
// (the histograms a run records) and sets the estimator's plan through this.
class MoeRouted {
 public:
  virtual ~MoeRouted() = default;
  virtual MoeState& moe() = 0;
};

template <typename Norm, typename Mlp>
class DecoderModel : public BlockModel, public MoeRouted {
 public:
  MoeState& moe() final { return moe_; }
  int num_blocks() const final { return static_cast<int>(blocks_.size()); }
  std::int64_t max_seq_len() const final { return block_size_; }
  Shape input_shape(std::int64_t batch) const final { return {batch, seq_len_}; }
  DType input_dtype(DType) const final { return DType::I32; }
  Shape target_shape(std::int64_t batch) const final { return {batch, seq_len_}; }
  std::int64_t rows_per_sample() const final { return seq_len_; }
  void make_batch(std::uint64_t seed, std::int64_t first, std::int64_t batch,
                  std::vector<float>& input, std::vector<std::int32_t>& targets) const final;

 protected:
  struct Block {
    Norm norm_1;
    CausalSelfAttention attn;
    Norm norm_2;
    Mlp mlp;
    Moe moe;  // a mixture-of-experts layer in place of mlp where moe.enabled()
    // Gemma 2's post_attention_layernorm and post_feedforward_layernorm: each branch's output
    // normalised before the residual add (its norm_1 and norm_2 are input_layernorm and
    // pre_feedforward_layernorm).
    std::optional<Norm> post_1, post_2;
  };

  // Checks seq_len against block_size (0 = block_size) and keeps the sequence shape; throws
  // std::invalid_argument naming the model.
  void set_sequence(const std::string& name, int seq_len, int block_size, int vocab_size);
  // Checks each (key, value, bound) before anything is built; throws std::invalid_argument
  // naming the model and the key.
  static void check_bounds(
      const std::string& name,
      std::initializer_list<std::tuple<std::string_view, std::int64_t, DecoderBound>> sizes);

  Tensor stem_forward(LayerCtx& c, const Tensor& input) final;
  Tensor block_forward(LayerCtx& c, int block, const Tensor& x) final;
  Tensor head_forward(LayerCtx& c, Tensor x, const Tensor& targets) final;
  Tensor head_backward(LayerCtx& c, float dloss) final;
  void block_backward(LayerCtx& c, int block, Tensor& dres) final;
  void stem_backward(LayerCtx& c, Tensor& dres) final;

  // GEMMs 2 FLOPs per multiply-add: the block's weight matrices once per token, QKᵀ and att·V
  // each B·NH·T²·hd (the full square, as dense kernels compute it); the head's V·C per token.
  double stem_flops(std::int64_t) const final { return 0.0; }
  double block_flops(std::int64_t batch, int block) const final;
  double head_flops(std::int64_t batch) const final;
  // Selective (Megatron's, the attention core): the probabilities' QKᵀ (math; flash keeps none
  // to drop). Flash's backward recomputes the scores (FlashAttention-2).
  double selective_recompute_flops(std::int64_t batch, int block,
                                   const RunOptions& options) const final;
  double attention_recompute_flops(std::int64_t batch, int block,
                                   const RunOptions& options) const final;

  // Tensor parallelism: the split this model is built for (checks that heads, KV heads and
  // widths divide, naming the key), a parameter of which this rank holds `slice` (its shape the
  // slice's), and a replicated one (norms, row-parallel biases: all-reduced under SP).
  void set_split(const std::string& name, TpSplit tp,
                 std::initializer_list<std::pair<std::string_view, std::int64_t>> divisible,
                 std::int64_t vocab);
  int add_split_param(std::string name, Shape whole, float init_std, int block, TpSlice slice);
  int add_replicated_param(std::string name, Shape shape, float init_std, int block);

  TpSplit tp_{};
  Embedding embedding_;
  std::vector<Block> blocks_;
  Norm norm_f_;
  Linear head_;                 // lm_head, or the embedding's wte when tied
  float final_softcap_ = 0.0f;  // Gemma 2's final_logit_softcapping: logits = cap·tanh(l / cap)
  MoeState moe_;                // the MoE layers' routing (layers == 0: none)

 private:
  double scores_flops(std::int64_t batch, int block) const;  // one QKᵀ of a block

  std::int64_t seq_len_ = 0, block_size_ = 0;
  int vocab_size_ = 0;
};

extern template class DecoderModel<LayerNorm, GptMlp>;
extern template class DecoderModel<RmsNorm, LlamaMlp>;

}  // namespace memtrade
