#include "models/families/llama.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace memtrade {

RopeConfig LlamaConfig::rope() const {
  return {rope_theta, rope_scaling.factor, rope_scaling.low_freq_factor,
          rope_scaling.high_freq_factor, rope_scaling.original_max_position_embeddings};
}

bool LlamaConfig::moe_layer(int i) const {
  // Qwen2MoeDecoderLayer: (layer_idx not in mlp_only_layers) and num_experts > 0 and
  // (layer_idx + 1) % decoder_sparse_step == 0; Mixtral's step 1 and no list make every layer.
  return num_experts > 0 && (i + 1) % decoder_sparse_step == 0 &&
         std::find(mlp_only_layers.begin(), mlp_only_layers.end(), i) == mlp_only_layers.end();
}

const std::vector<HyperField<LlamaConfig>>& llama_hyper_fields() {
  static const std::vector<HyperField<LlamaConfig>> fields = {
      {"n_layer", &LlamaConfig::n_layer},
      {"n_head", &LlamaConfig::n_head},
      {"n_kv_head", &LlamaConfig::n_kv_head},
      {"n_embd", &LlamaConfig::n_embd},
      {"intermediate_size", &LlamaConfig::intermediate_size},
      {"vocab_size", &LlamaConfig::vocab_size},
      {"block_size", &LlamaConfig::block_size},
      {"rope_theta", &LlamaConfig::rope_theta},
      {"norm_eps", &LlamaConfig::norm_eps},
      {"tie_word_embeddings", &LlamaConfig::tie_word_embeddings},
      {"qkv_bias", &LlamaConfig::qkv_bias},
      {"o_bias", &LlamaConfig::o_bias},
      {"mlp_bias", &LlamaConfig::mlp_bias},
      {"sliding_window", &LlamaConfig::sliding_window},
      {"fused_qkv", &LlamaConfig::fused_qkv},
      {"fused_gate_up", &LlamaConfig::fused_gate_up},
      {"qk_norm", &LlamaConfig::qk_norm},
      {"gemma_norms", &LlamaConfig::gemma_norms},
      {"geglu", &LlamaConfig::geglu},
      {"embed_scale", &LlamaConfig::embed_scale},
      {"query_pre_attn_scalar", &LlamaConfig::query_pre_attn_scalar},
      {"attn_softcap", &LlamaConfig::attn_softcap},
      {"final_softcap", &LlamaConfig::final_softcap},
  };
  return fields;
}

LlamaModel::LlamaModel(LlamaConfig cfg, TpSplit tp, EpSplit ep) : cfg_(std::move(cfg)), ep_(ep) {
  check_bounds(cfg_.name, {{"n_layer", cfg_.n_layer, kMaxLayers},
                           {"n_head", cfg_.n_head, kMaxHeads},
                           {"n_kv_head", cfg_.n_kv_head, kMaxHeads},
                           {"n_embd", cfg_.n_embd, kMaxHidden},
                           {"intermediate_size", cfg_.intermediate_size, kMaxIntermediate},
                           {"vocab_size", cfg_.vocab_size, kMaxVocab},
                           {"block_size", cfg_.block_size, kMaxPositions}});
  const auto bad = [&](const std::string& what) {
    return std::invalid_argument(fmt::format("{}: {}", cfg_.name, what));
  };
  if (cfg_.sliding_window < 0)
    throw bad(fmt::format("sliding_window {} must be at least 0 (0: none)", cfg_.sliding_window));
  // A sliding window bands nothing in sequences up to its length, and memtrade has no banded mask:
  // the model takes sequences up to min(block_size, sliding_window) (its max_seq_len and default
  // seq_len), and a longer one is refused naming the key.
  if (cfg_.sliding_window > 0 && cfg_.seq_len > cfg_.sliding_window)
    throw bad(fmt::format(
        "sliding_window {} is shorter than seq_len {}: memtrade's attention is causal over the "
        "whole sequence (no banded mask), which is the window's only for seq_len <= {}",
        cfg_.sliding_window, cfg_.seq_len, cfg_.sliding_window));
  set_sequence(
      cfg_.name, cfg_.seq_len,
      cfg_.sliding_window > 0 ? std::min(cfg_.block_size, cfg_.sliding_window) : cfg_.block_size,
      cfg_.vocab_size);
  cfg_.seq_len = static_cast<int>(rows_per_sample());
  if (cfg_.head_dim < 0 || cfg_.head_dim > kRopeMaxHeadDim)
    throw bad(fmt::format("head_dim {} must be in [0, {}] (0: n_embd / n_head)", cfg_.head_dim,
                          kRopeMaxHeadDim));
  if (cfg_.head_dim == 0 && cfg_.n_embd % cfg_.n_head != 0)
    throw bad(fmt::format("n_embd {} not divisible by n_head {}", cfg_.n_embd, cfg_.n_head));
  if (cfg_.n_head % cfg_.n_kv_head != 0)
    throw bad(fmt::format("n_head {} not divisible by n_kv_head {} (grouped-query attention)",
                          cfg_.n_head, cfg_.n_kv_head));
  const std::int64_t hd = cfg_.hd();
  if (hd % 2 != 0 || hd > kRopeMaxHeadDim)
    throw bad(fmt::format("head_dim {} must be even and at most {} (rotary embeddings)", hd,
                          kRopeMaxHeadDim));
  try {
    (void)rope_inv_freq(hd, cfg_.rope());
  } catch (const std::invalid_argument& e) {
    throw bad(e.what());
  }

  // Mixture of experts (layers/moe.h): the experts are whole on every rank, and splitting them
  // (expert or tensor parallelism) is not modelled yet.
  if (tp.size > 1 && cfg_.num_experts > 0)
    throw bad(
        fmt::format("tensor parallelism with mixture-of-experts (num_experts {}) is not "
                    "modelled",
                    cfg_.num_experts));
  if (cfg_.num_experts > 0 && (cfg_.top_k < 1 || cfg_.top_k > cfg_.num_experts))
    throw bad(fmt::format("num_experts_per_tok {} must be in [1, num_experts {}]", cfg_.top_k,
                          cfg_.num_experts));
  // Expert parallelism (layers/moe.h): each ep rank holds num_experts / ep whole experts.
  if (ep.size < 1 || ep.rank < 0 || ep.rank >= ep.size)
    throw bad(fmt::format("ep rank {} of {}", ep.rank, ep.size));
  if (ep.size > 1 && cfg_.num_experts == 0)
    throw bad(fmt::format("expert_parallel {}: the model has no experts", ep.size));
  if (cfg_.num_experts % ep.size != 0)
    throw bad(
        fmt::format("num_experts {} does not split over expert_parallel {} (a multiple is "
                    "required, as Megatron-core's num_moe_experts % ep)",
                    cfg_.num_experts, ep.size));
  if (cfg_.decoder_sparse_step < 1)
    throw bad(fmt::format("decoder_sparse_step {} must be at least 1", cfg_.decoder_sparse_step));
  // Phi-3's fused qkv_proj and gate_up_proj interleave what tensor parallelism splits (q, k, v;
  // gate, up) in one weight, and Qwen3's per-head q/k norms are replicated weights whose
  // gradients differ per rank (each rank normalises its own heads): neither is modelled yet.
  for (const auto& [key, v] : {std::pair{"query_pre_attn_scalar", cfg_.query_pre_attn_scalar},
                               {"attn_softcap", cfg_.attn_softcap},
                               {"final_softcap", cfg_.final_softcap}})
    if (!(v >= 0.0) || !std::isfinite(v))
      throw bad(fmt::format("{} {} must be finite and at least 0 (0: none)", key, v));
  // Gemma 2's soft-capped logits and sandwich norms are not split over tp ranks yet.
  if (tp.size > 1 && (cfg_.gemma_norms || cfg_.attn_softcap > 0 || cfg_.final_softcap > 0))
    throw bad("tensor parallelism of Gemma 2 (soft-capping, post-norms) is not modelled");
  if (tp.size > 1 && (cfg_.fused_qkv || cfg_.fused_gate_up || cfg_.qk_norm))
    throw bad(fmt::format(
        "tensor parallelism with {} is not modelled",
        cfg_.qk_norm ? "per-head q/k norms (Qwen3)" : "fused qkv_proj / gate_up_proj (Phi-3)"));
  set_split(cfg_.name, tp,
            {{"n_head", cfg_.n_head},
             {"n_kv_head", cfg_.n_kv_head},
             {"intermediate_size", cfg_.intermediate_size}},
            cfg_.vocab_size);
  const std::int64_t C = cfg_.n_embd, V = cfg_.vocab_size, I = cfg_.intermediate_size;
  const std::int64_t NH = cfg_.n_head, NKV = cfg_.n_kv_head;
  const auto eps = static_cast<float>(cfg_.norm_eps);
  constexpr float kStd = 0.02f;  // initializer_range
  constexpr float kOnes = -1.0f;
  // A norm's weight: ones (w), or Gemma's zeros (1 + w).
  const float norm_init = cfg_.gemma_norms ? 0.0f : kOnes;
  const auto norm = [&](const std::string& name, const std::string& key, int block) {
    return RmsNorm{add_replicated_param(name + ".weight", {C}, norm_init, block), key, eps,
                   cfg_.gemma_norms};
  };
  if (cfg_.embed_scale) embedding_.scale = static_cast<float>(std::sqrt(static_cast<double>(C)));
  final_softcap_ = static_cast<float>(cfg_.final_softcap);
  // Tensor parallelism (decoder.h): q, k, v, gate and up split by rows (KV heads too), o_proj and
  // down_proj by columns, the vocabulary of embed_tokens and lm_head; the norms and the o/down
  // biases whole.
  embedding_.wte = add_split_param("model.embed_tokens.weight", {V, C}, kStd, -1, tp.vocab(V));
  for (int i = 0; i < cfg_.n_layer; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    Block b;
    // A bias follows its weight (HF's named_parameters order); biases start at zero (HF's
    // _init_weights).
    const auto bias = [&](bool has, const std::string& name, std::int64_t n) {  // split rows
      return has ? add_split_param(p + name, {n}, 0, i, tp.even(0, n)) : ParamIndex{-1};
    };
    const auto row_bias = [&](bool has, const std::string& name, std::int64_t n) {  // whole
      return has ? add_replicated_param(p + name, {n}, 0, i) : ParamIndex{-1};
    };
    if (cfg_.fused_qkv) {  // Phi-3's qkv_proj: the packed layout the attention ops take (tp 1)
      const std::int64_t W = (NH + 2 * NKV) * hd;
      b.attn.c_attn = {add_replicated_param(p + "self_attn.qkv_proj.weight", {W, C}, kStd, i),
                       row_bias(cfg_.qkv_bias, "self_attn.qkv_proj.bias", W)};
    } else {
      const ParamIndex q = add_split_param(p + "self_attn.q_proj.weight", {NH * hd, C}, kStd, i,
                                           tp.even(0, NH * hd));
      const ParamIndex qb = bias(cfg_.qkv_bias, "self_attn.q_proj.bias", NH * hd);
      const ParamIndex k = add_split_param(p + "self_attn.k_proj.weight", {NKV * hd, C}, kStd, i,
                                           tp.even(0, NKV * hd));
      const ParamIndex kb = bias(cfg_.qkv_bias, "self_attn.k_proj.bias", NKV * hd);
      const ParamIndex v = add_split_param(p + "self_attn.v_proj.weight", {NKV * hd, C}, kStd, i,
                                           tp.even(0, NKV * hd));
      const ParamIndex vb = bias(cfg_.qkv_bias, "self_attn.v_proj.bias", NKV * hd);
      b.attn.qkv_proj.parts = {q, k, v};
      if (cfg_.qkv_bias) b.attn.qkv_proj.biases = {qb, kb, vb};
    }
    const ParamIndex o =
        add_split_param(p + "self_attn.o_proj.weight", {C, NH * hd}, kStd, i, tp.even(1, NH * hd));
    b.attn.c_proj = {o, row_bias(cfg_.o_bias, "self_attn.o_proj.bias", C)};
    b.attn.n_head = cfg_.n_head / tp.size;
    b.attn.n_kv_head = cfg_.n_kv_head / tp.size;
    b.attn.rope = cfg_.rope();
    // Every HF family's eager attention (modeling_llama.py LlamaAttention.forward, and Mistral's,
    // Qwen2's, Gemma2's, Phi3's, Mixtral's, Qwen2-MoE's alike in 4.46.3): softmax(attn_weights,
    // dim=-1, dtype=torch.float32).to(query_states.dtype).
    b.attn.softmax_fp32 = true;
    // transformers 4.46.3: LlamaModel, Qwen2Model and Qwen2MoeModel (and 4.51.0's Qwen3Model)
    // make the rotary tables once per forward from the fp32 hidden states; MistralAttention,
    // Phi3Attention, Gemma2Attention and MixtralAttention per layer from value_states.
    const std::string& arch = cfg_.architecture;
    b.attn.rope_tables_fp32 = arch == "LlamaForCausalLM" || arch == "Qwen2ForCausalLM" ||
                              arch == "Qwen2MoeForCausalLM" || arch == "Qwen3ForCausalLM";
    b.attn.scores.softcap = static_cast<float>(cfg_.attn_softcap);
    if (cfg_.query_pre_attn_scalar > 0)
      b.attn.scores.scale = static_cast<float>(1.0 / std::sqrt(cfg_.query_pre_attn_scalar));
    b.mlp.gelu = cfg_.geglu;
    if (cfg_.qk_norm)  // Qwen3's per-head norms (tp 1)
      b.attn.qk_norm =
          QkNorm{add_replicated_param(p + "self_attn.q_norm.weight", {hd}, kOnes, i),
                 add_replicated_param(p + "self_attn.k_norm.weight", {hd}, kOnes, i), eps};
    if (cfg_.moe_layer(i)) {
      add_moe(b.moe, p + cfg_.moe_prefix, i);
    } else if (cfg_.fused_gate_up) {  // Phi-3's gate_up_proj (tp 1)
      const ParamIndex gu =
          add_replicated_param(p + "mlp.gate_up_proj.weight", {2 * I, C}, kStd, i);
      b.mlp.gate_up_proj = {gu, row_bias(cfg_.mlp_bias, "mlp.gate_up_proj.bias", 2 * I)};
      b.mlp.down_proj = {
          add_split_param(p + "mlp.down_proj.weight", {C, I}, kStd, i, tp.even(1, I)),
          row_bias(cfg_.mlp_bias, "mlp.down_proj.bias", C)};
    } else {
      const ParamIndex gate =
          add_split_param(p + "mlp.gate_proj.weight", {I, C}, kStd, i, tp.even(0, I));
      b.mlp.gate_proj = {gate, bias(cfg_.mlp_bias, "mlp.gate_proj.bias", I)};
      const ParamIndex up =
          add_split_param(p + "mlp.up_proj.weight", {I, C}, kStd, i, tp.even(0, I));
      b.mlp.up_proj = {up, bias(cfg_.mlp_bias, "mlp.up_proj.bias", I)};
      b.mlp.down_proj = {
          add_split_param(p + "mlp.down_proj.weight", {C, I}, kStd, i, tp.even(1, I)),
          row_bias(cfg_.mlp_bias, "mlp.down_proj.bias", C)};
    }
    b.norm_1 = norm(p + "input_layernorm", "input_layernorm", i);
    if (cfg_.gemma_norms) {  // Gemma2DecoderLayer's order of registration
      // The branches' outputs are the post-norms' saved inputs (under autocast their fp32 casts
      // are, and the 16-bit outputs go once cast: models/families/decoder.cpp).
      b.attn.output_saved = b.mlp.output_saved = true;
      b.norm_2 = norm(p + "pre_feedforward_layernorm", "pre_feedforward_layernorm", i);
      b.post_2 = norm(p + "post_feedforward_layernorm", "post_feedforward_layernorm", i);
      b.post_1 = norm(p + "post_attention_layernorm", "post_attention_layernorm", i);
    } else {
      b.norm_2 = norm(p + "post_attention_layernorm", "post_attention_layernorm", i);
    }
    blocks_.push_back(std::move(b));
  }
  if (cfg_.num_experts > 0) {
    for (const Block& b : blocks_) moe_.layers += b.moe.enabled() ? 1 : 0;
    moe_.num_experts = cfg_.num_experts;
    moe_.aux_coef = cfg_.router_aux_loss_coef;
  }
  norm_f_ = norm("model.norm", "norm", -1);
  head_ = {cfg_.tie_word_embeddings
               ? embedding_.wte
               : add_split_param("lm_head.weight", {V, C}, kStd, -1, tp.vocab(V)),
           -1};
}

// A MoE layer's parameters in HF's named_parameters order: gate, each expert's (Mixtral: w1, w2,
// w3; Qwen2-MoE: gate_proj, up_proj, down_proj), then Qwen2-MoE's shared_expert and
// shared_expert_gate. Normal(0, initializer_range), no biases (tp 1: refused above).
void LlamaModel::add_moe(Moe& m, const std::string& p, int block) {
  constexpr float kStd = 0.02f;
  const std::int64_t C = cfg_.n_embd, E = cfg_.num_experts, I = cfg_.moe_intermediate_size;
  m.top_k = cfg_.top_k;
  m.norm_topk_prob = cfg_.norm_topk_prob;
  m.index = moe_count_++;
  m.gate = {add_param(p + "gate.weight", {E, C}, kStd, block), -1};
  const auto swiglu = [&](LlamaMlp& mlp, const std::string& q, std::int64_t width) {
    if (cfg_.expert_names_w) {
      mlp.gate_proj = {add_param(q + "w1.weight", {width, C}, kStd, block), -1};
      mlp.down_proj = {add_param(q + "w2.weight", {C, width}, kStd, block), -1};
      mlp.up_proj = {add_param(q + "w3.weight", {width, C}, kStd, block), -1};
    } else {
      mlp.gate_proj = {add_param(q + "gate_proj.weight", {width, C}, kStd, block), -1};
      mlp.up_proj = {add_param(q + "up_proj.weight", {width, C}, kStd, block), -1};
      mlp.down_proj = {add_param(q + "down_proj.weight", {C, width}, kStd, block), -1};
    }
  };
  // Expert parallelism: this ep rank's experts [first, first + E / ep), their HF names and
  // (ParamSpec::init_index) initial values those of ep 1; the others' three weights skipped.
  const int local = static_cast<int>(E) / ep_.size;
  m.num_experts = static_cast<int>(E);
  m.first_expert = ep_.rank * local;
  m.experts.resize(static_cast<std::size_t>(local));
  for (int e = 0; e < E; ++e) {
    if (e < m.first_expert || e >= m.first_expert + local) {
      skip_params(3);
      continue;
    }
    LlamaMlp& x = m.experts[static_cast<std::size_t>(e - m.first_expert)];
    x.key = fmt::format("moe.e{}.", e);
    // Times its routing weight: the product's backward reads it (under ep, the copy returned to
    // the token's rank is what is kept).
    x.output_saved = ep_.size == 1;
    swiglu(x, fmt::format("{}experts.{}.", p, e), I);
    for (ParamIndex w : {x.gate_proj.weight, x.up_proj.weight, x.down_proj.weight})
      mutable_param(w).expert = ep_.size > 1;
  }
  if (cfg_.shared_expert_intermediate_size > 0) {
    m.shared.key = "moe.shared.";
    m.shared.input_key = "moe.inp";
    m.shared.output_saved = true;
    swiglu(m.shared, p + "shared_expert.", cfg_.shared_expert_intermediate_size);
    m.shared_gate = {add_param(p + "shared_expert_gate.weight", {1, C}, kStd, block), -1};
  }
}

nlohmann::json LlamaModel::hyper() const {
  nlohmann::json h = {{"family", family()}};
  for (const auto& f : llama_hyper_fields()) h[std::string(f.key)] = hyper_value(cfg_, f);
  h["head_dim"] = cfg_.hd();
  h["architecture"] = cfg_.architecture;
  const Llama3RopeScaling& s = cfg_.rope_scaling;
  h["rope_scaling"] =
      s.factor > 0
          ? nlohmann::json{{"rope_type", "llama3"},
                           {"factor", s.factor},
                           {"low_freq_factor", s.low_freq_factor},
                           {"high_freq_factor", s.high_freq_factor},
                           {"original_max_position_embeddings", s.original_max_position_embeddings}}
          : nlohmann::json(nullptr);
  h["seq_len"] = cfg_.seq_len;
  if (cfg_.num_experts > 0)
    h["moe"] = {{"num_experts", cfg_.num_experts},
                {"top_k", cfg_.top_k},
                {"moe_intermediate_size", cfg_.moe_intermediate_size},
                {"shared_expert_intermediate_size", cfg_.shared_expert_intermediate_size},
                {"norm_topk_prob", cfg_.norm_topk_prob},
                {"decoder_sparse_step", cfg_.decoder_sparse_step},
                {"mlp_only_layers", cfg_.mlp_only_layers},
                {"router_aux_loss_coef", cfg_.router_aux_loss_coef},
                {"moe_layers", moe_count_}};
  h["num_params"] = num_params();
  add_config_file(h, cfg_.file);
  return h;
}

}  // namespace memtrade
