// Llama (HF transformers' LlamaForCausalLM), and the families that are it with another mapping
// of their config.json (models/config/hf_config.h: Qwen2, Mistral, Phi-3, Qwen3, Gemma 2): token
// embedding (no positions), n_layer decoder layers (x += self_attn(input_layernorm(x)); x +=
// mlp(post_attention_layernorm(x))), a final RMSNorm and lm_head, untied or tied to embed_tokens
// (tie_word_embeddings). Attention is grouped-query (n_kv_head key/value heads shared by n_head /
// n_kv_head query heads each, HF's repeat_kv) with rotary position embeddings on q and k
// (rotate_half, rope_theta, and rope_scaling of type llama3 for Llama 3.1/3.2); the MLP is SwiGLU
// (gate_proj, up_proj, down_proj, intermediate_size); RMSNorm eps rms_norm_eps; no dropout. Biases
// where the config asks: Llama's attention_bias (q, k, v and o_proj) and mlp_bias (gate, up, down),
// and Qwen2's q/k/v biases (Qwen2ForCausalLM is this model with qkv_bias and nothing else
// different: transformers 4.46.3 modeling_qwen2.py, q/k/v_proj bias=True, o_proj and the MLP
// bias=False).
//
// Parameter names are HF's state-dict keys, so a memtrade dump loads into LlamaForCausalLM
// as is: model.embed_tokens.weight, model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
// model.layers.{i}.mlp.{gate,up,down}_proj.weight (and .bias where the config has them),
// model.layers.{i}.{input,post_attention}_layernorm.weight, model.norm.weight, lm_head.weight
// (absent when tied, as GPT's). Layouts are nn.Linear's (out, in). Init as HF's _init_weights:
// normal(0, 0.02) (initializer_range) for every matrix, RMSNorm weights 1.
//
// Gemma 2 adds model.layers.{i}.{pre,post}_feedforward_layernorm.weight; its norms start at 0
// (Gemma2RMSNorm's torch.zeros, which _init_weights leaves alone) and lm_head is tied.
//
// What each layer saves: models/layers/{rmsnorm,attention,llama_mlp}.h; the block and head:
// models/families/decoder.h. Forward, backward and FLOPs are the decoder's. The llama_layers knob
// says whose saved tensors those are: liger (the default) keeps what fused kernels keep
// (Liger-Kernel's RMSNorm and SwiGLU, RoPE in place, grouped-query attention without repeated
// K/V); hf-eager keeps, besides, what HF's eager modeling code (transformers 4.46.3) keeps under
// autograd, and frees it when autograd would. Only the bytes differ: the ops are the same, so
// the numbers are too (tests/models/test_llama_layers.cpp).
#pragma once

#include <string>
#include <vector>

#include "models/config/hyper_fields.h"
#include "models/families/decoder.h"

namespace memtrade {

// HF rope_scaling {"rope_type": "llama3", ...} (Llama 3.1/3.2); factor 0: no scaling.
struct Llama3RopeScaling {
  double factor = 0.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position_embeddings = 8192;
};

struct LlamaConfig {
  std::string name;
  int n_layer = 2;    // num_hidden_layers
  int n_head = 4;     // num_attention_heads
  int n_kv_head = 2;  // num_key_value_heads
  int n_embd = 64;    // hidden_size
  int intermediate_size = 176;
  int vocab_size = 256;
  int block_size = 32;  // max_position_embeddings
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;  // rms_norm_eps
  bool tie_word_embeddings = false;
  Llama3RopeScaling rope_scaling{};  // none
  int seq_len = 0;                   // T; 0 = block_size
  ConfigFile file{};                 // set when read from a config file
  // Last, so that the size table's positional rows stay as they are.
  bool qkv_bias = false;  // q_proj, k_proj, v_proj biases (Qwen2; Llama's attention_bias)
  bool o_bias = false;    // o_proj bias (Llama's attention_bias)
  bool mlp_bias = false;  // gate, up and down_proj biases (Llama's mlp_bias)
  std::string architecture = "LlamaForCausalLM";  // HF's class (models/config/hf_config.h)
  int head_dim = 0;        // 0: n_embd / n_head (Mistral's and Phi-3's head_dim key)
  int sliding_window = 0;  // 0: none. HF's window w: query i attends to keys j with
                           // i - w < j ≤ i; memtrade's attention is causal over the whole
                           // sequence, which is that band exactly when seq_len ≤ w (refused else)
  bool fused_qkv = false;  // Phi-3: one qkv_proj ((NH + 2·NKV)·hd, C), q rows, then k, then v
  bool fused_gate_up = false;  // Phi-3: one gate_up_proj (2I, C), gate rows first
  bool qk_norm = false;        // Qwen3: q_norm and k_norm, RMSNorms over head_dim before RoPE
  // Gemma 2 (transformers 4.46.3 modeling_gemma2.py): (1 + w) RMSNorms computed in fp32 with
  // post_attention_layernorm and post_feedforward_layernorm after each branch; GeGLU; the
  // embeddings times √n_embd; scores · query_pre_attn_scalar^-0.5 soft-capped by attn_softcap;
  // the logits soft-capped by final_softcap (0: none). Its sliding_window bands the even layers
  // (0, 2, ...) only; as above, memtrade takes sequences up to it.
  bool gemma_norms = false;
  bool geglu = false;
  bool embed_scale = false;
  double query_pre_attn_scalar = 0.0;  // 0: head_dim (1/√hd)
  double attn_softcap = 0.0;
  double final_softcap = 0.0;
  // Mixture of experts (Mixtral, Qwen2-MoE; models/layers/moe.h). 0 experts: every layer dense.
  int num_experts = 0;                      // num_local_experts (Mixtral), num_experts (Qwen2-MoE)
  int top_k = 2;                            // num_experts_per_tok
  int moe_intermediate_size = 0;            // each expert's I (Mixtral's: intermediate_size)
  int shared_expert_intermediate_size = 0;  // Qwen2-MoE's shared expert; 0: none
  bool norm_topk_prob = true;               // renormalise the top-k weights (Mixtral always)
  int decoder_sparse_step = 1;              // layer i is MoE when (i + 1) % step == 0 ...
  std::vector<int> mlp_only_layers{};       // ... and i is not listed here (Qwen2-MoE)
  double router_aux_loss_coef = 0.0;  // the loss adds coef · aux (0: output_router_logits off)
  std::string moe_prefix = "mlp.";    // Mixtral: "block_sparse_moe."
  bool expert_names_w = false;        // Mixtral's experts: w1 (gate), w2 (down), w3 (up)

  bool moe_layer(int i) const;

  int hd() const { return head_dim > 0 ? head_dim : n_embd / n_head; }

  RopeConfig rope() const;
};

// The hyper-parameters a model override may set (`llama-tiny:n_layer=4`), by hyper()'s keys.
const std::vector<HyperField<LlamaConfig>>& llama_hyper_fields();

class LlamaModel final : public DecoderModel<RmsNorm, LlamaMlp> {
 public:
  // Throws std::invalid_argument for shapes the layers cannot take (n_embd not a multiple of
  // n_head without a head_dim, n_head not of n_kv_head, an odd head_dim, a rope config HF would
  // divide by 0 with, a sliding window shorter than seq_len; tensor parallelism of fused
  // projections or per-head q/k norms).
  // tp: the tensor-parallel slice this model is (decoder.h); the whole model by default.
  explicit LlamaModel(LlamaConfig cfg, TpSplit tp = {}, EpSplit ep = {});
  std::string name() const override { return cfg_.name; }
  std::string family() const override { return "llama"; }
  nlohmann::json hyper() const override;

 private:
  void add_moe(Moe& m, const std::string& prefix, int block);

  LlamaConfig cfg_;
  EpSplit ep_{};
  int moe_count_ = 0;
};

}  // namespace memtrade
