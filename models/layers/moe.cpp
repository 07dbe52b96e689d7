#include "models/layers/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "kernels/comm.h"
#include "kernels/parallel_state.h"

namespace memtrade {
namespace {

// v as a tensor of dtype t holds it (the rounding an op writing t makes).
float round_as(DType t, float v) {
  std::uint32_t buf = 0;
  store_from_float(&buf, t, 0, v);
  return load_as_float(&buf, t, 0);
}

std::int64_t nb(const Tensor& t) {
  return static_cast<std::int64_t>(t.nbytes());
}

std::string expert_key(int e, const char* what) {
  return fmt::format("moe.e{}.{}", e, what);
}

// HF's torch.topk(p, k) per row (values descending; of equal ones the lower expert first), then
// the renormalisation. Tokens are listed per expert slot-major, as torch.where(expert_mask[e])
// over (k, N) gives them.
void route_from_probs(MoeState::Route& r, const std::vector<float>& p, std::int64_t N, int E, int k,
                      bool renormalise) {
  r.topk_e.assign(static_cast<std::size_t>(N * k), 0);
  r.topk_p.assign(r.topk_e.size(), 0.0f);
  r.weights.assign(r.topk_e.size(), 0.0f);
  r.prob_sum.assign(static_cast<std::size_t>(E), 0.0);
  std::vector<int> order(static_cast<std::size_t>(E));
  for (std::int64_t n = 0; n < N; ++n) {
    const float* row = p.data() + n * E;
    for (int e = 0; e < E; ++e) r.prob_sum[static_cast<std::size_t>(e)] += row[e];
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [row](int a, int b) { return row[a] > row[b]; });
    float sum = 0.0f;  // routing_weights.sum(dim=-1), fp32
    for (int j = 0; j < k; ++j) {
      r.topk_e[static_cast<std::size_t>(n * k + j)] = order[static_cast<std::size_t>(j)];
      r.topk_p[static_cast<std::size_t>(n * k + j)] = row[order[static_cast<std::size_t>(j)]];
      sum += row[order[static_cast<std::size_t>(j)]];
    }
    for (int j = 0; j < k; ++j) {
      const std::size_t i = static_cast<std::size_t>(n * k + j);
      r.weights[i] = renormalise ? r.topk_p[i] / sum : r.topk_p[i];
    }
  }
  r.rows.assign(static_cast<std::size_t>(E), {});
  r.slots.assign(static_cast<std::size_t>(E), {});
  for (int j = 0; j < k; ++j)
    for (std::int64_t n = 0; n < N; ++n) {
      const int e = r.topk_e[static_cast<std::size_t>(n * k + j)];
      r.rows[static_cast<std::size_t>(e)].push_back(static_cast<std::int32_t>(n));
      r.slots[static_cast<std::size_t>(e)].push_back(j);
    }
  r.counts.assign(static_cast<std::size_t>(E), 0);
  for (int e = 0; e < E; ++e)
    r.counts[static_cast<std::size_t>(e)] =
        static_cast<std::int64_t>(r.rows[static_cast<std::size_t>(e)].size());
}

// A device without data: the plan's histogram, token rows and weights left zero.
void route_from_plan(MoeState::Route& r, std::vector<std::int64_t> counts, std::int64_t N, int E,
                     int k) {
  r = {};
  r.topk_e.assign(static_cast<std::size_t>(N * k), 0);
  r.topk_p.assign(r.topk_e.size(), 0.0f);
  r.weights.assign(r.topk_e.size(), 0.0f);
  r.prob_sum.assign(static_cast<std::size_t>(E), 0.0);
  r.rows.assign(static_cast<std::size_t>(E), {});
  r.slots.assign(static_cast<std::size_t>(E), {});
  for (int e = 0; e < E; ++e) {
    r.rows[static_cast<std::size_t>(e)].assign(static_cast<std::size_t>(counts[e]), 0);
    r.slots[static_cast<std::size_t>(e)].assign(static_cast<std::size_t>(counts[e]), 0);
  }
  r.counts = std::move(counts);
}

// What an expert's SwiGLU keeps besides its input (layers/llama_mlp.h): gate and up (rows, I) in
// linear's output dtype (its own output's, `y`) and h (rows, I) in linear's input dtype (`x`).
// From the shapes: an offloaded saved tensor is not readable here.
std::int64_t expert_saved_bytes(LayerCtx& c, const LlamaMlp& m, std::int64_t rows, DType x,
                                DType y) {
  const std::int64_t I = c.weight(m.gate_proj.weight).dim(0);
  return rows * I * static_cast<std::int64_t>(2 * dtype_size(y) + dtype_size(x));
}

// The host round trips of the routing and the row products: on a device without data (the
// estimator) only the copy is made (counted and timed as the engine's), no values.
std::vector<float> read_host(LayerCtx& c, const Tensor& t) {
  if (c.dev.holds_data()) return c.dev.to_host_f32(t);
  c.dev.download(nullptr, t, t.nbytes());
  return {};
}

void write_host(LayerCtx& c, Tensor& t, const std::vector<float>& v) {
  if (c.dev.holds_data())
    c.dev.from_host_f32(t, v);
  else
    c.dev.upload(t, nullptr, t.nbytes());
}

// Index into r.weights (N, k) of expert e's t-th routed row: its token's slot.
std::size_t weight_slot(const MoeState::Route& r, int e, std::size_t t, int k) {
  const auto ue = static_cast<std::size_t>(e);
  return static_cast<std::size_t>(r.rows[ue][t] * k + r.slots[ue][t]);
}

// expert(x) · routing_weights[top_x, idx, None] on the host: rows [first, first + n_e) of v
// (C floats each) are expert e's routed rows in order; each is scaled by its routing weight
// rounded to `t` (hidden_states' dtype).
void scale_by_routing_weights(std::vector<float>& v, std::int64_t first, std::int64_t C,
                              const MoeState::Route& r, int e, int k, DType t) {
  const std::size_t n_e = r.rows[static_cast<std::size_t>(e)].size();
  for (std::size_t i = 0; i < n_e; ++i) {
    const float w = round_as(t, r.weights[weight_slot(r, e, i, k)]);
    float* row = v.data() + (first + static_cast<std::int64_t>(i)) * C;
    for (std::int64_t j = 0; j < C; ++j) row[j] *= w;
  }
}

// That product's backward on the same rows: g holds d(product), y the expert's outputs. Adds
// d w = Σ_j g·y to dw[slot] and leaves d y = g · w (w rounded to `t`, dout's dtype) in g.
void routing_product_backward(std::vector<float>& g, const std::vector<float>& y,
                              std::int64_t first, std::int64_t C, const MoeState::Route& r, int e,
                              int k, DType t, std::vector<double>& dw) {
  const std::size_t n_e = r.rows[static_cast<std::size_t>(e)].size();
  for (std::size_t i = 0; i < n_e; ++i) {
    const std::size_t slot = weight_slot(r, e, i, k);
    const std::int64_t at = (first + static_cast<std::int64_t>(i)) * C;
    double dot = 0.0;
    for (std::int64_t j = 0; j < C; ++j) {
      dot += static_cast<double>(g[at + j]) * y[at + j];
      g[at + j] *= round_as(t, r.weights[slot]);
    }
    dw[slot] += dot;
  }
}

void upload_rows(LayerCtx& c, Tensor& idx, const std::vector<std::int32_t>& rows) {
  c.dev.upload(idx, rows.data(), rows.size() * sizeof(std::int32_t));
}

// ---- expert parallelism -------------------------------------------------------------------------
// The ep group's P ranks hold L = E / P experts each, rank q experts [q·L, (q+1)·L) (Megatron-core
// MoEAlltoAllTokenDispatcher, megatron/core/transformer/moe/token_dispatcher.py: preprocess
// gathers every rank's tokens per expert over the ep group, token_permutation sends each
// rank's (token, slot) rows to the experts' owners with all_to_all, token_unpermutation sends
// the outputs back; autograd mirrors both). Here:
//   counts (P, E)  every rank's histogram, all_gather_host over the group (on a device without
//                  data, the plan's: the same routing on every rank);
//   send   (S, C)  this rank's rows inp[rows], expert-major (so rank p's part is consecutive),
//                  S = N·k; "moe.ep.idx" (1, S) I32 saved: where each came from;
//   recv   (R, C)  the rows of this rank's experts from every rank, source-major, then expert;
//                  expert e runs on its rows gathered by "moe.e{e}.idx" (1, n_e) I32 (saved);
//   back   (S, C)  the outputs returned to the rows' owners in send order ("moe.ep.y", saved: the
//                  routing weight's gradient reads it), times the weight and index_add-ed.
// Backward: d back = dout[send rows] · w -> all_to_all -> each expert's backward -> its dx rows
// -> all_to_all back -> index_add into d inp. The routing and the router stay local.
struct EpPlan {
  int P = 1, q = 0, L = 0;
  std::vector<std::int32_t> send_rows;                 // (S) this rank's token rows, expert-major
  std::vector<std::int64_t> send, recv;                // elements (rows · C) to / from each rank
  std::vector<std::vector<std::int32_t>> expert_rows;  // per local expert: its rows of recv
  std::int64_t R = 0;                                  // rows received
};

EpPlan ep_plan(LayerCtx& c, const Moe& m, const MoeState& s, const MoeState::Route& r,
               std::int64_t C) {
  Comm& g = *c.ep;
  EpPlan p;
  p.P = g.size();
  p.q = g.rank();
  const int E = m.num_experts;
  p.L = E / p.P;
  std::vector<std::int64_t> counts;  // (P, E)
  if (c.dev.holds_data()) {
    counts = g.all_gather_host(r.counts);
  } else {  // the plan of every rank's tokens: what rank q of P receives at any P
    for (int src = 0; src < p.P; ++src) {
      const std::vector<std::int64_t> n =
          s.routing.plan(s.micro_batch, m.index, s.tokens, E, m.top_k, src);
      counts.insert(counts.end(), n.begin(), n.end());
    }
  }
  const auto n = [&](int src, int e) { return counts[static_cast<std::size_t>(src * E + e)]; };
  for (int e = 0; e < E; ++e)
    p.send_rows.insert(p.send_rows.end(), r.rows[static_cast<std::size_t>(e)].begin(),
                       r.rows[static_cast<std::size_t>(e)].end());
  p.send.assign(static_cast<std::size_t>(p.P), 0);
  p.recv.assign(static_cast<std::size_t>(p.P), 0);
  p.expert_rows.assign(static_cast<std::size_t>(p.L), {});
  for (int dst = 0; dst < p.P; ++dst)
    for (int e = dst * p.L; e < (dst + 1) * p.L; ++e)
      p.send[static_cast<std::size_t>(dst)] += n(p.q, e) * C;
  for (int src = 0; src < p.P; ++src)
    for (int j = 0; j < p.L; ++j) {
      const std::int64_t rows = n(src, p.q * p.L + j);
      auto& mine = p.expert_rows[static_cast<std::size_t>(j)];
      for (std::int64_t i = 0; i < rows; ++i) mine.push_back(static_cast<std::int32_t>(p.R + i));
      p.R += rows;
      p.recv[static_cast<std::size_t>(src)] += rows * C;
    }
  return p;
}

void experts_forward_ep(LayerCtx& c, const Tensor& inp, Tensor& out, const Moe& m, MoeState& s,
                        const MoeState::Route& r) {
  const std::int64_t C = inp.dim(1);
  const int k = m.top_k;
  const DType hidden = out.dtype(), ydt = c.out_dtype(Op::linear, inp);
  EpPlan p = ep_plan(c, m, s, r, C);
  const auto S = static_cast<std::int64_t>(p.send_rows.size());
  Tensor idx = c.act_tensor({1, S}, DType::I32);
  upload_rows(c, idx, p.send_rows);
  Tensor recv = c.temp({p.R, C}, inp.dtype());
  {
    Tensor send = c.temp({1, S, C}, inp.dtype());  // inp[send_rows]
    c.ops().embedding_forward(send, idx, inp, nullptr);
    c.ep->all_to_all(send, p.send, recv, p.recv);
  }
  Tensor ys = c.temp({p.R, C}, ydt);  // every received row's expert output, in recv's order
  c.ops().fill(ys, 0.0f);             // each row written once, by its expert's index_add
  for (int j = 0; j < p.L; ++j) {
    const LlamaMlp& x = m.experts[static_cast<std::size_t>(j)];
    const auto& rows = p.expert_rows[static_cast<std::size_t>(j)];
    const auto n_e = static_cast<std::int64_t>(rows.size());
    if (n_e == 0) {  // an idle expert: its weights' autocast casts all the same (moe_forward)
      for (ParamIndex w : {x.gate_proj.weight, x.up_proj.weight, x.down_proj.weight})
        (void)c.op_weight(Op::linear, w);
      continue;
    }
    const int e = m.first_expert + j;
    Tensor eidx = c.act_tensor({1, n_e}, DType::I32);
    upload_rows(c, eidx, rows);
    Tensor xe = c.act_tensor({1, n_e, C}, inp.dtype());
    c.ops().embedding_forward(xe, eidx, recv, nullptr);
    xe.reshape({n_e, C});
    const std::int64_t gathered = nb(xe);
    Tensor y = mlp_forward(c, std::move(xe), x);  // (n_e, C)
    y.reshape({1, n_e, C});
    c.ops().embedding_backward(&ys, nullptr, y, eidx, true);  // its rows of ys
    if (c.save && !c.recompute) {
      s.saved.dispatch += nb(eidx) + gathered;
      s.saved.experts += expert_saved_bytes(c, x, n_e, inp.dtype(), ydt);
    }
    c.keep(expert_key(e, "idx"), std::move(eidx));
  }
  recv.reset();
  Tensor back = c.act_tensor({S, C}, ydt);  // the outputs of this rank's rows, send order
  c.ep->all_to_all(ys, p.recv, back, p.send);
  ys.reset();
  // back · routing_weights, index_add-ed into out (moe_forward's per-expert product, in one).
  Tensor scaled = c.temp({1, S, C}, c.out_dtype(Op::add, ydt, hidden));
  {
    std::vector<float> v = read_host(c, back);
    if (c.dev.holds_data()) {
      std::int64_t first = 0;  // send order: expert by expert
      for (int e = 0; e < m.num_experts; ++e) {
        scale_by_routing_weights(v, first, C, r, e, k, hidden);
        first += static_cast<std::int64_t>(r.rows[static_cast<std::size_t>(e)].size());
      }
    }
    write_host(c, scaled, v);
  }
  c.ops().embedding_backward(&out, nullptr, scaled, idx, true);
  scaled.reset();
  if (c.save && !c.recompute) s.saved.dispatch += nb(idx) + nb(back);
  c.keep("moe.ep.y", std::move(back));
  c.keep("moe.ep.idx", std::move(idx));
}

void experts_backward_ep(LayerCtx& c, const Tensor& dout, Tensor& dinp, std::vector<double>& dw,
                         const Moe& m, const MoeState& s, const MoeState::Route& r) {
  const Tensor& idx = c.get("moe.ep.idx");
  const Tensor& back = c.get("moe.ep.y");
  const std::int64_t S = idx.dim(1), C = dout.dim(1);
  const int k = m.top_k;
  const bool data = c.dev.holds_data();
  EpPlan p = ep_plan(c, m, s, r, C);
  // d back = dout[send rows] · w (in back's dtype), d w = Σ_c dout[row] · back.
  Tensor dyr = c.temp({p.R, C}, back.dtype());
  {
    Tensor dback = c.temp({S, C}, back.dtype());
    {
      Tensor gr = c.temp({1, S, C}, dout.dtype());
      c.ops().embedding_forward(gr, idx, dout, nullptr);
      std::vector<float> gv = read_host(c, gr);
      const std::vector<float> yv = read_host(c, back);
      if (data) {
        std::int64_t first = 0;  // send order: expert by expert
        for (int e = 0; e < m.num_experts; ++e) {
          routing_product_backward(gv, yv, first, C, r, e, k, dout.dtype(), dw);
          first += static_cast<std::int64_t>(r.rows[static_cast<std::size_t>(e)].size());
        }
      }
      write_host(c, dback, gv);
    }
    c.ep->all_to_all(dback, p.send, dyr, p.recv);
  }
  Tensor dxr = c.temp({p.R, C}, dinp.dtype());  // every received row's d input
  c.ops().fill(dxr, 0.0f);
  for (int j = 0; j < p.L; ++j) {
    const LlamaMlp& x = m.experts[static_cast<std::size_t>(j)];
    const auto n_e = static_cast<std::int64_t>(p.expert_rows[static_cast<std::size_t>(j)].size());
    if (n_e == 0) {  // an idle expert: zero gradients (moe_backward)
      for (ParamIndex w : {x.gate_proj.weight, x.up_proj.weight, x.down_proj.weight})
        if (GradRef g = c.store.grad(w); !g.accumulate) c.ops().fill(g.t, 0.0f);
      continue;
    }
    const Tensor& eidx = c.get(expert_key(m.first_expert + j, "idx"));
    Tensor dy = c.temp({1, n_e, C}, back.dtype());
    c.ops().embedding_forward(dy, eidx, dyr, nullptr);
    dy.reshape({n_e, C});
    Tensor dx = mlp_backward(c, dy, x);  // (n_e, C)
    dy.reset();
    dx.reshape({1, n_e, C});
    c.ops().embedding_backward(&dxr, nullptr, dx, eidx, true);
  }
  dyr.reset();
  Tensor dxs = c.temp({1, S, C}, dxr.dtype());
  c.ep->all_to_all(dxr, p.recv, dxs, p.send);
  dxr.reset();
  c.ops().embedding_backward(&dinp, nullptr, dxs, idx, true);  // hidden_states[top_x]'s
}

}  // namespace

std::vector<std::int64_t> MoeRouting::plan(std::int64_t micro_batch, int layer, std::int64_t tokens,
                                           int experts, int top_k, int rank) const {
  std::vector<std::int64_t> n(static_cast<std::size_t>(experts), 0);
  switch (kind) {
    case Kind::balanced: {
      const std::int64_t total = tokens * top_k, each = total / experts;
      for (int e = 0; e < experts; ++e) n[e] = each + (e < total % experts ? 1 : 0);
      break;
    }
    case Kind::worst:
      for (int e = 0; e < top_k; ++e) n[e] = tokens;
      break;
    case Kind::measured: {
      const auto& mine =
          by_rank.empty() ? tokens_per_expert : by_rank.at(static_cast<std::size_t>(rank));
      const auto& step =
          mine.at(static_cast<std::size_t>(micro_batch % static_cast<std::int64_t>(mine.size())));
      if (layer >= static_cast<int>(step.size()) ||
          static_cast<int>(step[static_cast<std::size_t>(layer)].size()) != experts)
        throw std::invalid_argument(
            fmt::format("--moe-routing {}: no histogram of {} experts for MoE layer {}", source,
                        experts, layer));
      n = step[static_cast<std::size_t>(layer)];
      std::int64_t sum = 0;
      for (std::int64_t v : n) sum += v;
      if (sum != tokens * top_k)
        throw std::invalid_argument(fmt::format(
            "--moe-routing {}: MoE layer {} routes {} (token, slot) pairs, this run {} × top_k {} "
            "= {} (another batch size or sequence length)",
            source, layer, sum, tokens, top_k, tokens * top_k));
      break;
    }
  }
  return n;
}

MoeRouting MoeRouting::for_rank(int world_rank, int tp, int dp, int ep) const {
  MoeRouting r = *this;
  if (kind != Kind::measured || tp * dp == 1) return r;
  if (static_cast<int>(by_world_rank.size()) != tp * dp) {
    r.source += by_world_rank.empty() ? std::string(" (one rank's histograms, for every rank)")
                                      : fmt::format(
                                            " (measured on {} ranks, this point has {}: rank 0's "
                                            "histograms for every rank)",
                                            by_world_rank.size(), tp * dp);
    return r;
  }
  r.by_rank.clear();
  for (int w : ep_group_of(world_rank, tp, ep))
    r.by_rank.push_back(by_world_rank.at(static_cast<std::size_t>(w)));
  return r;
}

MoeRouting::Histograms MoeState::last_step(std::int64_t micro_batches) const {
  const auto n = static_cast<std::int64_t>(history.size());
  return {history.begin() + std::max<std::int64_t>(0, n - micro_batches), history.end()};
}

void MoeState::begin_micro_batch(std::int64_t n) {
  ++micro_batch;
  tokens = n;
  route.assign(static_cast<std::size_t>(layers), {});
  saved = {};
  history.emplace_back(static_cast<std::size_t>(layers),
                       std::vector<std::int64_t>(static_cast<std::size_t>(num_experts), 0));
}

double MoeState::aux_loss() const {
  const double rows = static_cast<double>(layers) * static_cast<double>(tokens);
  double aux = 0.0;
  for (int e = 0; e < num_experts; ++e) {
    double f = 0.0, p = 0.0;
    for (const Route& r : route) {
      f += static_cast<double>(r.counts[static_cast<std::size_t>(e)]);
      p += r.prob_sum[static_cast<std::size_t>(e)];
    }
    aux += (f / rows) * (p / rows);
  }
  return aux * num_experts;
}

Tensor moe_forward(LayerCtx& c, Tensor inp, const Moe& m, MoeState& s) {
  ScopedRange scope(c.dev, "moe");  // names the trace's allocations
  const std::int64_t N = inp.dim(0), C = inp.dim(1);
  const int E = m.num_experts, k = m.top_k;
  const DType hidden = inp.dtype();  // HF's final_hidden_states: zeros of hidden_states' dtype
  inp = c.cast_input(Op::linear, std::move(inp));  // (N, C): the router's, experts' and shared's

  // Router: logits (N, E) in linear's dtype, p (N, E) = softmax in fp32 (saved: its backward).
  Tensor probs = c.act_tensor({N, E}, DType::F32);
  {
    Tensor logits = c.temp({N, E}, c.out_dtype(Op::linear, inp));
    linear_forward(c, logits, inp, m.gate);
    c.ops().softmax_forward(probs, logits);
  }
  MoeState::Route& r = s.route[static_cast<std::size_t>(m.index)];
  if (!c.recompute) {  // a recomputing forward routes as the first one did
    std::vector<float> p = read_host(c, probs);
    if (c.dev.holds_data())
      route_from_probs(r, p, N, E, k, m.norm_topk_prob);
    else
      route_from_plan(
          r, s.routing.plan(s.micro_batch, m.index, N, E, k, c.ep != nullptr ? c.ep->rank() : 0), N,
          E, k);
    s.history.back()[static_cast<std::size_t>(m.index)] = r.counts;
  }

  // Dispatch: each expert on its tokens, its output times the routing weight added into `out`.
  Tensor out = c.temp({N, C}, hidden);
  c.ops().fill(out, 0.0f);
  if (c.ep != nullptr) experts_forward_ep(c, inp, out, m, s, r);
  for (int e = 0; e < E && c.ep == nullptr; ++e) {
    const auto& rows = r.rows[static_cast<std::size_t>(e)];
    const auto n_e = static_cast<std::int64_t>(rows.size());
    if (n_e == 0) {
      // HF runs an idle expert on its empty (0, C) batch: nothing to save but, under autocast,
      // its weights' 16-bit casts, which the empty GEMMs keep for backward as any other
      // (its zero gradients: moe_backward).
      const LlamaMlp& x = m.experts[static_cast<std::size_t>(e)];
      for (ParamIndex w : {x.gate_proj.weight, x.up_proj.weight, x.down_proj.weight})
        (void)c.op_weight(Op::linear, w);
      continue;
    }
    Tensor idx = c.act_tensor({1, n_e}, DType::I32);
    upload_rows(c, idx, rows);
    Tensor x = c.act_tensor({1, n_e, C}, inp.dtype());  // hidden_states[top_x]
    c.ops().embedding_forward(x, idx, inp, nullptr);
    x.reshape({n_e, C});
    const std::int64_t gathered = nb(x);
    Tensor y = mlp_forward(c, std::move(x), m.experts[static_cast<std::size_t>(e)]);  // (n_e, C)
    if (c.save && !c.recompute) {
      s.saved.dispatch += nb(idx) + gathered + nb(y);
      s.saved.experts += expert_saved_bytes(c, m.experts[static_cast<std::size_t>(e)], n_e,
                                            inp.dtype(), y.dtype());
    }
    // expert(x) · routing_weights[top_x, idx, None]: the weights have hidden_states' dtype, the
    // product the promoted one (fp32 under autocast).
    Tensor scaled = c.temp({1, n_e, C}, c.out_dtype(Op::add, y.dtype(), hidden));
    {
      std::vector<float> v = read_host(c, y);
      if (c.dev.holds_data()) scale_by_routing_weights(v, 0, C, r, e, k, hidden);
      write_host(c, scaled, v);
    }
    c.ops().embedding_backward(&out, nullptr, scaled, idx, true);  // index_add_(0, top_x, ·)
    scaled.reset();
    c.keep(expert_key(e, "y"), std::move(y));
    c.keep(expert_key(e, "idx"), std::move(idx));
  }

  if (m.has_shared()) {
    // sigmoid(shared_expert_gate(x)) · shared_expert(x): sigmoid (on no autocast list) and the
    // product in the gate's dtype, added into the fp32 `out`.
    Tensor y = mlp_forward_on(c, inp, m.shared);  // (N, C)
    Tensor sig = c.act_tensor({N, 1}, c.out_dtype(Op::linear, inp));
    {
      Tensor g = c.temp({N, 1}, sig.dtype());
      linear_forward(c, g, inp, m.shared_gate);
      std::vector<float> v = read_host(c, g);
      for (float& x : v) x = round_as(sig.dtype(), 1.0f / (1.0f + std::exp(-x)));
      write_host(c, sig, v);
    }
    Tensor prod = c.temp({N, C}, hidden);
    {
      std::vector<float> v = read_host(c, y);
      const std::vector<float> g = read_host(c, sig);
      const DType pd = c.out_dtype(Op::add, sig.dtype(), y.dtype());
      if (c.dev.holds_data())
        for (std::int64_t i = 0; i < N; ++i)
          for (std::int64_t j = 0; j < C; ++j) v[i * C + j] = round_as(pd, v[i * C + j] * g[i]);
      write_host(c, prod, v);
    }
    c.ops().add_inplace(out, prod);
    prod.reset();
    if (c.save && !c.recompute)
      s.saved.shared +=
          expert_saved_bytes(c, m.shared, N, inp.dtype(), y.dtype()) + nb(y) + nb(sig);
    c.keep("moe.shared.y", std::move(y));
    c.keep("moe.shared.sig", std::move(sig));
  }
  if (c.save && !c.recompute) s.saved.router += nb(inp) + nb(probs);
  c.keep("moe.inp", std::move(inp));
  c.keep("moe.probs", std::move(probs));
  return out;
}

Tensor moe_backward(LayerCtx& c, const Tensor& dout, const Moe& m, MoeState& s) {
  ScopedRange scope(c.dev, "moe");  // names the trace's allocations
  const Tensor& inp = c.get("moe.inp");
  const Tensor& probs = c.get("moe.probs");
  const std::int64_t N = inp.dim(0), C = inp.dim(1);
  const int E = m.num_experts, k = m.top_k;
  const MoeState::Route& r = s.route[static_cast<std::size_t>(m.index)];
  const bool data = c.dev.holds_data();
  Tensor dinp = c.temp_like(dout);  // (N, C): every path's gradient added in
  c.ops().fill(dinp, 0.0f);
  std::vector<double> dw(static_cast<std::size_t>(N * k), 0.0);  // d routing_weights (N, k)

  if (c.ep != nullptr) experts_backward_ep(c, dout, dinp, dw, m, s, r);
  for (int e = 0; e < E && c.ep == nullptr; ++e) {
    const auto& rows = r.rows[static_cast<std::size_t>(e)];
    const auto n_e = static_cast<std::int64_t>(rows.size());
    if (n_e == 0) {
      // HF runs an idle expert on its empty (0, C) batch all the same: its weights' gradients
      // are zeros (an empty GEMM), which the optimizer then steps as any other.
      const LlamaMlp& x = m.experts[static_cast<std::size_t>(e)];
      for (ParamIndex w : {x.gate_proj.weight, x.up_proj.weight, x.down_proj.weight})
        if (GradRef g = c.store.grad(w); !g.accumulate) c.ops().fill(g.t, 0.0f);
      continue;
    }
    const Tensor& idx = c.get(expert_key(e, "idx"));
    const Tensor& y = c.get(expert_key(e, "y"));
    // d scaled = dout[top_x] (index_add_'s backward); d y = d scaled · w in y's dtype, and
    // d w = Σ_c d scaled · y (the product's backward).
    Tensor dy = c.temp({n_e, C}, y.dtype());
    {
      Tensor g = c.temp({1, n_e, C}, dout.dtype());
      c.ops().embedding_forward(g, idx, dout, nullptr);
      std::vector<float> gv = read_host(c, g);
      const std::vector<float> yv = read_host(c, y);
      if (data) routing_product_backward(gv, yv, 0, C, r, e, k, dout.dtype(), dw);
      write_host(c, dy, gv);
    }
    Tensor dx = mlp_backward(c, dy, m.experts[static_cast<std::size_t>(e)]);  // (n_e, C)
    dy.reset();
    dx.reshape({1, n_e, C});
    c.ops().embedding_backward(&dinp, nullptr, dx, idx, true);  // hidden_states[top_x]'s
  }

  if (m.has_shared()) {
    const Tensor& y = c.get("moe.shared.y");
    const Tensor& sig = c.get("moe.shared.sig");
    const DType pd = c.out_dtype(Op::add, sig.dtype(), y.dtype());
    Tensor dy = c.temp({N, C}, y.dtype());
    Tensor dg = c.temp({N, 1}, sig.dtype());
    {
      std::vector<float> d = read_host(c, dout);
      const std::vector<float> yv = read_host(c, y), sv = read_host(c, sig);
      std::vector<float> gv(static_cast<std::size_t>(N), 0.0f);
      if (data)
        for (std::int64_t i = 0; i < N; ++i) {
          double dot = 0.0;
          for (std::int64_t j = 0; j < C; ++j) {
            const float dp = round_as(pd, d[i * C + j]);  // the product's gradient, its dtype
            dot += static_cast<double>(dp) * yv[i * C + j];
            d[i * C + j] = round_as(y.dtype(), dp * sv[i]);
          }
          const float dsig = round_as(sig.dtype(), static_cast<float>(dot));
          gv[i] = round_as(sig.dtype(), dsig * sv[i] * (1.0f - sv[i]));  // sigmoid's backward
        }
      write_host(c, dy, d);
      write_host(c, dg, gv);
    }
    Tensor dx = mlp_backward(c, dy, m.shared);
    dy.reset();
    c.ops().add_inplace(dinp, dx);
    dx.reset();
    Tensor dxg = c.temp_like(inp);
    linear_backward(c, &dxg, dg, inp, m.shared_gate);
    c.ops().add_inplace(dinp, dxg);
  }

  // Router: d p from the routing weights (through the renormalisation and top-k) and from the
  // load-balancing loss; then softmax's and the gate's backward.
  Tensor dprobs = c.temp({N, E}, DType::F32);
  {
    std::vector<float> dp(static_cast<std::size_t>(N * E), 0.0f);
    if (data) {
      for (std::int64_t n = 0; n < N; ++n) {
        const std::size_t b = static_cast<std::size_t>(n * k);
        double sum = 0.0, dot = 0.0;  // w_j = p_j / S: d p_j = d w_j / S - Σ_i d w_i p_i / S²
        for (int j = 0; j < k; ++j) {
          sum += r.topk_p[b + j];
          dot += dw[b + j] * r.topk_p[b + j];
        }
        for (int j = 0; j < k; ++j) {
          const double g = m.norm_topk_prob ? dw[b + j] / sum - dot / (sum * sum) : dw[b + j];
          dp[static_cast<std::size_t>(n * E + r.topk_e[b + j])] += static_cast<float>(g);
        }
      }
      if (s.aux_coef > 0) {
        // d(coef · aux) summed over the micro-batch's loss rows (each row carries it), then
        // E · f_e / (L·N) per p[n, e].
        const double rows = static_cast<double>(s.layers) * static_cast<double>(s.tokens);
        const double g = static_cast<double>(s.dloss) * static_cast<double>(s.tokens) * s.aux_coef;
        for (int e = 0; e < E; ++e) {
          double f = 0.0;
          for (const MoeState::Route& l : s.route) f += static_cast<double>(l.counts[e]);
          const auto add = static_cast<float>(g * E * (f / rows) / rows);
          for (std::int64_t n = 0; n < N; ++n) dp[static_cast<std::size_t>(n * E + e)] += add;
        }
      }
    }
    write_host(c, dprobs, dp);
  }
  Tensor dlogits = c.temp({N, E}, c.out_dtype(Op::linear, inp));
  c.ops().softmax_backward(dlogits, dprobs, probs);
  dprobs.reset();
  Tensor dxr = c.temp_like(inp);
  linear_backward(c, &dxr, dlogits, inp, m.gate);
  dlogits.reset();
  c.ops().add_inplace(dinp, dxr);
  return dinp;
}

}  // namespace memtrade
