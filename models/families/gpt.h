// GPT-2 exactly as nanoGPT: token + learned position embedding, n_layer pre-LN blocks
// (x += attn(ln_1(x)); x += mlp(ln_2(x))), ln_f, and a head tied to wte (logits = x · wteᵀ, no
// bias) unless tie_word_embeddings is false (then lm_head.weight); causal self-attention, GELU
// (tanh), layer-norm eps 1e-5 (layer_norm_epsilon), no dropout. Parameter names, order and
// layouts are nanoGPT's; init too: normal(0, 0.02), the two c_proj weights
// normal(0, 0.02/√(2·n_layer)), biases 0, layer-norm weights 1. Forward, backward and FLOPs:
// models/families/decoder.h.
#pragma once

#include <string>
#include <vector>

#include "models/config/hyper_fields.h"
#include "models/families/decoder.h"

namespace memtrade {

struct GptConfig {
  std::string name;
  int n_layer = 2;
  int n_head = 2;
  int n_embd = 64;
  int vocab_size = 256;
  int block_size = 32;  // learned positions (HF: n_positions)
  double norm_eps = 1e-5;
  bool tie_word_embeddings = true;
  int seq_len = 0;    // T; 0 = block_size
  ConfigFile file{};  // set when read from a config file
};

// The hyper-parameters a model override may set (`gpt-tiny:n_layer=4`), by hyper()'s keys.
const std::vector<HyperField<GptConfig>>& gpt_hyper_fields();

class GptModel final : public DecoderModel<LayerNorm, GptMlp> {
 public:
  // tp: the tensor-parallel slice this model is (decoder.h); the whole model by default.
  explicit GptModel(GptConfig cfg, TpSplit tp = {});
  std::string name() const override { return cfg_.name; }
  std::string family() const override { return "gpt"; }
  nlohmann::json hyper() const override;

 private:
  GptConfig cfg_;
};

}  // namespace memtrade
