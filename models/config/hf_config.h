// The user's own model: a Hugging Face config.json (`--model-config FILE`, grid key
// model_config) read into the family config memtrade builds from it.
//
// Architectures (the config's "architectures"): LlamaForCausalLM, Qwen2ForCausalLM (a Llama with
// q/k/v biases) and GPT2LMHeadModel.
//   LlamaForCausalLM: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
//     vocab_size, max_position_embeddings (required); num_key_value_heads (default: the heads),
//     rope_theta (10000), rms_norm_eps (1e-6), tie_word_embeddings (false), head_dim (must be
//     hidden_size / num_attention_heads), rope_scaling (null, type "default", or type "llama3"
//     with factor, low_freq_factor, high_freq_factor, original_max_position_embeddings),
//     attention_bias (false: q, k, v and o_proj), mlp_bias (false) — the defaults are HF's
//     LlamaConfig's.
//   Qwen2ForCausalLM: the same keys (no attention_bias or mlp_bias: q/k/v biases always, none
//     elsewhere); use_sliding_window must be false (sliding_window, max_window_layers ignored).
//   GPT2LMHeadModel: n_embd, n_layer, n_head, vocab_size, n_positions (required);
//     layer_norm_epsilon (1e-5), tie_word_embeddings (true).
// Keys that would change the math memtrade does not model are refused: another hidden_act or
// activation_function, attention_dropout > 0, Qwen2's use_sliding_window, another rope_scaling
// type, n_inner other than 4·n_embd, scale_attn_weights false, scale_attn_by_inverse_layer_idx
// true. Keys that change neither training memory nor the math are ignored (token ids, torch_dtype,
// use_cache, initializer_range, pretraining_tp, ...), and so are GPT-2's dropout probabilities:
// memtrade's models train without dropout. Every problem is one line (std::invalid_argument); the
// CLI exits 2 with it.
#pragma once

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

}  // namespace memtrade
