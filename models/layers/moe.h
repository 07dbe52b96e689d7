// Mixture-of-experts MLP, dropless (HF transformers 4.46.3: MixtralSparseMoeBlock in
// models/mixtral/modeling_mixtral.py, Qwen2MoeSparseMoeBlock in models/qwen2_moe/
// modeling_qwen2_moe.py):
//
//   logits (N, E) = gate(x)                         router, nn.Linear(C, E, bias=False)
//   p      (N, E) = softmax(logits) in fp32         F.softmax(router_logits, dim=1, dtype=float)
//   w, sel (N, k) = topk(p, k)                      k = num_experts_per_tok
//   w            /= Σ_k w      (Mixtral always; Qwen2-MoE when norm_topk_prob)
//   out    (N, C) = Σ_e index_add(tokens_e, expert_e(x[tokens_e]) · w[tokens_e])
//   Qwen2-MoE:   += sigmoid(shared_expert_gate(x)) · shared_expert(x)    gate (1, C)
//
// Each expert (and the shared one) is a SwiGLU MLP (layers/llama_mlp.h: Mixtral's w1/w3/w2 are
// gate/up/down). Every token reaches its k experts (no capacity, no dropping): expert e runs on
// the n_e tokens routed to it, so the activations depend on the data (the histogram n_e).
//
// Routing runs on the host: p is read back, top-k taken there (HF's torch.topk; a tie keeps the
// lower expert), and the token lists uploaded as I32 indices; gather and index_add are the
// embedding ops (a row lookup, and its scatter-add backward). The row products with the routing
// weights and the shared expert's sigmoid gate (and their backward) are computed on the host too:
// no kernel of their own. On a device that holds no data (the estimator) the histogram comes
// from a MoeRouting plan instead, and the same tensors are made.
//
// Saved per MoE layer (keys "moe.*"): "moe.inp" (N, C) (the router's input, in linear's dtype,
// also what the experts gather from), "moe.probs" (N, E) fp32 (softmax's output), per expert e
// with n_e > 0: "moe.e{e}.idx" (1, n_e) I32, its SwiGLU's own (prefix "moe.e{e}.", input the
// gathered (n_e, C)), and "moe.e{e}.y" (n_e, C) (its output, which the weight's gradient reads);
// Qwen2-MoE: the shared expert's (prefix "moe.shared.", its input "moe.inp" itself),
// "moe.shared.y" (N, C) and "moe.shared.sig" (N, 1).
//
// Expert parallelism (LayerCtx::ep, kernels/parallel_state.h): the model holds its ep rank's
// E / ep experts; the router and routing stay local, the (token, slot) rows go to their experts'
// ranks by all_to_all(v) and the outputs come back the same way (moe.cpp's experts_forward_ep has
// the layout). Saved then: "moe.ep.idx" (1, N·k) I32 (the rows sent, expert-major) and "moe.ep.y"
// (N·k, C) (their returned outputs), and per local expert with rows received "moe.e{e}.idx"
// (1, n_e) I32 (its rows of the receive buffer) and its SwiGLU's own.
//
// The load-balancing loss (load_balancing_loss_func, Switch Transformer eq. 4-6) over the MoE
// layers' N·L rows: aux = E · Σ_e f_e · P_e, f_e the fraction of routed (token, slot) pairs that
// chose e, P_e the mean of p[:, e]. HF adds router_aux_loss_coef · aux to the loss only when
// config.output_router_logits is true (MixtralForCausalLM.forward); its gradient reaches every
// p[n, e] as coef · E · f_e / (L·N) (f has no gradient: one_hot), the decoder adds it to each
// loss row (models/families/decoder.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/layers/llama_mlp.h"

namespace memtrade {

// Expert parallelism: the model of ep rank `rank` of `size` holds experts
// [rank·E/size, (rank+1)·E/size) of each MoE layer.
struct EpSplit {
  int size = 1;
  int rank = 0;
};

struct Moe {
  Linear gate{};                    // router (E, C)
  std::vector<LlamaMlp> experts{};  // this rank's E / ep; empty: this layer is dense
  int num_experts = 0;              // E, every rank's
  int first_expert = 0;             // experts[i] is expert first_expert + i
  LlamaMlp shared{};                // Qwen2-MoE's shared_expert; down_proj.weight -1: none
  Linear shared_gate{};             // (1, C)
  int top_k = 2;
  bool norm_topk_prob = true;
  int index = 0;  // among the model's MoE layers

  bool enabled() const { return !experts.empty(); }
  bool has_shared() const { return shared.down_proj.weight >= 0; }
};

// Where the estimator's histogram comes from (`--moe-routing`): balanced (each expert
// N·k/E tokens, the remainder one more to the first ones), worst (dropless worst case: every
// token on experts 0..k-1) or the measured tokens_per_expert [micro-batch][layer][expert] of a
// results file (micro-batch i of a step takes entry i mod its count).
// Under expert parallelism every rank of the ep group routes its own tokens: balanced and worst
// plan the same histogram for each, measured may hold one per ep rank (by_rank[ep rank], each
// as tokens_per_expert; empty: tokens_per_expert for every rank).
struct MoeRouting {
  using Histograms = std::vector<std::vector<std::vector<std::int64_t>>>;  // [mb][layer][expert]
  enum class Kind { balanced, worst, measured } kind = Kind::balanced;
  Histograms tokens_per_expert{};
  std::vector<Histograms> by_rank{};
  // A multi-rank run's histograms of every world rank (results' tokens_per_expert_by_rank),
  // from which for_rank() picks one rank's ep group.
  std::vector<Histograms> by_world_rank{};
  std::string source{};  // "balanced", "worst" or the file

  // The histogram of ep rank `rank`'s tokens.
  std::vector<std::int64_t> plan(std::int64_t micro_batch, int layer, std::int64_t tokens,
                                 int experts, int top_k, int rank = 0) const;
  // This routing as world rank `world_rank` of tp × dp ranks (ep per group) sees it: where
  // by_world_rank holds that many ranks, by_rank becomes the histograms of its ep group in
  // ep-rank order (with ep 1, its own); otherwise it is unchanged (a file measured on another
  // number of ranks: its rank 0's histograms for every rank, which `source` then says).
  MoeRouting for_rank(int world_rank, int tp, int dp, int ep) const;
};

// The routing of the micro-batch in flight, per MoE layer, and the measured histograms. One per
// model; forward fills it, backward reads it.
class MoeState {
 public:
  int layers = 0;  // MoE layers in the model
  int num_experts = 0;
  double aux_coef = 0.0;  // router_aux_loss_coef when output_router_logits, else 0
  MoeRouting routing{};   // used on devices that hold no data

  struct Route {
    std::vector<std::vector<std::int32_t>> rows;  // per expert: its tokens, slot-major (HF)
    std::vector<std::vector<int>> slots;          // the slot of each
    std::vector<float> topk_p;                    // (N, k) the chosen probabilities
    std::vector<float> weights;                   // (N, k) after the renormalisation
    std::vector<int> topk_e;                      // (N, k)
    std::vector<double> prob_sum;                 // (E) Σ_n p[n, e]
    std::vector<std::int64_t> counts;             // (E) n_e
  };
  std::vector<Route> route{};  // per MoE layer, this micro-batch
  std::int64_t micro_batch = -1;
  std::int64_t tokens = 0;  // N of this micro-batch
  float dloss = 0.0f;       // the trainer's dL/dloss_row, for the aux loss's gradient
  // What this micro-batch's MoE layers saved for backward (bytes, all layers): the router's
  // (its input and p), the dispatch's (token indices, gathered inputs, expert outputs), the
  // experts' SwiGLU and the shared expert's.
  struct Saved {
    std::int64_t router = 0, dispatch = 0, experts = 0, shared = 0;
  } saved;
  // Every forward's histogram, [micro-batch][layer][expert], in order.
  MoeRouting::Histograms history{};

  bool enabled() const { return layers > 0; }
  // The histograms of the last step's forwards: its `micro_batches` last entries of history
  // (what results record as moe_routing).
  MoeRouting::Histograms last_step(std::int64_t micro_batches) const;
  void begin_micro_batch(std::int64_t tokens);
  double aux_loss() const;  // E · Σ_e f_e · P_e of this micro-batch (0 on a meta device)
};

// inp (N, C) (the post-attention norm's output) -> returns (N, C) in inp's dtype (fp32 under
// autocast: index_add into zeros of hidden_states' dtype), a temporary.
Tensor moe_forward(LayerCtx& c, Tensor inp, const Moe& m, MoeState& s);
// dout (N, C) -> returns dL/dinp (N, C), a temporary in the router's input dtype.
Tensor moe_backward(LayerCtx& c, const Tensor& dout, const Moe& m, MoeState& s);

}  // namespace memtrade
