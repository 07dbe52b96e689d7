#include "models/train/trainer.h"

#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace memtrade {
namespace {

// Sets the allocator's phase label and a profiler range for one phase of the step.
class Phase {
 public:
  Phase(Device& dev, const char* name) : range_(dev, name) { dev.memory().set_phase(name); }

 private:
  ScopedRange range_;
};

TrainConfig validated(const TrainConfig& cfg) {
  if (cfg.tensor_parallel < 1 || cfg.data_parallel < 1)
    throw std::invalid_argument(fmt::format("tensor_parallel {} and data_parallel {} must be >= 1",
                                            cfg.tensor_parallel, cfg.data_parallel));
  if (cfg.expert_parallel < 1 || cfg.data_parallel % cfg.expert_parallel != 0)
    throw std::invalid_argument(fmt::format("expert_parallel {} must divide data_parallel {}",
                                            cfg.expert_parallel, cfg.data_parallel));
  if (cfg.expert_parallel > 1 && cfg.sharding == Sharding::torch_zero1)
    throw std::invalid_argument("expert parallelism with sharding torch-zero1 is not modelled");
  if (cfg.batch_size < 1)
    throw std::invalid_argument(fmt::format("batch_size must be >= 1, got {}", cfg.batch_size));
  if (cfg.accumulation < 1)
    throw std::invalid_argument(fmt::format("accumulation must be >= 1, got {}", cfg.accumulation));
  if (cfg.lr < 0.0f) throw std::invalid_argument(fmt::format("lr must be >= 0, got {}", cfg.lr));
  return cfg;
}

}  // namespace

struct Trainer::MicroBatch {
  Tensor input;    // input_shape(B), input_dtype: tokens (I32) or features
  Tensor targets;  // target_shape(B), I32
};

Trainer::Trainer(Device& dev, Model& model, const TrainConfig& cfg)
    : dev_(dev),
      model_(model),
      cfg_(validated(cfg)),
      run_(RunOptions::from(cfg)),
      hyper_(default_hyper(cfg.optimizer, model.family(), cfg.lr)),
      parallel_(make_parallel_state(
          dev, static_cast<int>(cfg_.tensor_parallel), static_cast<int>(cfg_.data_parallel),
          cfg_.sequence_parallel == SequenceParallel::on, static_cast<int>(cfg_.expert_parallel))),
      store_(dev, model.params(), ParamPlacement::from(cfg), cfg.seed, parallel_.dp_comm(),
             &parallel_.edp_comm()),
      scaler_(uses_loss_scaling(cfg.precision), cfg.loss_scale_init,
              cfg.loss_scale_growth_interval) {
  run_.parallel = &parallel_;
  if (store_.placement().host_update() && cfg_.mode == Mode::train)
    host_ops_ = dev_.make_host_ops();
  dev_.ops().set_tf32(cfg.precision == Precision::tf32);
  dev_.memory().set_phase("");
}

Trainer::~Trainer() = default;

Trainer::MicroBatch Trainer::stage(std::int64_t first) {
  Phase phase(dev_, "io");
  const std::int64_t B = cfg_.batch_size;
  const Shape in_shape = model_.input_shape(B);
  const Shape tgt_shape = model_.target_shape(B);
  const DType in_dtype = model_.input_dtype(run_.act_dtype);
  const auto in_numel = static_cast<std::size_t>(shape_numel(in_shape));
  const auto tgt_numel = static_cast<std::size_t>(shape_numel(tgt_shape));
  const std::size_t in_bytes = in_numel * dtype_size(in_dtype);
  const std::size_t tgt_bytes = tgt_numel * sizeof(std::int32_t);
  // A device without data (the memory model's) gets the buffers and copies, not the samples.
  const bool data = dev_.holds_data();
  std::vector<float> inputs;
  std::vector<std::int32_t> targets;
  if (data) {
    model_.make_batch(cfg_.seed, first, B, inputs, targets);
    if (inputs.size() != in_numel || targets.size() != tgt_numel)
      throw std::logic_error(fmt::format("{}: make_batch gave {} inputs / {} targets for {} / {}",
                                         model_.name(), inputs.size(), targets.size(),
                                         shape_str(in_shape), shape_str(tgt_shape)));
    last_inputs_.insert(last_inputs_.end(), inputs.begin(), inputs.end());
    last_targets_.insert(last_targets_.end(), targets.begin(), targets.end());
  }

  // Host staging: pinned buffers (category io on the pinned allocator) or plain pageable
  // vectors. Pinned ones stay alive until the step ends, when every copy has completed.
  std::vector<unsigned char> pageable_in, pageable_tgt;
  void* host_in = nullptr;
  void* host_tgt = nullptr;
  if (cfg_.input == InputMemory::pinned) {
    host_staging_.push_back(dev_.empty_pinned(in_shape, in_dtype, Category::io));
    host_in = host_staging_.back().data();
    host_staging_.push_back(dev_.empty_pinned(tgt_shape, DType::I32, Category::io));
    host_tgt = host_staging_.back().data();
  } else if (data) {
    pageable_in.resize(in_bytes);
    pageable_tgt.resize(tgt_bytes);
    host_in = pageable_in.data();
    host_tgt = pageable_tgt.data();
  }
  if (data) {
    for (std::size_t j = 0; j < in_numel; ++j) store_from_float(host_in, in_dtype, j, inputs[j]);
    std::memcpy(host_tgt, targets.data(), tgt_bytes);
  }

  MicroBatch mb{dev_.empty(in_shape, in_dtype, Category::io),
                dev_.empty(tgt_shape, DType::I32, Category::io)};
  // The fresh device blocks may reuse bytes that queued compute work still touches: the copy
  // stream waits for the compute stream, and compute waits for the copies.
  auto compute_ready = dev_.make_event();
  compute_ready->record(StreamKind::compute);
  dev_.wait(StreamKind::copy, *compute_ready);
  dev_.copy(mb.input.data(), host_in, in_bytes, CopyKind::host_to_device, StreamKind::copy);
  dev_.copy(mb.targets.data(), host_tgt, tgt_bytes, CopyKind::host_to_device, StreamKind::copy);
  auto copied = dev_.make_event();
  copied->record(StreamKind::copy);
  dev_.wait(StreamKind::compute, *copied);
  // Pageable sources die with this function: make sure the copy has read them.
  if (cfg_.input == InputMemory::pageable) copied->synchronize();
  return mb;
}

StepResult Trainer::step() {
  const bool train = cfg_.mode == Mode::train;
  const std::int64_t B = cfg_.batch_size;
  const std::int64_t k = cfg_.accumulation;
  const std::int64_t rows = model_.rows_per_sample() * B * k * cfg_.data_parallel;  // global
  Comm& dp = parallel_.dp_comm();
  const bool several = dp.size() > 1;
  const float scale = scaler_.scale();
  last_scale_ = scale;
  last_inputs_.clear();
  last_targets_.clear();
  captured_grads_.clear();
  Ops& ops = dev_.ops();

  if (train) {
    if (!optimizer_)
      optimizer_ = std::make_unique<Optimizer>(hyper_, store_.size(), cfg_.optimizer_impl);
    Phase phase(dev_, "optimizer");  // zero_grad belongs to the optimizer
    ScopedRange range(dev_, "zero_grad");
    store_.begin_step(cfg_.zero_grad, ops);
  }

  Tensor loss_rows;  // (B · rows_per_sample) F32: per-row losses summed over micro-batches
  const float dloss = scale / static_cast<float>(rows);
  for (std::int64_t m = 0; m < k; ++m) {
    MicroBatch mb = stage(first_sample(cfg_, steps_, parallel_.dp_rank, m));
    {
      Phase phase(dev_, "forward");
      if (store_.ddp()) store_.broadcast_buffers();
      store_.gather_root();
      Tensor losses = model_.forward(dev_, store_, mb.input, mb.targets, run_);
      store_.release_root();
      if (!loss_rows.defined())
        loss_rows = std::move(losses);
      else
        ops.add_inplace(loss_rows, losses);
    }
    if (train) {
      Phase phase(dev_, "backward");
      const bool last = m + 1 == k;
      store_.set_sync(last);
      store_.gather_root(/*for_backward=*/true);
      model_.backward(dev_, store_, dloss);
      store_.release_root();
      if (last) {
        store_.reduce_grads(ops);
        reduce_sequence_parallel_grads();
      }
    }
  }
  double loss_sum = 0;
  {
    Phase phase(dev_, train ? "backward" : "forward");
    loss_sum = ops.sum_to_host(loss_rows);  // the step's one read-back (synchronises)
    loss_rows.reset();
    if (several) loss_sum = dp.all_reduce_sum(loss_sum);  // the tp ranks hold the same
  }
  host_staging_.clear();  // every input copy completed before the loss was read

  bool skipped = false;
  if (train) {
    Phase phase(dev_, "optimizer");
    optimizer_phase(skipped);
  }
  ++steps_;
  if (cfg_.empty_cache == EmptyCache::per_step) dev_.memory().empty_cache();
  dev_.memory().set_phase("");
  return StepResult{loss_sum / static_cast<double>(rows), skipped, scale};
}

void Trainer::reduce_sequence_parallel_grads() {
  if (!parallel_.sequence_parallel) return;
  for (int i = 0; i < store_.size(); ++i)
    if (store_.spec(i).sequence_parallel_grad && store_.has_grad(i)) {
      // The dp-reduced gradient: whole, or this rank's part of it where zero2/3 freed the rest.
      const bool parted = parallel_.dp > 1 &&
                          (cfg_.sharding == Sharding::zero2 || cfg_.sharding == Sharding::zero3);
      Tensor& g = parted ? store_.update_grad(i) : store_.device_grad(i);
      if (g.numel() > 0) parallel_.tp_comm().all_reduce(g);
    }
}

void Trainer::optimizer_phase(bool& skipped) {
  ScopedRange range(dev_, "optimizer_step");
  Ops& ops = dev_.ops();
  const float inv_scale = scaler_.enabled() ? scaler_.inv_scale() : 1.0f;
  std::vector<Tensor*> grads = store_.grads();
  bool found_inf = false;
  if (scaler_.enabled() && !grads.empty())
    found_inf = ops.unscale_and_check(grads, 1.0f);  // check only: ×1 leaves the grads as they are
  if (scaler_.enabled() && parallel_.world_size() > 1)  // each rank saw its part: all skip, or none
    found_inf = parallel_.world->all_reduce_max(found_inf ? 1.0 : 0.0) > 0.0;

  if (capture_grads_) {
    captured_grads_.assign(static_cast<std::size_t>(store_.size()), {});
    for (int i = 0; i < store_.size(); ++i) {
      if (!store_.spec(i).trainable || !store_.has_grad(i)) continue;
      auto& v = captured_grads_[static_cast<std::size_t>(i)];
      v = store_.grad_f32(i);
      if (inv_scale != 1.0f)
        for (float& x : v) x *= inv_scale;
    }
  }

  if (!found_inf) {
    if (store_.placement().host_update()) {
      // ZeRO-Offload: grads to pinned host buffers, update on the host, weights back.
      std::vector<int> todo;
      for (int i = 0; i < store_.size(); ++i)
        if (store_.spec(i).trainable && store_.has_grad(i)) todo.push_back(i);
      std::vector<Tensor*> host_grads;
      for (int i : todo) host_grads.push_back(&store_.fetch_grad(i));
      dev_.synchronize(StreamKind::compute);
      for (std::size_t j = 0; j < todo.size(); ++j) {
        optimizer_->update(*host_ops_, todo[j], store_.update_target(todo[j]), *host_grads[j],
                           inv_scale);
        store_.publish(todo[j], ops, host_ops_.get());
      }
    } else {
      // Every parameter in one fused update (the unscale folded in), then the 16-bit copies.
      std::vector<Optimizer::Item> items;
      for (int i = 0; i < store_.size(); ++i)
        if (store_.spec(i).trainable && store_.has_grad(i)) {
          Tensor& target = store_.update_target(i);
          // A rank that owns none of a small parameter (more ranks than elements), or not this
          // whole parameter (torch-zero1), skips it.
          if (target.numel() > 0 && store_.owns(i))
            items.push_back({i, &target, &store_.update_grad(i)});
        }
      optimizer_->update_many(ops, items, inv_scale);
      // Every rank publishes every parameter (zero1/2 all-gather each one, owned or not).
      for (int i = 0; i < store_.size(); ++i)
        if (store_.spec(i).trainable && store_.has_grad(i)) store_.publish(i, ops, nullptr);
    }
    store_.finish_publish();
    optimizer_->finish_step();
  }
  skipped = found_inf;
  scaler_.update(found_inf);
  if (cfg_.zero_grad == ZeroGrad::set_to_none) store_.release_grads();
}

std::vector<float> Trainer::param_f32(int i) {
  return store_.param_f32(i);
}

void Trainer::set_param_f32(int i, const std::vector<float>& values) {
  if (i < 0 || i >= store_.size())
    throw std::out_of_range(fmt::format("parameter index {} out of range", i));
  Tensor& target = store_.update_target(i);
  const std::int64_t numel = shape_numel(store_.spec(i).shape);
  if (static_cast<std::int64_t>(values.size()) != numel)
    throw std::invalid_argument(
        fmt::format("{}: {} values for {} elements", store_.spec(i).name, values.size(), numel));
  // Under sharding the target is this rank's part.
  const std::int64_t off = target.numel() == numel ? 0 : store_.part_offset(i);
  const std::vector<float> mine(values.begin() + off, values.begin() + off + target.numel());
  if (target.dtype() != DType::F32)
    throw std::invalid_argument(fmt::format(
        "{}: the weights are 16-bit without an fp32 master ({}): not set from fp32 values",
        store_.spec(i).name, precision_name(cfg_.precision)));
  dev_.copy(target.data(), mine.data(), target.nbytes(),
            store_.on_host(target) ? CopyKind::host_to_host : CopyKind::host_to_device);
  dev_.synchronize(StreamKind::compute);
  store_.publish(i, dev_.ops(), host_ops_.get());
  store_.finish_publish();
  dev_.synchronize(StreamKind::compute);
}

std::vector<float> Trainer::grad_f32(int i) {
  if (i < 0 || i >= store_.size())
    throw std::out_of_range(fmt::format("parameter index {} out of range", i));
  if (static_cast<std::size_t>(i) < captured_grads_.size())
    return captured_grads_[static_cast<std::size_t>(i)];
  if (!store_.has_grad(i)) return {};
  std::vector<float> v = store_.grad_f32(i);
  if (last_scale_ != 1.0f)
    for (float& x : v) x /= last_scale_;
  return v;
}

}  // namespace memtrade
