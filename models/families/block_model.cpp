#include "models/families/block_model.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace memtrade {
namespace {

// Profiler range of a block (NVTX on CUDA): the timeline reads stem, block 0..n-1, head.
std::string block_label(int block) {
  return fmt::format("block {}", block);
}

// The tp and ep groups the layers run their collectives in: none for one rank.
void set_parallel(LayerCtx& c, const RunOptions& options) {
  if (options.parallel == nullptr) return;
  if (options.parallel->ep > 1) c.ep = &options.parallel->ep_comm();
  if (options.parallel->tp == 1) return;
  c.tp = &options.parallel->tp_comm();
  c.sequence_parallel = options.parallel->sequence_parallel;
}

}  // namespace

int BlockModel::add_param(std::string name, Shape shape, float init_std, int block,
                          bool trainable) {
  const int index = static_cast<int>(params_.size());
  if (!index_.emplace(name, index).second)
    throw std::logic_error("duplicate parameter name " + name);
  params_.push_back({std::move(name), std::move(shape), init_std, block, trainable});
  params_.back().init_index = index + skipped_;
  return index;
}

int BlockModel::add_param(std::string name, Shape shape, float init_std, int block, TpSlice tp,
                          bool sequence_parallel_grad) {
  const int index = add_param(std::move(name), std::move(shape), init_std, block);
  params_.back().tp = tp;
  params_.back().sequence_parallel_grad = sequence_parallel_grad;
  return index;
}

int BlockModel::param_index(std::string_view name) const {
  auto it = index_.find(std::string(name));
  if (it == index_.end())
    throw std::invalid_argument(fmt::format("{} has no parameter '{}'", this->name(), name));
  return it->second;
}

void BlockModel::check_io(const Tensor& input, const Tensor& targets, DType act) const {
  if (!input.defined() || !targets.defined())
    throw std::invalid_argument(name() + ": undefined input or targets");
  const std::int64_t batch = input.ndim() > 0 ? input.dim(0) : 0;
  if (input.shape() != input_shape(batch) || input.dtype() != input_dtype(act))
    throw std::invalid_argument(fmt::format(
        "{}: input {} {} must be {} {}", name(), shape_str(input.shape()),
        dtype_name(input.dtype()), shape_str(input_shape(batch)), dtype_name(input_dtype(act))));
  if (targets.shape() != target_shape(batch) || targets.dtype() != DType::I32)
    throw std::invalid_argument(fmt::format("{}: targets {} {} must be {} i32", name(),
                                            shape_str(targets.shape()), dtype_name(targets.dtype()),
                                            shape_str(target_shape(batch))));
}

Tensor BlockModel::forward(Device& dev, ParamStore& store, const Tensor& input,
                           const Tensor& targets, const RunOptions& options) {
  check_io(input, targets, options.act_dtype);
  const int n = num_blocks();
  const bool training = options.training;
  saved_.reset();  // a forward without its backward: drop what it kept
  saved_ = std::make_unique<SavedTensors>(dev);
  saved_->set_offload(training && options.offload_activations);
  plan_ = training ? CheckpointPlan::make(options.checkpoint, n) : CheckpointPlan::none(n);

  store.clear_casts();  // a region starts empty (a forward that threw may have left old casts)
  LayerCtx c{dev, store, *saved_, options.act_dtype, options.amp};
  set_parallel(c, options);
  c.selective = plan_.selective;
  c.attention = options.attention;
  c.hf_eager = options.llama_layers == LlamaLayers::hf_eager;
  c.save = training;
  c.segment = -1;
  Tensor x = [&] {
    ScopedRange range(dev, "stem");
    return stem_forward(c, input);  // (B, ...) x0
  }();
  saved_->flush();

  for (const auto& seg : plan_.segments) {
    for (int i = seg.begin; i < seg.end; ++i) {
      c.segment = i;
      c.save = training && !seg.recompute;
      ScopedRange range(dev, block_label(i).c_str());
      store.enter_block(i);
      Tensor y = block_forward(c, i, x);
      store.exit_block(i);
      // A dropped segment keeps only its input: the checkpoint its blocks are re-run from.
      if (training && (!seg.recompute || i == seg.begin) && !saved_->has(i, "x"))
        saved_->save(i, "x", std::move(x));
      x = std::move(y);  // eval: the block's input is freed here
      saved_->flush();
    }
  }

  c.segment = n;
  c.save = training;
  Tensor losses = [&] {
    ScopedRange range(dev, "head");
    return head_forward(c, std::move(x), targets);  // (N) F32
  }();
  // The autocast region ends: weight casts that no saved tensor holds are freed.
  store.clear_casts();
  saved_->flush();
  saved_->set_offload(false);
  if (training) {
    last_ = options;
  } else {
    saved_.reset();
    last_.reset();
  }
  return losses;
}

void BlockModel::backward(Device& dev, ParamStore& store, float dloss) {
  if (!saved_ || !last_)
    throw std::logic_error(name() + ": backward() without a training forward()");
  const int n = num_blocks();
  SavedTensors& saved = *saved_;
  LayerCtx c{dev, store, saved, last_->act_dtype, last_->amp};
  set_parallel(c, *last_);
  c.selective = plan_.selective;
  c.attention = last_->attention;
  c.hf_eager = last_->llama_layers == LlamaLayers::hf_eager;
  c.save = true;
  c.backward = true;

  // The segments backward fetches, in order (a recomputed segment: only its input). Fetching
  // one also prefetches the next, so offloaded activations come back one step ahead and their
  // copies overlap the backward in between (a no-op without offload).
  std::vector<int> order{n};
  for (auto seg = plan_.segments.rbegin(); seg != plan_.segments.rend(); ++seg)
    for (int i = seg->end - 1; i >= seg->begin; --i)
      if (!seg->recompute || i == seg->begin) order.push_back(i);
  order.push_back(-1);
  std::size_t cursor = 0;
  auto fetch = [&](int segment) {
    saved.fetch(segment);
    auto it = std::find(order.begin() + static_cast<std::ptrdiff_t>(cursor), order.end(), segment);
    if (it == order.end()) return;  // a recomputed block: its tensors are on the device
    cursor = static_cast<std::size_t>(it - order.begin());
    // Not from the head: its backward holds the logits' gradient, the step's largest buffer,
    // and a block resident on top of it would raise the peak to save one block's copy time.
    if (segment != n && cursor + 1 < order.size()) saved.prefetch(order[cursor + 1]);
  };

  c.segment = n;
  fetch(n);
  Tensor dres = [&] {
    ScopedRange range(dev, "head");
    return head_backward(c, dloss);  // d(last block output)
  }();
  saved.release(n);

  for (auto seg = plan_.segments.rbegin(); seg != plan_.segments.rend(); ++seg) {
    if (seg->recompute) {
      // Re-run the segment from its saved input, keeping everything this time.
      ScopedRange recompute(dev, "recompute");
      fetch(seg->begin);
      Tensor x = saved.take(seg->begin, "x");
      c.recompute = true;
      for (int i = seg->begin; i < seg->end; ++i) {
        c.segment = i;
        ScopedRange range(dev, block_label(i).c_str());
        store.enter_block(i);
        Tensor y = block_forward(c, i, x);
        store.exit_block(i);
        if (!saved.has(i, "x")) saved.save(i, "x", std::move(x));
        x = std::move(y);
      }
      x.reset();            // the segment's output: its consumer kept its own copy
      store.clear_casts();  // the recompute's autocast region ends (its saved casts stay)
      c.recompute = false;
    }
    for (int i = seg->end - 1; i >= seg->begin; --i) {
      c.segment = i;
      ScopedRange range(dev, block_label(i).c_str());
      bool fetched = false;
      c.fetch_saved = [&fetch, &fetched, i] {
        if (!fetched) fetch(i);
        fetched = true;
      };
      if (!block_backward_fetches()) c.fetch_saved();
      store.enter_block(i);
      store.block_backward_begins(i);
      block_backward(c, i, dres);
      c.fetch_saved();  // (a block that took nothing: its copies land before its release)
      c.fetch_saved = nullptr;
      store.clear_casts();  // casts a selective recompute made for itself
      store.block_grads_done(i);
      store.exit_block(i);
      saved.release(i);
    }
  }

  c.segment = -1;
  fetch(-1);
  {
    ScopedRange range(dev, "stem");
    stem_backward(c, dres);
  }
  dres.reset();
  saved_.reset();
  last_.reset();
}

FlopCount BlockModel::flops(std::int64_t batch, const RunOptions& options) const {
  const int n = num_blocks();
  FlopCount f;
  f.forward = stem_flops(batch) + head_flops(batch);
  for (int i = 0; i < n; ++i) f.forward += block_flops(batch, i);
  if (!options.training) return f;
  f.backward = 2.0 * f.forward;
  const CheckpointPlan plan = CheckpointPlan::make(options.checkpoint, n);
  for (int i = 0; i < n; ++i) {
    if (plan.recomputed(i)) f.recompute += block_flops(batch, i);
    if (plan.selective) f.recompute += selective_recompute_flops(batch, i, options);
    f.recompute += attention_recompute_flops(batch, i, options);
  }
  return f;
}

}  // namespace memtrade
