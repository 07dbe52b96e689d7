#include "models/families/decoder.h"

#include <stdexcept>

#include <fmt/format.h>

#include "models/layers/loss.h"
#include "models/layers/tensor_parallel.h"
#include "models/train/data.h"

namespace memtrade {
namespace {

// The autocast op kind of a norm (models/config/autocast_policy.h).
constexpr Op norm_op(const LayerNorm&) {
  return Op::layernorm;
}
constexpr Op norm_op(const RmsNorm&) {
  return Op::rmsnorm;
}

// Gemma 2's post-norm of a branch output (B·T, C): HF's Gemma2RMSNorm normalises x.float() and
// returns type_as(x), so the output keeps the branch's dtype; the (cast) input is saved.
template <typename Norm>
Tensor post_norm_forward(LayerCtx& c, Tensor branch, const Norm& n) {
  const DType out_dtype = branch.dtype();
  Tensor inp = c.cast_input(norm_op(n), std::move(branch));
  Tensor out = c.temp(inp.shape(), out_dtype);
  norm_forward(c, out, inp, n);
  c.keep(n.key + ".inp", std::move(inp));
  return out;
}

// d(branch output) from d(post-norm output) dout, in the branch output's dtype.
template <typename Norm>
Tensor post_norm_backward(LayerCtx& c, const Tensor& dout, DType branch_dtype, const Norm& n) {
  const Tensor& inp = c.get(n.key + ".inp");
  // The add's gradient for the branch's dtype, then type_as's back to the norm's (autograd).
  Tensor as_branch, as_norm;
  const Tensor& d = c.grad_as(c.grad_as(dout, branch_dtype, as_branch), inp.dtype(), as_norm);
  Tensor dinp = c.temp_like(inp);
  norm_backward(c, dinp, d, inp, n);
  as_norm.reset();
  as_branch.reset();
  return c.grad_as(std::move(dinp), branch_dtype);
}

}  // namespace

std::optional<std::string> above_bound(std::string_view key, std::int64_t value,
                                       const DecoderBound& bound) {
  if (value <= bound.max) return std::nullopt;
  return fmt::format("{} {} is above memtrade's bound of {} ({})", key, value, bound.max,
                     bound.what);
}

template <typename Norm, typename Mlp>
void DecoderModel<Norm, Mlp>::check_bounds(
    const std::string& name,
    std::initializer_list<std::tuple<std::string_view, std::int64_t, DecoderBound>> sizes) {
  for (const auto& [key, value, bound] : sizes)
    if (auto problem = above_bound(key, value, bound))
      throw std::invalid_argument(fmt::format("{}: {}", name, *problem));
}

template <typename Norm, typename Mlp>
void DecoderModel<Norm, Mlp>::set_sequence(const std::string& name, int seq_len, int block_size,
                                           int vocab_size) {
  if (seq_len == 0) seq_len = block_size;
  if (seq_len < 1 || seq_len > block_size)
    throw std::invalid_argument(fmt::format("{}: seq_len {} must be in [1, {}] (its block size)",
                                            name, seq_len, block_size));
  seq_len_ = seq_len;
  block_size_ = block_size;
  vocab_size_ = vocab_size;
}

template <typename Norm, typename Mlp>
void DecoderModel<Norm, Mlp>::set_split(
    const std::string& name, TpSplit tp,
    std::initializer_list<std::pair<std::string_view, std::int64_t>> divisible,
    std::int64_t vocab) {
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size)
    throw std::invalid_argument(fmt::format("{}: tp rank {} of {}", name, tp.rank, tp.size));
  for (const auto& [key, value] : divisible)
    if (value % tp.size != 0)
      throw std::invalid_argument(
          fmt::format("{}: {} {} does not split over tp {} (Megatron requires a multiple)", name,
                      key, value, tp.size));
  if (even_part(vocab, tp.size, tp.size - 1).count < 1)
    throw std::invalid_argument(fmt::format(
        "{}: vocab_size {} leaves a tp rank of {} without vocabulary rows", name, vocab, tp.size));
  tp_ = tp;
  embedding_.vocab_parallel = tp.size > 1;
  embedding_.vocab_offset = tp.vocab(vocab).offset;
}

template <typename Norm, typename Mlp>
int DecoderModel<Norm, Mlp>::add_split_param(std::string name, Shape whole, float init_std,
                                             int block, TpSlice slice) {
  if (slice.split()) whole[static_cast<std::size_t>(slice.dim)] = slice.groups * slice.count;
  return add_param(std::move(name), std::move(whole), init_std, block, slice);
}

template <typename Norm, typename Mlp>
int DecoderModel<Norm, Mlp>::add_replicated_param(std::string name, Shape shape, float init_std,
                                                  int block) {
  return add_param(std::move(name), std::move(shape), init_std, block, TpSlice{}, tp_.size > 1);
}

template <typename Norm, typename Mlp>
void DecoderModel<Norm, Mlp>::make_batch(std::uint64_t seed, std::int64_t first, std::int64_t batch,
                                         std::vector<float>& input,
                                         std::vector<std::int32_t>& targets) const {
  make_token_batch(seed, first, batch, static_cast<int>(seq_len_), vocab_size_, input, targets);
}

// ---- forward ------------------------------------------------------------------------------------

template <typename Norm, typename Mlp>
Tensor DecoderModel<Norm, Mlp>::stem_forward(LayerCtx& c, const Tensor& input) {
  if (c.sequence_parallel && input.numel() % c.tp->size() != 0)
    throw std::invalid_argument(
        fmt::format("sequence parallelism splits the {} tokens of a micro-batch over {} ranks: "
                    "batch_size × seq_len must be a multiple of tp",
                    input.numel(), c.tp->size()));
  if (moe_.enabled() && !c.recompute) moe_.begin_micro_batch(input.numel());
  Tensor x = embedding_forward(c, input, embedding_);  // (B·T, C); this rank's tokens under SP
  // HF's eager Llama (hf_eager; attention.h): LlamaModel makes the rotary tables cos and sin,
  // (1, T, head_dim) fp32 each, once per forward, and every layer's rotation keeps them.
  if (const CausalSelfAttention& a = blocks_.front().attn; c.hf_eager && a.rope_tables_fp32) {
    const std::int64_t hd = params()[a.c_proj.weight].shape[1] / a.n_head;
    c.keep("rope.tables", c.act_tensor({2, seq_len_, hd}, DType::F32));
  }
  return x;
}

// Under autocast (models/layers/context.h) the residual stream is fp32 (the embedding's output,
// and fp32 + 16-bit promotes), the norms read it as it is and the attention and MLP cast their
// inputs to the linears' 16-bit dtype; the gradient that comes back from a layer which cast its
// input is cast back to the norm output's dtype before the norm's backward (grad_as).

template <typename Norm, typename Mlp>
Tensor DecoderModel<Norm, Mlp>::block_forward(LayerCtx& c, int block, const Tensor& x) {
  const Block& b = blocks_[block];
  // (B·T, C), or under sequence parallelism this rank's rows of it: the norms and residuals
  // run on what the rank holds, attention and the MLP gather the rest.
  const std::int64_t N = x.dim(0), C = x.dim(1), T = seq_len_;
  Tensor h1 = c.act_tensor({N, C}, c.out_dtype(norm_op(b.norm_1), x));
  norm_forward(c, h1, x, b.norm_1);
  Tensor a = attention_forward(c, std::move(h1), whole_tokens(c, N) / T, T, b.attn);
  if (b.post_1) a = post_norm_forward(c, std::move(a), *b.post_1);
  // The residual after attention, norm_2's input (autocast: fp32 + 16-bit promotes to fp32).
  Tensor x1 = c.act_tensor({N, C}, c.out_dtype(Op::add, x.dtype(), a.dtype()));
  c.ops().add(x1, x, a);
  a.reset();
  Tensor h2 = c.act_tensor({N, C}, c.out_dtype(norm_op(b.norm_2), x1));
  norm_forward(c, h2, x1, b.norm_2);
  Tensor m = b.moe.enabled() ? moe_forward(c, std::move(h2), b.moe, moe_)
                             : mlp_forward(c, std::move(h2), b.mlp);
  if (b.post_2) m = post_norm_forward(c, std::move(m), *b.post_2);
  Tensor out = c.dev.empty({N, C}, c.out_dtype(Op::add, x1.dtype(), m.dtype()),
                           Category::activations);  // the next block's input
  c.ops().add(out, x1, m);
  c.keep("x1", std::move(x1));
  return out;
}

template <typename Norm, typename Mlp>
Tensor DecoderModel<Norm, Mlp>::head_forward(LayerCtx& c, Tensor x, const Tensor& targets) {
  const std::int64_t N = x.dim(0), C = x.dim(1);
  Tensor lnf = c.act_tensor({N, C}, c.out_dtype(norm_op(norm_f_), x));  // (B·T, C)
  norm_forward(c, lnf, x, norm_f_);
  c.keep("x", std::move(x));
  lnf = c.cast_input(Op::linear, std::move(lnf));
  // The head is column-parallel over the vocabulary: this rank's logits (B·T, V / tp) of every
  // token (gathered under SP).
  Tensor logits;  // (B·T, V)
  {
    Tensor gathered;
    const Tensor& h = enter_column_parallel(c, lnf, gathered, Category::temporaries);
    logits = c.act_tensor({h.dim(0), c.weight(head_.weight).dim(0)}, c.out_dtype(Op::linear, lnf));
    linear_forward(c, logits, h, head_);
  }
  c.keep("lnf", std::move(lnf));
  if (final_softcap_ > 0.0f) {
    c.ops().softcap_forward(logits, logits, final_softcap_);  // in place: the capped logits
    // The loss saves its own: the fp32 cast under autocast, else a copy.
    Tensor cast;
    c.cast_input(Op::crossentropy, logits, cast);
    Tensor for_loss = cast.defined() ? std::move(cast) : copy_for_backward(c, logits);
    c.keep("softcap.out", std::move(logits));
    logits = std::move(for_loss);
  }
  if (embedding_.vocab_parallel)
    return vocab_parallel_loss_forward(c, std::move(logits), targets, embedding_.vocab_offset);
  Tensor losses = crossentropy_loss_forward(c, std::move(logits), targets);  // (B·T) F32
  if (moe_.aux_coef > 0) {
    // The load-balancing loss (layers/moe.h), router_aux_loss_coef · aux, carried by every loss
    // row so that their mean is HF's loss + coef · aux.
    Tensor aux = c.temp(losses.shape(), DType::F32);
    c.ops().fill(aux, static_cast<float>(moe_.aux_coef * moe_.aux_loss()));
    c.ops().add_inplace(losses, aux);
  }
  return losses;
}

// ---- backward -----------------------------------------------------------------------------------

template <typename Norm, typename Mlp>
Tensor DecoderModel<Norm, Mlp>::head_backward(LayerCtx& c, float dloss) {
  moe_.dloss = dloss;  // the aux loss's gradient, in the MoE layers' backward
  const Tensor& lnf = c.get("lnf");
  const DType logits_dtype = c.out_dtype(Op::linear, lnf);
  Tensor dlogits =
      embedding_.vocab_parallel  // (B·T, V / tp)
          ? vocab_parallel_loss_backward(c, dloss, logits_dtype, embedding_.vocab_offset)
          : crossentropy_loss_backward(c, dloss, logits_dtype);
  if (final_softcap_ > 0.0f)
    c.ops().softcap_backward(dlogits, dlogits, c.get("softcap.out"), final_softcap_);
  Tensor gathered;
  const Tensor& h = enter_column_parallel(c, lnf, gathered, Category::temporaries);
  Tensor dh = c.temp_like(h);
  // A tied head writes wte's gradient first; the embedding adds to it later (eager holds the
  // head's until then: LayerCtx::hold_grad).
  if (head_.weight == embedding_.wte) c.hold_grad(head_.weight);
  linear_backward(c, &dh, dlogits, h, head_);
  dlogits.reset();
  gathered.reset();
  Tensor dlnf = enter_column_parallel_grad(c, std::move(dh));  // summed over the vocabulary
  const Tensor& x = c.get("x");
  dlnf = c.grad_as(std::move(dlnf), c.out_dtype(norm_op(norm_f_), x));
  Tensor dres = c.temp_like(x);  // (B·T, C): d(last block output)
  norm_backward(c, dres, dlnf, x, norm_f_);
  return dres;
}

template <typename Norm, typename Mlp>
void DecoderModel<Norm, Mlp>::block_backward(LayerCtx& c, int block, Tensor& dres) {
  const Block& b = blocks_[block];
  // out = x1 + mlp(norm_2(x1)): dres = d out -> d x1.
  const Tensor& x1 = c.get("x1");
  Tensor dm;  // d(mlp output), through post_2 when there is one
  if (b.post_2) dm = post_norm_backward(c, dres, c.out_dtype(Op::linear, x1), *b.post_2);
  const Tensor& dmlp = b.post_2 ? dm : dres;
  Tensor dh2 =
      c.grad_as(b.moe.enabled() ? moe_backward(c, dmlp, b.moe, moe_) : mlp_backward(c, dmlp, b.mlp),
                c.out_dtype(norm_op(b.norm_2), x1));
  dm.reset();
  norm_backward_add(c, dres, dh2, x1, b.norm_2);
  dh2.reset();
  // x1 = x + attn(norm_1(x)): dres = d x1 -> d x.
  const Tensor& x = c.get("x");
  Tensor da;  // d(attention output), through post_1 when there is one
  if (b.post_1) da = post_norm_backward(c, dres, c.out_dtype(Op::linear, x), *b.post_1);
  Tensor dh1 = c.grad_as(attention_backward(c, b.post_1 ? da : dres, b.attn),
                         c.out_dtype(norm_op(b.norm_1), x));
  da.reset();
  norm_backward_add(c, dres, dh1, x, b.norm_1);
}

template <typename Norm, typename Mlp>
void DecoderModel<Norm, Mlp>::stem_backward(LayerCtx& c, Tensor& dres) {
  if (c.has("rope.tables")) (void)c.saved.take(c.segment, "rope.tables");  // every layer's ran
  embedding_backward(c, dres, embedding_);
}

// ---- FLOPs --------------------------------------------------------------------------------------

template <typename Norm, typename Mlp>
double DecoderModel<Norm, Mlp>::scores_flops(std::int64_t batch, int block) const {
  // B·NH·T²·hd multiply-adds; NH·hd is c_proj's input width.
  const double T = static_cast<double>(seq_len_);
  const double width = static_cast<double>(params()[blocks_[block].attn.c_proj.weight].shape[1]);
  return 2.0 * static_cast<double>(batch) * T * T * width;
}

template <typename Norm, typename Mlp>
double DecoderModel<Norm, Mlp>::block_flops(std::int64_t batch, int block) const {
  double macs = 0;  // per token: every weight matrix of the block once (biases and norms aside)
  for (const ParamSpec& p : params())
    if (p.block == block && p.shape.size() == 2) macs += static_cast<double>(shape_numel(p.shape));
  if (const Moe& m = blocks_[block].moe; m.enabled()) {  // a token passes k of the E experts
    double experts = 0;
    for (const LlamaMlp& e : m.experts)
      for (ParamIndex w : {e.gate_proj.weight, e.up_proj.weight, e.down_proj.weight})
        experts += static_cast<double>(shape_numel(params()[w].shape));
    macs -= experts * (1.0 - static_cast<double>(m.top_k) / static_cast<double>(m.experts.size()));
  }
  const double N = static_cast<double>(batch) * static_cast<double>(seq_len_);
  return 2.0 * N * macs + 2.0 * scores_flops(batch, block);  // + QKᵀ and att·V
}

template <typename Norm, typename Mlp>
double DecoderModel<Norm, Mlp>::head_flops(std::int64_t batch) const {
  const double N = static_cast<double>(batch) * static_cast<double>(seq_len_);
  return 2.0 * N * static_cast<double>(shape_numel(params()[head_.weight].shape));
}

template <typename Norm, typename Mlp>
double DecoderModel<Norm, Mlp>::selective_recompute_flops(std::int64_t batch, int block,
                                                          const RunOptions& options) const {
  // Megatron's selective recompute: the attention probabilities (QKᵀ; flash keeps none).
  return options.attention == AttentionKind::math ? scores_flops(batch, block) : 0.0;
}

template <typename Norm, typename Mlp>
double DecoderModel<Norm, Mlp>::attention_recompute_flops(std::int64_t batch, int block,
                                                          const RunOptions& options) const {
  return options.attention == AttentionKind::flash ? scores_flops(batch, block) : 0.0;
}

template class DecoderModel<LayerNorm, GptMlp>;
template class DecoderModel<RmsNorm, LlamaMlp>;

}  // namespace memtrade
