#include "models/families/mlp.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "models/layers/loss.h"
#include "models/train/data.h"

namespace memtrade {

MlpModel::MlpModel(MlpConfig cfg) : cfg_(std::move(cfg)) {
  if (cfg_.hidden.empty()) throw std::invalid_argument(cfg_.name + ": an MLP needs a hidden layer");
  std::int64_t in = cfg_.in_features;
  const int n = static_cast<int>(cfg_.hidden.size());
  for (int j = 0; j <= n; ++j) {
    const std::int64_t out = j < n ? cfg_.hidden[j] : cfg_.classes;
    const float std = 1.0f / std::sqrt(3.0f * static_cast<float>(in));
    const int block = j < n ? j : -1;
    layers_.push_back({add_param(fmt::format("layers.{}.weight", j), {out, in}, std, block),
                       add_param(fmt::format("layers.{}.bias", j), {out}, 0, block), j > 0});
    in = out;
  }
}

nlohmann::json MlpModel::hyper() const {
  std::vector<int> sizes{cfg_.in_features};
  sizes.insert(sizes.end(), cfg_.hidden.begin(), cfg_.hidden.end());
  sizes.push_back(cfg_.classes);
  return {{"family", family()},    {"in_features", cfg_.in_features},
          {"hidden", cfg_.hidden}, {"classes", cfg_.classes},
          {"layer_sizes", sizes},  {"num_params", num_params()}};
}

void MlpModel::make_batch(std::uint64_t seed, std::int64_t first, std::int64_t batch,
                          std::vector<float>& input, std::vector<std::int32_t>& targets) const {
  make_feature_batch(seed, first, batch, cfg_.in_features, cfg_.classes, input, targets);
}

Tensor MlpModel::stem_forward(LayerCtx&, const Tensor& input) {
  // Block 0's linear saves the input itself, as autograd saves the batch it is handed (which
  // exists before the step): no copy.
  return saved_in_place(input);
}

Tensor MlpModel::block_forward(LayerCtx& c, int block, const Tensor& x) {
  const Linear& l = layers_[block];
  const std::int64_t N = x.dim(0), out = cfg_.hidden[block];
  // Under autocast block 0's linear reads the fp32 input through its 16-bit cast, and keeps the
  // cast, not the input, as autograd does; the driver then does not save x (block_model.h).
  Tensor cast;
  const Tensor& in = c.cast_input(Op::linear, x, cast);
  if (block > 0 && cast.defined())  // a ReLU output is what the next linear reads (mlp.h)
    throw std::logic_error(name() + ": autocast cast a ReLU output for the next linear");
  Tensor h = c.temp({N, out}, c.out_dtype(Op::linear, in));  // (N, out) pre-activation: the
                                                             // ReLU backward uses the output
  linear_forward(c, h, in, l);
  if (cast.defined()) c.keep("x", std::move(cast));
  Tensor r = c.dev.empty({N, out}, c.out_dtype(Op::relu, h), Category::activations);
  c.ops().relu_forward(r, h);
  if (!c.recompute) return r;  // its consumer saves it and hands it on in backward (mlp.h)
  // A recompute keeps the ReLU output under this block (the segment's last block has no consumer
  // in it); a consumer inside the segment saves a view of it, the one storage.
  Tensor view = Tensor::view(r, 0, r.numel());
  view.reshape(r.shape());
  c.keep("r", std::move(r));
  return view;
}

Tensor MlpModel::head_forward(LayerCtx& c, Tensor x, const Tensor& targets) {
  x = c.cast_input(Op::linear, std::move(x));
  Tensor logits = c.act_tensor({x.dim(0), cfg_.classes}, c.out_dtype(Op::linear, x));
  linear_forward(c, logits, x, layers_.back());
  c.keep("x", std::move(x));
  return crossentropy_loss_forward(c, std::move(logits), targets);
}

// The consumer of block `prev`'s ReLU output r (block prev + 1's linear, or the head's), done
// with its saved copy `x` of it: hands x on to block prev, whose ReLU backward reads it, unless
// block prev is recomputed (its recompute makes r again and keeps that). Called from the linear's
// node_done: without the hand-over x is freed there, as autograd frees a checkpoint's output (or
// the view of a recomputed one) once the AddmmBackward that saved it has run.
void MlpModel::pass_on(LayerCtx& c, int prev, Tensor& x) const {
  if (recomputed(prev)) {
    x.reset();
    return;
  }
  c.saved.save(prev, "r", std::move(x));
}

Tensor MlpModel::head_backward(LayerCtx& c, float dloss) {
  const int last = num_blocks() - 1;
  Tensor x = c.saved.take(c.segment, "x");  // the last hidden ReLU output
  Tensor dlogits = crossentropy_loss_backward(c, dloss, c.out_dtype(Op::linear, x));
  Tensor dx = c.temp_like(x);
  linear_backward(c, &dx, dlogits, x, layers_.back(), [&] {
    dlogits.reset();
    pass_on(c, last, x);
  });
  return dx;
}

// Each block applies its own ReLU's mask to d(output) first (ReluBackward runs before the
// AddmmBackward it feeds), then frees its ReLU output; dres and the linear's saved input (block 0:
// the input's cast under autocast) are freed as autograd frees AddmmBackward's incoming gradient
// and saved input: before the weight gradient's cast.
void MlpModel::block_backward(LayerCtx& c, int block, Tensor& dres) {
  {
    Tensor r = c.saved.take(c.segment, "r");  // (N, out) this block's ReLU output
    Tensor dh = c.temp_like(r);
    c.ops().relu_backward(dh, dres, r);
    dres = std::move(dh);
  }
  // Only now does the block need what it offloaded: its input comes back after its ReLU output
  // is freed, as autograd unpacks AddmmBackward's input after ReluBackward has run.
  if (c.fetch_saved) c.fetch_saved();
  Tensor x = c.saved.take(c.segment, "x");  // (N, in)
  if (block == 0) {                         // the input needs no gradient
    linear_backward(c, nullptr, dres, x, layers_[0], [&] {
      dres.reset();
      x.reset();
    });
    return;
  }
  Tensor dx = c.temp_like(x);
  linear_backward(c, &dx, dres, x, layers_[block], [&] {
    dres.reset();
    pass_on(c, block - 1, x);
  });
  dres = std::move(dx);
}

double MlpModel::block_flops(std::int64_t batch, int block) const {
  const double in = block == 0 ? cfg_.in_features : cfg_.hidden[block - 1];
  return 2.0 * static_cast<double>(batch) * in * cfg_.hidden[block];
}

double MlpModel::head_flops(std::int64_t batch) const {
  return 2.0 * static_cast<double>(batch) * cfg_.hidden.back() * cfg_.classes;
}

}  // namespace memtrade
