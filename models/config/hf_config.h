// The user's own model: a Hugging Face config.json (`--model-config FILE`, grid key
// model_config) read into the family config memtrade builds from it.
//
// Architectures (the config's "architectures"): LlamaForCausalLM and the families that are it with
// another mapping (Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, Phi3ForCausalLM,
// Gemma2ForCausalLM), and GPT2LMHeadModel.
//   LlamaForCausalLM: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
//     vocab_size, max_position_embeddings (required); num_key_value_heads (default: the heads),
//     rope_theta (10000), rms_norm_eps (1e-6), tie_word_embeddings (false), head_dim (default
//     hidden_size / num_attention_heads; another value makes the projections NH·head_dim wide, as
//     LlamaAttention's getattr(config, "head_dim", ...)), rope_scaling (null, type "default", or
//     type "llama3" with factor, low_freq_factor, high_freq_factor,
//     original_max_position_embeddings), attention_bias (false: q, k, v and o_proj), mlp_bias
//     (false) — the defaults are HF's LlamaConfig's.
//   Qwen2ForCausalLM: the same keys (no attention_bias or mlp_bias: q/k/v biases always, none
//     elsewhere; head_dim, if given, must be hidden_size / num_attention_heads);
//     use_sliding_window must be false (sliding_window, max_window_layers ignored, as HF does
//     then).
//   Qwen3ForCausalLM (transformers 4.51.0 modeling_qwen3.py; 4.46.3 lacks it): Llama's keys
//     (attention_bias: q, k, v and o_proj; head_dim default 128, Qwen3Config's) plus q_norm and
//     k_norm per layer; use_sliding_window must be false, as Qwen2's.
//   MistralForCausalLM: Llama's keys without biases or rope_scaling (MistralRotaryEmbedding reads
//     none; the key is ignored as HF ignores it), and sliding_window (default 4096, null: none):
//     every layer's mask is banded to the last sliding_window keys; memtrade runs the model for
//     seq_len <= sliding_window, where the band is the whole causal triangle, and refuses longer
//     sequences (no banded mask yet).
//   Phi3ForCausalLM: Llama's keys (rms_norm_eps default 1e-5) with q/k/v fused into qkv_proj and
//     gate/up into gate_up_proj; sliding_window as Mistral's (default none); rope_scaling must be
//     null (longrope is not modelled); embd_pdrop, resid_pdrop and attention_dropout must be 0.
//   Gemma2ForCausalLM (transformers 4.46.3 modeling_gemma2.py): Llama's keys with Gemma2Config's
//     defaults (head_dim 256, tie_word_embeddings true, attention_bias false: q, k, v and o_proj),
//     hidden_activation gelu_pytorch_tanh (GeGLU; hidden_act is not read), (1 + w) RMSNorms,
//     four per layer, embeddings · √hidden_size, query_pre_attn_scalar (224: scores ·
//     query_pre_attn_scalar^-0.5), attn_logit_softcapping (50) and final_logit_softcapping (30;
//     null: none), sliding_window (4096) on the even layers, checked as Mistral's. Flash attention
//     with soft-capping (or a scale other than 1/√head_dim) and tensor parallelism are refused.
//   MixtralForCausalLM and Qwen2MoeForCausalLM (transformers 4.46.3 modeling_mixtral.py,
//     modeling_qwen2_moe.py): Mistral's and Qwen2's keys, with the mixture-of-experts block of
//     models/layers/moe.h in place of the MLP (the keys read are listed at moe_from in
//     hf_config.cpp); router_jitter_noise other than 0 and tensor parallelism are refused.
//   GPT2LMHeadModel: n_embd, n_layer, n_head, vocab_size, n_positions (required);
//     layer_norm_epsilon (1e-5), tie_word_embeddings (true).
// Keys that would change the math memtrade does not model are refused: another hidden_act or
// activation_function, attention_dropout > 0 (Phi-3: any dropout), Qwen2's use_sliding_window, a
// sliding window shorter than the sequence, another rope_scaling type, n_inner other than 4·n_embd,
// scale_attn_weights false, scale_attn_by_inverse_layer_idx true. Keys that change neither training
// memory nor the math are ignored (token ids, torch_dtype, use_cache, initializer_range,
// pretraining_tp, ...), and so are GPT-2's dropout probabilities: memtrade's models train without
// dropout. Every problem is one line (std::invalid_argument); the CLI exits 2 with it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "models/families/gpt.h"
#include "models/families/llama.h"

namespace memtrade {

using HfModelConfig = std::variant<GptConfig, LlamaConfig>;

// `text` is a config.json's content; `file` names it (its stem becomes the model's name and
// file.sha256 is kept as given).
HfModelConfig parse_hf_config(std::string_view text, const ConfigFile& file);
// Reads `path`: the model is named after the file's stem, file.sha256 = SHA-256 of its bytes.
HfModelConfig read_hf_config(const std::string& path);
// How many times read_hf_config has been called in this process: tests prove that a command
// reads its config file once (models/model_desc.h).
std::uint64_t hf_config_reads();

}  // namespace memtrade
