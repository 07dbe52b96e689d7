#include "models/families/gpt.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace memtrade {

const std::vector<HyperField<GptConfig>>& gpt_hyper_fields() {
  static const std::vector<HyperField<GptConfig>> fields = {
      {"n_layer", &GptConfig::n_layer},
      {"n_head", &GptConfig::n_head},
      {"n_embd", &GptConfig::n_embd},
      {"vocab_size", &GptConfig::vocab_size},
      {"block_size", &GptConfig::block_size},
      {"norm_eps", &GptConfig::norm_eps},
      {"tie_word_embeddings", &GptConfig::tie_word_embeddings},
  };
  return fields;
}

GptModel::GptModel(GptConfig cfg, TpSplit tp) : cfg_(std::move(cfg)) {
  check_bounds(cfg_.name, {{"n_layer", cfg_.n_layer, kMaxLayers},
                           {"n_head", cfg_.n_head, kMaxHeads},
                           {"n_embd", cfg_.n_embd, kMaxHidden},
                           {"vocab_size", cfg_.vocab_size, kMaxVocab},
                           {"block_size", cfg_.block_size, kMaxPositions}});
  set_sequence(cfg_.name, cfg_.seq_len, cfg_.block_size, cfg_.vocab_size);
  cfg_.seq_len = static_cast<int>(rows_per_sample());
  if (cfg_.n_embd % cfg_.n_head != 0)
    throw std::invalid_argument(fmt::format("{}: n_embd {} not divisible by n_head {}", cfg_.name,
                                            cfg_.n_embd, cfg_.n_head));
  set_split(cfg_.name, tp, {{"n_head", cfg_.n_head}}, cfg_.vocab_size);
  const std::int64_t C = cfg_.n_embd, V = cfg_.vocab_size;
  const auto eps = static_cast<float>(cfg_.norm_eps);
  constexpr float kStd = 0.02f;
  const float proj_std = kStd / std::sqrt(2.0f * static_cast<float>(cfg_.n_layer));
  constexpr float kOnes = -1.0f;
  // Tensor parallelism (decoder.h): c_attn's q, k and v and c_fc split by rows (columns of the
  // output), the c_proj weights by columns (their inputs), the vocabulary of wte; wpe, the norms
  // and the c_proj biases whole.
  embedding_.wte = add_split_param("transformer.wte.weight", {V, C}, kStd, -1, tp.vocab(V));
  embedding_.wpe = add_param("transformer.wpe.weight", {cfg_.block_size, C}, kStd, -1);
  for (int i = 0; i < cfg_.n_layer; ++i) {
    const std::string p = fmt::format("transformer.h.{}.", i);
    Block b;
    b.norm_1 = {add_replicated_param(p + "ln_1.weight", {C}, kOnes, i),
                add_replicated_param(p + "ln_1.bias", {C}, 0, i), "ln_1", eps};
    b.attn.c_attn = {
        add_split_param(p + "attn.c_attn.weight", {3 * C, C}, kStd, i, tp.even(0, 3 * C, 3)),
        add_split_param(p + "attn.c_attn.bias", {3 * C}, 0, i, tp.even(0, 3 * C, 3))};
    b.attn.c_proj = {add_split_param(p + "attn.c_proj.weight", {C, C}, proj_std, i, tp.even(1, C)),
                     add_replicated_param(p + "attn.c_proj.bias", {C}, 0, i)};
    b.attn.n_head = cfg_.n_head / tp.size;
    b.attn.n_kv_head = cfg_.n_head / tp.size;  // multi-head attention
    b.norm_2 = {add_replicated_param(p + "ln_2.weight", {C}, kOnes, i),
                add_replicated_param(p + "ln_2.bias", {C}, 0, i), "ln_2", eps};
    b.mlp.c_fc = {add_split_param(p + "mlp.c_fc.weight", {4 * C, C}, kStd, i, tp.even(0, 4 * C)),
                  add_split_param(p + "mlp.c_fc.bias", {4 * C}, 0, i, tp.even(0, 4 * C))};
    b.mlp.c_proj = {
        add_split_param(p + "mlp.c_proj.weight", {C, 4 * C}, proj_std, i, tp.even(1, 4 * C)),
        add_replicated_param(p + "mlp.c_proj.bias", {C}, 0, i)};
    blocks_.push_back(std::move(b));
  }
  norm_f_ = {add_replicated_param("transformer.ln_f.weight", {C}, kOnes, -1),
             add_replicated_param("transformer.ln_f.bias", {C}, 0, -1), "ln_f", eps};
  head_ = {cfg_.tie_word_embeddings
               ? embedding_.wte
               : add_split_param("lm_head.weight", {V, C}, kStd, -1, tp.vocab(V)),
           -1};
}

nlohmann::json GptModel::hyper() const {
  nlohmann::json h = {{"family", family()}};
  for (const auto& f : gpt_hyper_fields()) h[std::string(f.key)] = hyper_value(cfg_, f);
  h["seq_len"] = cfg_.seq_len;
  h["num_params"] = num_params();
  add_config_file(h, cfg_.file);
  return h;
}

}  // namespace memtrade
